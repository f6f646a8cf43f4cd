"""The vLLM backend: the target runs in a vLLM engine (tensor parallel), which hands back
each sample's hidden states through its `extract_hidden_states` speculative method.

What vLLM does (0.32; speculators 0.9 drives it the same way): with
`speculative_config={"method": "extract_hidden_states", ...,
"eagle_aux_hidden_state_layer_ids": ids}` the engine caches the states of the layers
`ids` beside its KV cache, and a hidden-states KV connector writes, for each finished
request, `<storage>/<request id>.safetensors` (`hidden_states` [T, L, H] in the model
dtype, `token_ids` [T]) guarded by `<file>.lock` while it writes. A request is the
sample's token ids with `max_tokens=1`: one prefill, which is exactly the forward pass
the HF backend runs.

How its numbering maps onto ours (measured against an HF forward, fp32, within ~1e-6):
vLLM id k < N is HF's `output_hidden_states[k]`; id N is the last decoder layer's output
BEFORE the final norm. So the engine is asked for the sorted, distinct ids
`layers ∪ {N}` (duplicates crash it), the pre-norm final state is slot N, and the
post-norm state (the native format's index N, and `--final-state postnorm`) is the
target's own RMSNorm applied here, computed as HF computes it. The states share the KV
cache's dtype, so `kv_cache_dtype` is always the model's (`auto`): a quantized cache
would quantize the features.

The engine's own files are read, checked (token ids equal to the sample's), turned into
the same (aux, final) the HF backend returns, and deleted with their `.lock` at once;
a rerun empties the rank's storage dir. Its processes are marked and watched (see
reaper.py): they end with the payload, and a rerun ends an earlier run's leftovers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from payload.errors import ExitCode, PayloadError, Stopped, UsageError
from payload.extract.backends import ModelInfo
from payload.extract.backends.reaper import ENV, Watchdog, end_leftovers, end_marked, owner_of
from payload.extract.batching import Batch, collate
from payload.extract.config import ExtractConfig, Rank
from payload.extract.formats.base import POSTNORM, PRENORM
from payload.extract.tensors import torch_dtype

# The range whose internals this backend (and vllm_connector.py) was written against.
VLLM_MIN, VLLM_BELOW = (0, 32), (0, 33)
CPU_CONNECTOR = "CpuHiddenStatesConnector"
CPU_CONNECTOR_MODULE = "payload.extract.backends.vllm_connector"
STOCK_CONNECTOR = "ExampleHiddenStatesConnector"
ENGINE_DIR = ".engine"  # <output dir>/.engine/<tag>/: the connector's files, transient
CPU_KV_CACHE_DEFAULT = 1 << 30
DRAIN_TIMEOUT_S = 120
WINDOW_BATCHES = 64  # requests in flight: up to this many engine steps of tokens (only ids: cheap)


class EngineError(PayloadError):
    """The engine refused its settings or died starting up: one line, the flag to change."""

    exit_code = ExitCode.USAGE


class EngineDied(PayloadError):
    """The engine died mid-run: what was written stays, a rerun resumes (exit 1)."""

    exit_code = ExitCode.FAILED


def check_version() -> str:
    """vllm importable and in the range this backend relies on; its version."""
    try:
        import vllm
    except Exception as exc:  # ImportError, or a broken install (CUDA extras on a CPU box)
        raise UsageError(f"--backend vllm: cannot import vllm ({type(exc).__name__}: {exc}); "
                         f"install vllm>={'.'.join(map(str, VLLM_MIN))},<"
                         f"{'.'.join(map(str, VLLM_BELOW))} in this python "
                         "(docs/extractor.md, The vLLM backend)") from None
    version = str(getattr(vllm, "__version__", "0"))
    try:
        got = tuple(int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        got = (0, 0)
    if not VLLM_MIN <= got < VLLM_BELOW:
        raise UsageError(f"--backend vllm: vllm {version} is installed; this extractor relies "
                         f"on vLLM internals of {'.'.join(map(str, VLLM_MIN))}.x (its "
                         "hidden-states connector): install vllm=="
                         f"{'.'.join(map(str, VLLM_MIN))}.*")
    return version


def check_one_process(rank: Rank) -> None:
    if rank.world > 1:
        raise UsageError("--backend vllm runs one process per host (the engine spreads the "
                         "model over --tensor-parallel-size devices): launch it without "
                         "torchrun or with --nproc-per-node 1 (role var `ranks: 1`)")


def _model_config(model: Path) -> dict[str, Any]:
    conf = json.loads((model / "config.json").read_text(encoding="utf-8"))
    text = conf.get("text_config") or {}
    return {**conf, **text} if isinstance(text, dict) else conf


def max_model_len(cfg: ExtractConfig, longest: int) -> int:
    """Prompt + the one generated token, capped by the model's positions (vLLM refuses a
    longer max_model_len with a validation error)."""
    positions = _model_config(cfg.model).get("max_position_embeddings")
    want = min(cfg.max_length, max(longest, 1)) + 1
    if isinstance(positions, int) and positions > 0:
        if longest + 1 > positions:
            raise UsageError(f"a sample has {longest} tokens but the model has "
                             f"max_position_embeddings {positions} (vLLM needs the sample plus "
                             f"one token): pass --max-length {positions - 1} (or lower)")
        want = min(want, positions)
    return want


def _norm_weight(model: Path) -> tuple[str, str]:
    """(tensor name, file) of the decoder's final norm weight in the checkpoint."""
    index = model / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    else:
        from safetensors import safe_open

        weight_map = {}
        for f in sorted(model.glob("*.safetensors")):
            with safe_open(str(f), "pt") as fh:
                weight_map.update({k: f.name for k in fh.keys()})  # noqa: SIM118
    skip = ("layers.", "vision", "visual", "mm_projector", "multi_modal", "mtp")
    names = [k for k in weight_map if k.endswith("norm.weight")
             and not any(s in k for s in skip)]
    if not names:
        raise UsageError(f"--model {model}: cannot find the final norm's weight in the "
                         "checkpoint; use --backend hf or --final-state prenorm with a "
                         "trainer format")
    name = min(names, key=len)
    if name.replace("weight", "bias") in weight_map:
        raise UsageError(f"--model {model}: its final norm ({name}) has a bias (a LayerNorm); "
                         "the vllm backend applies RMSNorm only: use --backend hf")
    return name, weight_map[name]


