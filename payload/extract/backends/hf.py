"""The HF transformers backend: load the target, capture exactly the features EAGLE-3 trains on.

Index convention (HF `output_hidden_states`): entry 0 is the embeddings, entry k (1..N-1)
is the output of decoder layer k-1, entry N is the final post-norm state. Forward hooks
on `layers[k-1]` (and on the final norm for k = N) capture exactly those entries, and
only those: keeping all N+1 states of a 61-layer model would cost 20x the memory.

The final state is captured on the final norm itself: a forward hook gives its output
(post-norm, what SpecForge's target head expects), a forward PRE-hook its input (the
last decoder layer's raw output, what speculators expects: its trainer applies the
target's norm itself). Storing the wrong one of the two is silent: the features load,
and the draft trains on a teacher whose logits are off (see docs/training.md).
The lm_head is never run (the decoder is called directly): its logits would be
[B, T, vocab], gigabytes per batch that nobody needs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from payload.errors import UsageError
from payload.extract.backends import ModelInfo
from payload.extract.batching import Batch, collate, plan_batches
from payload.extract.config import ExtractConfig, Rank
from payload.extract.formats.base import POSTNORM, PRENORM
from payload.extract.tensors import torch_dtype

NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_norm")


def weights_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.iterdir()
               if p.suffix in (".safetensors", ".bin") and p.is_file())


def pick_devices(cfg: ExtractConfig, rank: Rank) -> tuple[str, list[int]]:
    """('cpu', []) or ('cuda', this rank's GPUs): the node's GPUs split evenly among ranks."""
    cuda = torch.cuda.is_available()
    if cfg.device == "cpu" or (cfg.device == "auto" and not cuda):
        return "cpu", []
    if not cuda:
        raise UsageError("--device cuda, but torch sees no CUDA device "
                         f"(torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    count = torch.cuda.device_count()
    per = count // rank.local_world
    if per < 1:
        raise UsageError(f"{rank.local_world} ranks on this node but only {count} GPUs: "
                         "run torchrun with --nproc-per-node at most the GPU count")
    return "cuda", list(range(rank.local_rank * per, (rank.local_rank + 1) * per))


def _decoder_parts(model: nn.Module, num_layers: int) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    """(decoder, its layer list, its final norm), found by shape rather than by class name,
    so Llama, Qwen, DeepSeek/Kimi (also nested under a multimodal wrapper) all work."""
    candidates = [(name, mod) for name, mod in model.named_modules()
                  if isinstance(mod, nn.ModuleList) and len(mod) == num_layers
                  and name.split(".")[-1] in ("layers", "h", "blocks")]
    if not candidates:
        raise UsageError(f"cannot find the {num_layers} decoder layers in "
                         f"{type(model).__name__}")
    name, layers = min(candidates, key=lambda c: len(c[0]))
    parent_name = name.rpartition(".")[0]
    decoder = model.get_submodule(parent_name) if parent_name else model
    for n in NORM_NAMES:
        norm = getattr(decoder, n, None)
        if isinstance(norm, nn.Module):
            return decoder, layers, norm
    raise UsageError(f"cannot find the final norm of {type(decoder).__name__} "
                     f"(looked for {', '.join(NORM_NAMES)})")


class FeatureModel:
    """The model with hooks on the three aux layers and the final norm.

    `final_state` picks the norm's input or output as the stored final state.
    `raw_last_layer` says what aux index N means: HF's tuple entry (post-norm, the
    native format) or the last decoder layer's raw output (the trainers' own capture
    convention: vLLM's layer id N, SpecForge's id N-1).
    """

    def __init__(self, cfg: ExtractConfig, info: ModelInfo, rank: Rank, *,
                 raw_last_layer: bool = False) -> None:
        from transformers import AutoModelForCausalLM

        self.info = info
        self.batch_tokens = cfg.batch_tokens
        kind, gpus = pick_devices(cfg, rank)
        load: dict[str, Any] = {"dtype": torch_dtype(cfg.dtype), "local_files_only": True,
                                "trust_remote_code": cfg.trust_remote_code}
        if kind == "cuda":
            torch.cuda.set_device(gpus[0])
            one_gpu = torch.cuda.get_device_properties(gpus[0]).total_memory
            # Weights above ~85% of one GPU leave too little for activations: spread the
            # model over this rank's GPUs (the whole node with a single process).
            if len(gpus) > 1 and weights_bytes(cfg.model) > 0.85 * one_gpu:
                try:
                    import accelerate  # noqa: F401
                except ImportError:
                    raise UsageError("the model needs several GPUs (device_map='auto'), which "
                                     "needs `pip install accelerate`") from None
                load["device_map"] = "auto"
                load["max_memory"] = {g: int(0.9 * one_gpu) for g in gpus}
            else:
                load["device_map"] = {"": gpus[0]}
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # tqdm bars would flood a nohup log; we report load time
        self.model = AutoModelForCausalLM.from_pretrained(cfg.model, **load).eval()
        self.decoder, layers, norm = _decoder_parts(self.model, info.num_layers)
        self.input_device = self.model.get_input_embeddings().weight.device
        self.output_device = torch.device(f"cuda:{gpus[0]}") if gpus else torch.device("cpu")
        self._captured: dict[str, torch.Tensor] = {}
        self._handles: list[Any] = []
        # What each captured state is, by the key it is kept under: "L{k}" the output of
        # decoder layer k-1, "prenorm"/"postnorm" the final norm's input/output.
        last = PRENORM if raw_last_layer else POSTNORM
        self._aux_keys = [last if k == info.num_layers else f"L{k}" for k in info.layers]
        self._final_key = cfg.final_state
        needed = set(self._aux_keys) | {self._final_key}
        for k in info.layers:
            if k < info.num_layers:
                self._handles.append(layers[k - 1].register_forward_hook(self._hook(f"L{k}")))
        if POSTNORM in needed:
            self._handles.append(norm.register_forward_hook(self._hook(POSTNORM)))
        if PRENORM in needed:
            self._handles.append(norm.register_forward_pre_hook(self._pre_hook(PRENORM)))
        self.device_summary = (f"cuda:{','.join(map(str, gpus))}"
                               + (" (device_map=auto)" if load.get("device_map") == "auto"
                                  else "") if gpus else "cpu")

    def _hook(self, key: str) -> Any:
        def hook(_mod: nn.Module, _inp: Any, out: Any) -> None:
            t = out[0] if isinstance(out, (tuple, list)) else out
            self._captured[key] = t
        return hook

    def _pre_hook(self, key: str) -> Any:
        def hook(_mod: nn.Module, inp: Any) -> None:
            self._captured[key] = inp[0] if isinstance(inp, (tuple, list)) else inp
        return hook

    @torch.inference_mode()
    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [B, T, 3H], final [B, T, H]) on this rank's first device, model dtype."""
        dev = self.input_device
        self._captured.clear()
        self.decoder(input_ids=batch.input_ids.to(dev, non_blocking=True),
                     attention_mask=batch.attention_mask.to(dev, non_blocking=True),
                     position_ids=batch.position_ids.to(dev, non_blocking=True),
                     use_cache=False)
        out = self.output_device
        aux = torch.cat([self._captured[k].to(out) for k in self._aux_keys], dim=-1)
        final = self._captured[self._final_key].to(out)
        self._captured.clear()
        return aux, final

    def features(self, samples: list[Any], pad: int, stopped: Callable[[], bool],
                 ) -> Iterator[tuple[Batch, torch.Tensor, torch.Tensor]]:
        """Padded batches of at most --batch-tokens (longest first), each run through
        `forward`; no new batch once `stopped()` (the batch in hand is the drain)."""
        for idx in plan_batches([s.num_tokens for s in samples], self.batch_tokens):
            if stopped():
                return
            batch = collate([samples[i] for i in idx], pad)
            aux, final = self.forward(batch)
            yield batch, aux, final

    def close(self) -> None:
        for h in self._handles:
            h.remove()
