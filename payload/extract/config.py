"""Flags of `extract` and their validation; no torch here (see the package docstring).

Every check that can fail before the model is loaded happens here or in `run`, so a
typo costs a second, not the minutes a 1T-parameter load takes.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from payload.errors import UsageError
from payload.extract.formats.base import FINAL_STATES, FORMATS, NEEDS_FINAL_STATE
from payload.extract.rendering import from_flag
from payload.records import ALL, Shard, parse_shard

DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                 "float": "float32"}
# --feature-dtype: what the files hold (default: the model's --dtype). fp8 is hs-connectors'
# FP8 layout (feature_dtype.py), which only speculators reads.
FP8 = "float8_e4m3fn"
FEATURE_DTYPES = {**DTYPES, FP8: 1}
FEATURE_DTYPE_CHOICES = ("bf16", "fp16", "fp32", "fp8")
FEATURE_DTYPE_ALIASES = {**DTYPE_ALIASES, "fp8": FP8, "float8": FP8, "e4m3": FP8}
# The format each storage option is for (no other trainer reads it), and the fix to name.
FP8_FORMAT = "speculators"
COMPRESSIONS = ("none", "gzip")
GZIP_FORMAT = "specforge"
DEFAULT_MAX_LENGTH = 8192
DEFAULT_BATCH_TOKENS = 16384
BACKENDS = ("hf", "vllm")
# Engine arguments the vllm backend derives itself: set through their own flags, so the
# features stay what the flags say (a quantized KV cache would quantize the features).
DERIVED_ENGINE_ARGS = {
    "model": "--model", "dtype": "--dtype", "max_model_len": "--max-length",
    "tensor_parallel_size": "--tensor-parallel-size", "kv_cache_dtype": "--dtype",
    "max_num_batched_tokens": "--batch-tokens", "speculative_config": "--layers",
    "kv_transfer_config": "(the backend's own)", "kv_cache_memory_bytes": "--kv-cache-memory",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "trust_remote_code": "--trust-remote-code",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the `extract` flags (docs/extractor.md, "All flags": the contract, plus the
    policy flags documented there)."""
    parser.add_argument("--input", required=True, type=Path,
                        help="generator OUT.jsonl (or prompt+answer JSONL / ShareGPT)")
    parser.add_argument("--model", required=True, type=Path,
                        help="local model directory (never downloaded)")
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--layers", default=None,
                        help="three HF output_hidden_states indices, e.g. 2,16,29 "
                             "(default: 2,N//2,N-3; valid: 1..N, N is the post-norm state)")
    parser.add_argument("--max-length", type=int, default=DEFAULT_MAX_LENGTH,
                        help=f"longest sample in tokens (default {DEFAULT_MAX_LENGTH}); "
                             "see --overlong")
    parser.add_argument("--overlong", choices=["truncate", "skip"], default="truncate",
                        help="samples longer than --max-length: keep the first N tokens "
                             "(default; a causal model's features for them are unchanged) "
                             "or skip the sample; both are counted")
    parser.add_argument("--batch-tokens", type=int, default=DEFAULT_BATCH_TOKENS,
                        help="padded tokens per forward pass (rows x longest row); "
                             f"a longer sample runs alone (default {DEFAULT_BATCH_TOKENS})")
    parser.add_argument("--dtype", default="bfloat16",
                        help="the model's dtype: bfloat16 (default), float16, float32; also "
                             "the features' unless --feature-dtype says otherwise")
    parser.add_argument("--feature-dtype", default=None, metavar="{bf16,fp16,fp32,fp8}",
                        help="the dtype the feature files hold (default: --dtype's). fp8: "
                             "float8_e4m3fn with one float32 scale per token, hs-connectors' "
                             "layout (~1/2 the bytes of bf16), --format speculators only "
                             "(train with --hidden-states-backend fp8)")
    parser.add_argument("--compress", choices=COMPRESSIONS, default="none",
                        help="gzip: write SpecForge's .ckpt.gz (--format specforge only; "
                             "~1/5 smaller on bf16 features, written 20-30x slower: see "
                             "docs/training.md)")
    parser.add_argument("--shard", default=None, help="I/N: this host's 0-based share of ids")
    parser.add_argument("--reasoning", choices=["include", "drop"], default="include",
                        help="the record's reasoning: put it in the supervised assistant turn "
                             "per the chat template's thinking convention (default), or drop it")
    parser.add_argument("--completion-format", default=None, metavar="FORM",
                        help="what the target emits after its generation prompt, with "
                             "{reasoning} and {content} where they go, e.g. "
                             "'<think>{reasoning}</think>{content}<|im_end|>' (\\n is a "
                             "newline); default: found from the chat template")
    parser.add_argument("--turns", choices=["last", "all"], default="last",
                        help="supervise the final assistant turn (default) or every "
                             "assistant turn the target wrote (records of generate "
                             "--turns all, raw prompt+answer records)")
    parser.add_argument("--on-mismatch", choices=["keep", "skip"], default="keep",
                        help="a re-tokenized answer whose token count differs from the "
                             "server's usage.completion_tokens: keep it (default) or skip "
                             "it; both are counted (retokenized_mismatch) and listed")
    parser.add_argument("--force", action="store_true",
                        help="run even when the disk preflight says the features will not fit")
    parser.add_argument("--preflight-only", action="store_true",
                        help="tokenize, print the disk estimate as JSON on stdout and exit "
                             "(0 fits, 2 does not); loads no model, needs no GPU")
    parser.add_argument("--reserve", default="1G",
                        help="free space to leave on the output disk, e.g. 50G (default 1G)")
    parser.add_argument("--status-file", type=Path, default=None,
                        help="also keep a job status JSON here (state, done, failed, total, "
                             "tokens_per_s, ...), summed over this launch's torchrun ranks")
    parser.add_argument("--format", choices=FORMATS, default="native",
                        help="the layout written: native (default; safetensors per sample), "
                             "specforge (SpecForge 0.2 offline .ckpt files, "
                             "data.hidden_states_path=OUT) or speculators (speculators 0.9 "
                             "datasets dir + hidden_states/hs_{row}.safetensors)")
    parser.add_argument("--final-state", choices=FINAL_STATES, default=None,
                        help="the last-layer state stored beside the aux layers: after the "
                             "final norm (postnorm) or before it (prenorm); default: what the "
                             "format's trainer needs (speculators: prenorm, else postnorm)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="auto: CUDA when available, else the CPU")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow the model directory's own modeling code (e.g. Kimi)")
    parser.add_argument("--progress", choices=["auto", "rich", "plain", "none"], default="auto",
                        help="auto: rich bars on a TTY, plain lines otherwise")
    add_engine_arguments(parser)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The backend that runs the target: HF transformers in this process, or a vLLM
    engine (tensor parallel, for targets no single GPU holds; docs/extractor.md)."""
    parser.add_argument("--backend", choices=BACKENDS, default="hf",
                        help="hf: HF transformers in this process (default); vllm: a vLLM "
                             "engine (needs vllm installed; one process per host)")
    parser.add_argument("--tensor-parallel-size", type=int, default=None,
                        help="vllm: GPUs (CPU: core groups) the engine shards the model over "
                             "(default: every GPU this process sees; 1 on a CPU)")
    parser.add_argument("--kv-cache-memory", default=None,
                        help="vllm: bytes for the engine's KV cache, e.g. 20G (default: "
                             "vLLM's own sizing from --gpu-memory-utilization; CPU: 1G)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="vllm: share of each GPU the engine may use (vLLM default 0.9)")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="vllm: any other vLLM engine argument, VALUE as JSON (or a "
                             "string), e.g. --engine-arg max_num_seqs=64; repeatable")


@dataclass(frozen=True)
class ExtractConfig:
    input: Path
    model: Path
    output_dir: Path
    layers: tuple[int, ...] | None  # None: the default, resolved once N is known
    max_length: int
    overlong: str
    batch_tokens: int
    dtype: str  # the model's
    shard: Shard
    reasoning: str
    completion_format: str | None  # --completion-format as given (None: from the template)
    turns: str  # "last" | "all"
    on_mismatch: str  # "keep" | "skip"
    format: str
    final_state: str  # "prenorm" | "postnorm": resolved, never None
    force: bool
    preflight_only: bool
    reserve_bytes: int
    status_file: Path | None
    device: str
    trust_remote_code: bool
    progress: str
    backend: str = "hf"
    tensor_parallel_size: int | None = None  # None: every visible GPU (vllm), 1 on a CPU
    kv_cache_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    engine_args: tuple[tuple[str, object], ...] = ()
    feature_dtype: str = ""  # what the files hold; "" (only when built by hand): --dtype's
    compress: str | None = None  # "gzip" (specforge's .ckpt.gz) or None

    def __post_init__(self) -> None:
        if not self.feature_dtype:
            object.__setattr__(self, "feature_dtype", self.dtype)

    @property
    def dtype_bytes(self) -> int:
        return FEATURE_DTYPES[self.feature_dtype]


def parse_size(text: str, flag: str = "--reserve") -> int:
    """`10G`, `512M`, `1.5T` or plain bytes; binary units (what `df -h` shows)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    if t and t[-1] in "KMGT":
        mult = 1024 ** ("KMGT".index(t[-1]) + 1)
        t = t[:-1]
    try:
        value = float(t)
    except ValueError:
        raise UsageError(f"{flag}: not a size: {text!r} (e.g. 50G)") from None
    if value < 0:
        raise UsageError(f"{flag} must not be negative")
    return int(value * mult)


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        layers = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise UsageError(f"--layers must be three integers like 2,16,29, got {text!r}") from None
    if len(layers) != 3:
        raise UsageError(f"--layers needs exactly three indices (EAGLE-3 low/mid/high), "
                         f"got {len(layers)}: {text!r}")
    return layers


