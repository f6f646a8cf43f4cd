"""Model backends: what runs the target and hands back the features of a batch.

A backend is given the run's config, the model's shape (`ModelInfo`, read here from
config.json alone, before anything loads) and this rank's place, and returns for each
padded batch `(aux [B, T, 3H], final [B, T, H])`: the three layers' states in HF's
`output_hidden_states` numbering and the final state before or after the final norm
(`--final-state`). Everything else (tokens, masks, formats, resume) is the pipeline's,
the same for every backend. `hf.py` is HF transformers (hooks on the decoder layers).

Importing this package is torch-free: `--preflight-only` reads `ModelInfo` without
torch; a backend module imports torch itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from payload.errors import UsageError
from payload.extract.config import ExtractConfig, resolve_layers


@dataclass(frozen=True)
class ModelInfo:
    num_layers: int
    hidden: int
    layers: tuple[int, ...]
    vocab_size: int = 0  # the target's vocabulary (speculators maps its draft vocab onto it)


def read_info(cfg: ExtractConfig) -> ModelInfo:
    """Layer count and width from config.json alone, so bad --layers fail before the load."""
    from transformers import AutoConfig

    try:
        conf = AutoConfig.from_pretrained(cfg.model, local_files_only=True,
                                          trust_remote_code=cfg.trust_remote_code)
    except Exception as exc:
        raise UsageError(f"--model {cfg.model}: cannot read its config ({exc}); pass "
                         "--trust-remote-code if it ships its own modeling code") from None
    text = conf.get_text_config() if hasattr(conf, "get_text_config") else conf
    n = int(text.num_hidden_layers)
    h = int(text.hidden_size)
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    return ModelInfo(n, h, resolve_layers(cfg.layers, n), vocab)