class FinalNorm:
    """The target's final RMSNorm, exactly as HF computes it (fp32 statistics, cast back
    to the input dtype, times the weight in the model dtype)."""

    def __init__(self, cfg: ExtractConfig) -> None:
        from safetensors import safe_open

        conf = _model_config(cfg.model)
        if str(conf.get("model_type", "")).startswith("gemma"):
            raise UsageError("Gemma's norm scales by 1 + weight: the vllm backend does not "
                             "apply it; use --backend hf")
        self.eps = float(conf.get("rms_norm_eps", conf.get("layer_norm_epsilon", 1e-6)))
        name, file = _norm_weight(cfg.model)
        with safe_open(str(cfg.model / file), "pt") as fh:
            self.weight = fh.get_tensor(name).to(torch_dtype(cfg.dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _cpu_bind(tp: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for tp ranks: this process's cores in tp equal groups."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // tp)
    groups = [cores[i * per:(i + 1) * per] or cores[-1:] for i in range(tp)]
    return "|".join(",".join(map(str, g)) for g in groups)


def hint(message: str) -> str:
    """The flag to change for an engine error, from its message."""
    m = message.lower()
    if "max_model_len" in m or "max model len" in m or "max_position" in m:
        return "--max-length"
    if "kv cache" in m or "memory" in m or "blocks" in m:
        return "--kv-cache-memory or --gpu-memory-utilization (or a lower --max-length)"
    if "tensor_parallel" in m or "divisible" in m or "world_size" in m or "tensor parallel" in m:
        return "--tensor-parallel-size"
    if "trust_remote_code" in m:
        return "--trust-remote-code"
    return "--engine-arg (or see the engine's log above)"


def tensor_parallel(cfg: ExtractConfig, platform_is_cpu: bool) -> int:
    """--tensor-parallel-size, or every GPU this process sees (1 on a CPU)."""
    if cfg.tensor_parallel_size is not None:
        return cfg.tensor_parallel_size
    return 1 if platform_is_cpu else max(1, torch.cuda.device_count())


def engine_kwargs(cfg: ExtractConfig, ids: list[int], max_len: int, storage: Path,
                  platform_is_cpu: bool) -> dict[str, Any]:
    """The engine's arguments, derived from the flags (docs/extractor.md): `ids` the vLLM
    layer ids to capture, `storage` where the connector writes its files."""
    tp = tensor_parallel(cfg, platform_is_cpu)
    connector = ({"kv_connector": CPU_CONNECTOR, "kv_connector_module_path": CPU_CONNECTOR_MODULE}
                 if platform_is_cpu else {"kv_connector": STOCK_CONNECTOR})
    kw: dict[str, Any] = {
        "model": str(cfg.model), "tokenizer": str(cfg.model), "dtype": cfg.dtype,
        "kv_cache_dtype": "auto", "max_model_len": max_len,
        "tensor_parallel_size": tp,
        "max_num_batched_tokens": max(cfg.batch_tokens, 1),
        "trust_remote_code": cfg.trust_remote_code, "disable_log_stats": True,
        # A SIGTERM that reaches the engine too (torchrun signals the whole process
        # group) lets it finish the requests in flight instead of aborting them.
        "shutdown_timeout": DRAIN_TIMEOUT_S,
        "speculative_config": {
            "method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}}},
        "kv_transfer_config": {**connector, "kv_role": "kv_producer",
                               "kv_connector_extra_config": {"shared_storage_path": str(storage)}},
    }
    if platform_is_cpu:
        kw["enforce_eager"] = True  # CPU compile caches are never reused: 10-40 s a start
    if cfg.kv_cache_bytes is not None:
        kw["kv_cache_memory_bytes"] = cfg.kv_cache_bytes
    elif platform_is_cpu:
        kw["kv_cache_memory_bytes"] = CPU_KV_CACHE_DEFAULT
    if cfg.gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    kw.update(dict(cfg.engine_args))
    return kw


def engine_ids(info: ModelInfo) -> list[int]:
    """vLLM's layer ids for our layers: the same numbers (k < N is HF's tuple entry k), plus
    N (the pre-norm last layer, for the final state), sorted and distinct (a duplicate
    crashes the engine)."""
    return sorted(set(info.layers) | {info.num_layers})


class VllmFeatureModel:
    """Same contract as the HF backend's FeatureModel: `features()` yields, per sample
    (a batch of one: vLLM batches internally), `(batch, aux [1, T, 3H], final [1, T, H])`."""

    def __init__(self, cfg: ExtractConfig, info: ModelInfo, rank: Rank, *,
                 raw_last_layer: bool, out: Path, tag: str, longest: int) -> None:
        self.cfg, self.info = cfg, info
        self.raw_last_layer = raw_last_layer
        check_one_process(rank)
        # The engine computes; this process only reads, norms and writes. Its own torch
        # threads would contend with the engine's OpenMP threads for the cores (on a CPU
        # engine every barrier then waits for a descheduled thread).
        torch.set_num_threads(1)
        self.version = check_version()
        self.ids = engine_ids(info)
        self.norm = FinalNorm(cfg) if self._needs_postnorm() else None
        self.max_model_len = max_model_len(cfg, longest)
        self.storage = out / ENGINE_DIR / tag
        owner = owner_of(out, tag)
        ended = end_leftovers(owner)
        if ended:
            print(f"extract: ended {len(ended)} engine processes left by an earlier run of "
                  f"this output dir (pids {', '.join(map(str, ended))})", file=sys.stderr,
                  flush=True)
        removed = self._empty_storage()
        if removed:
            print(f"extract: removed {removed} engine files left by an earlier run "
                  f"({self.storage})", file=sys.stderr, flush=True)
        self.mark = f"{owner}:{os.getpid()}"
        os.environ[ENV] = self.mark  # inherited by EngineCore and its workers
        self.watchdog = Watchdog(self.mark)
        self.llm: Any = None
        try:
            self.llm = self._start()
        except BaseException:
            self.close()
            raise
        self.device_summary = (f"vllm {self.version} ({self.platform}, tensor parallel "
                               f"{tensor_parallel(cfg, self.platform == 'cpu')})")
        self._n = 0

    def _needs_postnorm(self) -> bool:
        n = self.info.num_layers
        return self.cfg.final_state == POSTNORM or (n in self.info.layers
                                                     and not self.raw_last_layer)

    def _empty_storage(self) -> int:
        if not self.storage.is_dir():
            self.storage.mkdir(parents=True, exist_ok=True)
            return 0
        count = 0
        for p in self.storage.iterdir():
            count += 1
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
        return count

    def _start(self) -> Any:
        # A single-host engine never needs a routable address for its own sockets.
        os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        from vllm.platforms import current_platform

        cpu = bool(current_platform.is_cpu())
        self.platform = "cpu" if cpu else str(getattr(current_platform, "device_name", "gpu"))
        if cpu:
            if self.cfg.kv_cache_bytes is not None:
                # the legacy variable would override the engine argument
                os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
            tp = tensor_parallel(self.cfg, True)
            if tp > 1 and not os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_bind(tp)
        from vllm import LLM

        try:
            return LLM(**engine_kwargs(self.cfg, self.ids, self.max_model_len, self.storage, cpu))
        except PayloadError:
            raise  # a stop (SIGTERM during the start) is not the engine's error
        except Exception as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise EngineError(f"the vLLM engine did not start: {type(exc).__name__}: "
                              f"{text[:400]}; change {hint(text)}") from None

    # -- the run ------------------------------------------------------------------------
    def features(self, samples: list[Any], pad: int, stopped: Callable[[], bool],
                 ) -> Iterator[tuple[Batch, torch.Tensor, torch.Tensor]]:
        """Keep the engine fed (longest first, a bounded window of tokens in flight) and
        yield each sample as its request finishes. After `stopped()`, no new request is
        added; those in flight are finished and yielded (the drain)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        engine = self.llm.llm_engine
        params = SamplingParams(max_tokens=1, temperature=0.0)
        todo = deque(sorted(samples, key=lambda s: -s.num_tokens))
        window = WINDOW_BATCHES * max(self.cfg.batch_tokens, self.max_model_len)
        flight: dict[str, Any] = {}
        tokens_in_flight = 0
        try:
            while todo or flight:
                while todo and not stopped() and (not flight or tokens_in_flight
                                                  + todo[0].num_tokens <= window):
                    s = todo.popleft()
                    rid = f"s{self._n}"
                    self._n += 1
                    ids = s.input_ids.tolist()
                    engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), params)
                    flight[rid] = s
                    tokens_in_flight += s.num_tokens
                if stopped() and not flight:
                    return
                if not flight:
                    continue
                for o in engine.step():
                    if not o.finished:
                        continue
                    rid = o.request_id if o.request_id in flight else o.request_id.rsplit(
                        "-", 1)[0]
                    s = flight.pop(rid)
                    tokens_in_flight -= s.num_tokens
                    aux, final = self._read(s, o)
                    yield collate([s], pad), aux[None], final[None]
        except PayloadError:
            raise
        except Exception as exc:
            if stopped():  # the stop signal reached the engine too: a stop, not a failure
                raise Stopped("stopped by SIGTERM; the engine ended with it; the requests in "
                              "flight are redone by a rerun of the same command") from None
            if type(exc).__name__ in ("EngineDeadError", "EngineGenerateError") or \
                    "EngineCore" in str(exc):
                raise EngineDied(f"the vLLM engine died ({type(exc).__name__}: "
                                 f"{' '.join(str(exc).split())[:300]}); what was written stays, "
                                 "rerun the same command to resume") from None
            raise

    def _read(self, sample: Any, output: Any) -> tuple[torch.Tensor, torch.Tensor]:
        from safetensors.torch import load_file

        params = output.kv_transfer_params or {}
        path = params.get("hidden_states_path")
        if not path:
            raise EngineDied(f"the engine returned no hidden-states file for id {sample.key} "
                             f"(kv_transfer_params {params!r})")
        lock = path + ".lock"
        try:
            if os.path.exists(lock):
                with open(lock) as lf:
                    fcntl.flock(lf, fcntl.LOCK_SH)  # the connector's writer holds LOCK_EX
                    data = load_file(path)
            else:
                data = load_file(path)
        finally:
            for p in (path, lock):
                with contextlib.suppress(OSError):
                    os.unlink(p)
        hs, ids = data["hidden_states"], data["token_ids"]
        t = sample.num_tokens
        want = torch.frombuffer(sample.input_ids, dtype=torch.int32).to(torch.long)
        if hs.shape[:2] != (t, len(self.ids)) or not torch.equal(ids.to(torch.long), want):
            raise EngineDied(f"the engine's hidden states for id {sample.key} do not match "
                             f"its tokens (shape {tuple(hs.shape)}, {t} tokens, layers "
                             f"{self.ids})")
        slot = {k: i for i, k in enumerate(self.ids)}
        n = self.info.num_layers
        prenorm = hs[:, slot[n]]
        post = self.norm(prenorm) if self.norm is not None else prenorm  # unused if no norm
        last = prenorm if self.raw_last_layer else post
        aux = torch.cat([last if k == n else hs[:, slot[k]] for k in self.info.layers], dim=-1)
        return aux, prenorm if self.cfg.final_state == PRENORM else post

    def close(self) -> None:
        """Shut the engine down, end whatever of it is left, empty its storage dir."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            del llm
        if hasattr(self, "mark"):
            end_marked(self.mark)
        if hasattr(self, "watchdog"):
            self.watchdog.close()
        os.environ.pop(ENV, None)
        if hasattr(self, "storage"):
            self._empty_storage()
            with contextlib.suppress(OSError):
                self.storage.rmdir()
                self.storage.parent.rmdir()