def resolve_layers(layers: tuple[int, ...] | None, num_layers: int) -> tuple[int, ...]:
    """Default `[2, N//2, N-3]`; indices are HF `output_hidden_states` positions.

    Valid range is 1..N: index k < N is the output of decoder layer k-1, index N is the
    final post-norm state (HF replaces the last layer's raw output by the normed one).
    Index 0 (the embeddings) is refused: it is a pure table lookup that the EAGLE-3 draft
    already owns, so it would waste a third of the feature bytes on no information.
    """
    n = num_layers
    if layers is None:
        layers = (2, n // 2, n - 3)
        if n < 7:  # 6 gives 2,3,3: not three layers
            raise UsageError(f"the model has {n} decoder layers; the default layers "
                             f"2,N//2,N-3 need at least 7; pass --layers")
    if len(set(layers)) != 3:
        raise UsageError(f"--layers must be three distinct indices, got {layers}")
    for k in layers:
        if k == 0:
            raise UsageError("--layers: index 0 is the embedding output, not a decoder layer "
                             f"(no information the draft lacks); use 1..{n}")
        if not 1 <= k <= n:
            raise UsageError(f"--layers: index {k} is out of range; this model has {n} "
                             f"decoder layers, valid indices are 1..{n}")
    return tuple(sorted(layers))


def parse_engine_args(items: list[str]) -> tuple[tuple[str, object], ...]:
    """`--engine-arg KEY=VALUE` pairs; VALUE is JSON when it parses, else a string."""
    import json

    out: list[tuple[str, object]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UsageError(f"--engine-arg wants KEY=VALUE, got {item!r} "
                             "(e.g. --engine-arg max_num_seqs=64)")
        if key in DERIVED_ENGINE_ARGS:
            raise UsageError(f"--engine-arg {key}: the vllm backend sets it from "
                             f"{DERIVED_ENGINE_ARGS[key]}; use that instead")
        try:
            value: object = json.loads(raw)
        except ValueError:
            value = raw
        out.append((key, value))
    return tuple(out)


def engine_settings(args: argparse.Namespace) -> dict[str, object]:
    """The engine flags of `args`, checked; {} keys for the hf backend's defaults."""
    backend = getattr(args, "backend", "hf")
    tp = getattr(args, "tensor_parallel_size", None)
    if tp is not None and tp < 1:
        raise UsageError("--tensor-parallel-size must be at least 1 (the extractor role's "
                         "`tp` defaults to the host's `gpus`: on a CPU host set tp: 1)")
    kv = getattr(args, "kv_cache_memory", None)
    util = getattr(args, "gpu_memory_utilization", None)
    extra = getattr(args, "engine_arg", []) or []
    if backend != "vllm" and (tp is not None or kv or util is not None or extra):
        raise UsageError("--tensor-parallel-size, --kv-cache-memory, --gpu-memory-utilization "
                         "and --engine-arg are vLLM engine settings: add --backend vllm")
    if util is not None and not 0 < util <= 1:
        raise UsageError("--gpu-memory-utilization must be in (0, 1], e.g. 0.9")
    return {"backend": backend, "tensor_parallel_size": tp,
            "kv_cache_bytes": parse_size(kv, "--kv-cache-memory") if kv else None,
            "gpu_memory_utilization": util, "engine_args": parse_engine_args(extra)}


def storage_settings(args: argparse.Namespace, dtype: str) -> tuple[str, str | None]:
    """(--feature-dtype resolved, --compress or None), checked against --format: each
    smaller form is the one its trainer reads, so anything else is refused (exit 2)."""
    fmt = args.format
    raw = getattr(args, "feature_dtype", None)
    feature = dtype if raw is None else FEATURE_DTYPE_ALIASES.get(raw.lower(), raw.lower())
    if feature not in FEATURE_DTYPES:
        raise UsageError(f"--feature-dtype must be one of {', '.join(FEATURE_DTYPE_CHOICES)}, "
                         f"got {raw!r}")
    if feature == FP8 and fmt != FP8_FORMAT:
        raise UsageError(f"--feature-dtype fp8 writes hs-connectors' FP8 layout, which only "
                         f"speculators reads (--hidden-states-backend fp8): add --format "
                         f"{FP8_FORMAT}, or keep --format {fmt} with --feature-dtype bf16")
    compress = getattr(args, "compress", "none") or "none"
    if compress not in COMPRESSIONS:
        raise UsageError(f"--compress must be one of {', '.join(COMPRESSIONS)}, got {compress!r}")
    if compress == "gzip" and fmt != GZIP_FORMAT:
        hint = (" (for half the disk there, use --feature-dtype fp8)" if fmt == FP8_FORMAT
                else "")
        raise UsageError(f"--compress gzip writes SpecForge's .ckpt.gz files: add --format "
                         f"{GZIP_FORMAT}, or drop --compress for --format {fmt}{hint}")
    return feature, None if compress == "none" else compress


def from_args(args: argparse.Namespace) -> ExtractConfig:
    dtype = DTYPE_ALIASES.get(args.dtype, args.dtype)
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    feature_dtype, compress = storage_settings(args, dtype)
    if args.max_length is not None and args.max_length < 2:
        raise UsageError("--max-length must be at least 2")
    if args.batch_tokens < 1:
        raise UsageError("--batch-tokens must be positive")
    try:
        shard = parse_shard(args.shard) if args.shard else ALL
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.completion_format is not None:
        if args.reasoning != "include":
            raise UsageError("--completion-format says how reasoning is emitted; it needs "
                             "--reasoning include (the default)")
        from_flag(args.completion_format)  # a FormError (a UsageError) says what is wrong
    fmt = args.format
    final_state = args.final_state or NEEDS_FINAL_STATE[fmt]
    if not args.input.is_file():
        raise UsageError(f"--input {args.input}: no such file")
    if not (args.model / "config.json").is_file():
        raise UsageError(f"--model {args.model}: not a local model directory (no config.json); "
                         "extract never downloads: copy the model there first")
    return ExtractConfig(
        input=args.input, model=args.model, output_dir=args.output_dir,
        layers=parse_layers(args.layers), max_length=args.max_length, overlong=args.overlong,
        batch_tokens=args.batch_tokens, dtype=dtype, shard=shard, reasoning=args.reasoning,
        completion_format=args.completion_format, turns=args.turns,
        on_mismatch=args.on_mismatch, format=fmt, final_state=final_state, force=args.force,
        preflight_only=args.preflight_only, reserve_bytes=parse_size(args.reserve),
        status_file=args.status_file, device=args.device,
        trust_remote_code=args.trust_remote_code, progress=args.progress,
        feature_dtype=feature_dtype, compress=compress,
        **engine_settings(args),  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class Rank:
    """torchrun's data-parallel position, from its environment (1 process: rank 0 of 1)."""

    rank: int
    world: int
    local_rank: int
    local_world: int

    @classmethod
    def from_env(cls) -> Rank:
        def get(name: str, default: int) -> int:
            raw = os.environ.get(name)
            if raw is None or raw == "":
                return default
            try:
                return int(raw)
            except ValueError:
                raise UsageError(f"${name}={raw!r} is not an integer") from None

        world = get("WORLD_SIZE", 1)
        rank = get("RANK", 0)
        local_world = get("LOCAL_WORLD_SIZE", world)
        local_rank = get("LOCAL_RANK", rank)
        if world < 1 or not 0 <= rank < world or not 0 <= local_rank < local_world:
            raise UsageError(f"inconsistent torchrun environment: RANK={rank} "
                             f"WORLD_SIZE={world} LOCAL_RANK={local_rank}")
        return cls(rank, world, local_rank, local_world)

    @property
    def tag(self) -> str:
        return f"rank{self.rank}-of-{self.world}"
