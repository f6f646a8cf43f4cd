"""The extract run, as stages sharing one run context (`Run`):

    start      flags, torchrun rank, model config, format, meta.json guard, stats
    select     read the input, keep this rank's ids, skip those already done, tokenize
    preflight  the disk estimate (`--preflight-only` reports it and stops here)
    extract    load the model, forward in token-budget batches, write each sample
    settle     the format lists what was written (manifest merge, speculators' rows)
    conclude   final state, summary line, exit code

Everything that can refuse (flags, layers, meta mismatch, a missing package, disk) does
so before the model loads. Errors are payload.errors exceptions: a UsageError (exit 2)
before any work, Stopped (exit 3) when SIGTERM (`fab stop`, or torchrun forwarding it)
drained the batch in hand, OutOfMemory (exit 1). Per-sample problems never stop the
run: bad lines, boundary mismatches and NaN/Inf are counted and reported
(errors.<tag>.jsonl), and the exit code says whether any sample failed (1) or all were
written, already done, or dropped by a stated policy (0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from payload.errors import ExitCode, PayloadError, Stopped, UsageError
from payload.extract import formats
from payload.extract.backends import ModelInfo, read_info
from payload.extract.config import ExtractConfig, Rank, from_args
from payload.extract.formats import Format
from payload.extract.meta import build_meta, check_meta
from payload.extract.metrics import NAME as METRICS
from payload.extract.metrics import Metrics
from payload.extract.status import ErrorLog, MismatchLog, Stats, StopFlag, job_status
from payload.extract.writing import BatchWriter, finite_rows
from payload.records import BadRecord, iter_lines, shard_of

CHUNK = 512  # records rendered and tokenized together
STATS_EVERY_S = 5.0
_STATE_ON_ERROR = {ExitCode.USAGE: "refused", ExitCode.STOPPED: "stopped",
                   ExitCode.FAILED: "aborted"}


class OutOfMemory(PayloadError):
    """The device ran out of memory; what was written stays, a rerun resumes (exit 1)."""


@dataclass
class Run:
    """What every stage reads and updates."""

    cfg: ExtractConfig
    rank: Rank
    info: ModelInfo
    fmt: Format
    tag: str  # shard{I}-of-{N}.rank{r}-of-{W}: names this rank's files
    run_id: str  # shared by the ranks of one torchrun launch
    stats: Stats
    errors: ErrorLog
    renderer: Any  # tokens.Renderer (its module needs transformers' tokenizer)
    mismatches: MismatchLog
    metrics: Metrics | None = None  # the job's metrics.jsonl, beside the status file
    settled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def out(self) -> Path:
        return self.cfg.output_dir

    @property
    def dry(self) -> bool:
        # --preflight-only (run by `fab verify`) writes nothing: a meta.json from verify's
        # flags would make the real launch's (other) flags look like a settings change.
        return self.cfg.preflight_only

    @property
    def label(self) -> str:
        return f"extract {self.tag}"

    def save_stats(self, state: str) -> None:
        if self.dry:
            return
        from payload.extract.writer import write_json_atomic

        s = self.stats
        s.state, s.updated, s.last_error = state, time.time(), self.errors.last
        write_json_atomic(self.out / f"stats.{self.tag}.json", asdict(s))
        if self.cfg.status_file is not None:
            status = job_status(self.out, self.run_id, self.rank.world)
            write_json_atomic(self.cfg.status_file, status)
            if self.metrics is not None and state != "starting":
                self.metrics.tick(status, final=state not in ("running", "starting"))


def main(args: argparse.Namespace) -> int:
    try:
        run = start(args)
    except PayloadError as exc:
        print(f"extract: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    try:
        try:
            code = work(run)
        finally:
            settle(run)  # also after a failure: what was written gets listed
        return conclude(run) if code is None else code
    except PayloadError as exc:
        print(f"extract: {exc}", file=sys.stderr, flush=True)
        run.save_stats(_STATE_ON_ERROR.get(exc.exit_code, "aborted"))
        return int(exc.exit_code)
    except BaseException:
        run.save_stats("aborted")
        raise


def work(run: Run) -> int | None:
    """select → preflight → extract; the exit code of --preflight-only, else None."""
    if run.cfg.backend == "vllm":
        # before the minutes of tokenizing; also what `fab verify`'s preflight checks
        from payload.extract.backends.vllm import check_one_process, check_version

        check_one_process(run.rank)
        check_version()
    renderer = load_renderer(run)
    samples = select(run, renderer)
    if run.dry:
        return report_preflight(run, samples)
    check_disk(run, samples)
    extract(run, samples, renderer.tok)
    return None


# -- start ---------------------------------------------------------------------------
def start(args: argparse.Namespace) -> Run:
    cfg = from_args(args)
    rank = Rank.from_env()
    info = read_info(cfg)
    fmt = formats.make(cfg.format, cfg.output_dir, info.hidden, cfg.feature_dtype, cfg.compress)
    renderer = make_renderer(cfg)
    if renderer.form is None and cfg.reasoning == "include":
        raise UsageError(renderer.undetermined)  # a thinking template, form unknown
    if not cfg.preflight_only:
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
    check_meta(cfg.output_dir, build_meta(cfg, info, fmt, renderer.describe()),
               write=not cfg.preflight_only)
    warn_for_trainer(cfg)
    tag = f"shard{cfg.shard.index}-of-{cfg.shard.count}.{rank.tag}"
    # torchrun gives every rank of one launch the same run id; a lone process is its own run
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or f"pid{os.getpid()}"
    stats = Stats(shard=str(cfg.shard), rank=rank.rank, world=rank.world, run_id=run_id,
                  format=cfg.format, final_state=cfg.final_state, started=time.time(),
                  reasoning_mode=renderer.reasoning_mode, rendering=renderer.describe(),
                  turns=cfg.turns)
    errors = ErrorLog(cfg.output_dir / f"errors.{tag}.jsonl", record=not cfg.preflight_only)
    mismatches = MismatchLog(cfg.output_dir / f"mismatches.{tag}.jsonl",
                             record=not cfg.preflight_only)
    run = Run(cfg, rank, info, fmt, tag, run_id, stats, errors, renderer, mismatches)
    if cfg.status_file is not None and not cfg.preflight_only:
        run.metrics = Metrics(cfg.status_file.parent / METRICS, STATS_EVERY_S, stats.started,
                              run_id)
    run.save_stats("starting")
    return run


# -- select --------------------------------------------------------------------------
def warn_for_trainer(cfg: ExtractConfig) -> None:
    """Settings the format's trainer will not train well on (or at all): a warning."""
    needs = formats.NEEDS_FINAL_STATE[cfg.format]
    if cfg.final_state != needs:
        print(f"extract: WARNING: --final-state {cfg.final_state}, but the {cfg.format} "
              f"format's trainer computes its teacher from the {needs} state: its logits "
              "will not be the target's (see docs/training.md)", file=sys.stderr, flush=True)
    if cfg.format == "specforge" and cfg.feature_dtype != "bfloat16":
        print(f"extract: WARNING: --format specforge with {cfg.feature_dtype} features: "
              "SpecForge casts its target head to bfloat16 and fails on features of another "
              "dtype; extract with --dtype bfloat16 (or --feature-dtype bf16; see "
              "docs/training.md)", file=sys.stderr, flush=True)


def make_renderer(cfg: ExtractConfig) -> Any:
    """The tokenizer and how its template renders what the target emits (no model)."""
    from transformers import AutoTokenizer

    from payload.extract.tokens import Renderer

    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model, local_files_only=True,
                                                  trust_remote_code=cfg.trust_remote_code)
        return Renderer(tokenizer, cfg.reasoning, eos_ids(tokenizer, cfg.model),
                        cfg.completion_format)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--model {cfg.model}: tokenizer: {exc}") from None


def load_renderer(run: Run) -> Any:
    return run.renderer


def eos_ids(tokenizer: Any, model_dir: Path) -> set[int]:
    """End-of-turn ids: the tokenizer's eos plus generation_config's (e.g. <|im_end|>)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError):
            eos = None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(int(i) for i in eos if isinstance(i, int))
    return ids


def owns(cfg: ExtractConfig, rank: Rank, key: str) -> bool:
    """Host share (`--shard I/N`, same hash as `generate`), then this rank's share of it.

    The rank split hashes a salted key, so the host-level partition is the generator's
    and any mix of ranks per host still partitions ids exactly once.
    """
    if not cfg.shard.owns(key):
        return False
    return rank.world == 1 or shard_of(f"{key}\x1frank", rank.world) == rank.rank


def select(run: Run, renderer: Any) -> list[Any]:
    """This rank's samples still to write, tokenized; the rest is counted in stats."""
    from payload.extract.tokens import parse_record

    cfg, stats = run.cfg, run.stats
    t0 = time.monotonic()
    run.fmt.open(run.tag, dry=run.dry)
    seen: set[str] = set()
    samples: list[Any] = []
    chunk: list[Any] = []
    vocab = run.info.vocab_size
    for line_no, line in iter_lines(cfg.input):
        stats.lines += 1
        try:
            conv = parse_record(line, line_no, cfg.turns)
            ids = [i for t in (conv.token_ids, *(e.token_ids for e in conv.earlier)) if t
                   for i in t]
            if vocab and ids and max(ids) >= vocab:
                raise BadRecord(f"'response_token_ids' holds id {max(ids)}, the model's "
                                f"vocabulary has {vocab}")
        except BadRecord as exc:
            stats.bad_lines += 1
            print(f"extract: {cfg.input}:{line_no}: skipped: {exc}", file=sys.stderr)
            continue
        if conv.has_reasoning and renderer.undetermined:
            raise UsageError(renderer.undetermined)  # before any model loads
        if not owns(cfg, run.rank, conv.key):
            continue
        if conv.key in seen:
            stats.duplicates += 1
            continue
        seen.add(conv.key)
        stats.owned += 1
        if run.fmt.done(conv):
            stats.already_done += 1
            continue
        chunk.append(conv)
        if len(chunk) >= CHUNK:
            samples += tokenize(run, renderer, chunk)
            chunk = []
    if chunk:
        samples += tokenize(run, renderer, chunk)
    stats.tokenize_s = time.monotonic() - t0
    if stats.lines == 0:
        raise UsageError(f"--input {cfg.input} has no records")
    if not run.dry:
        stats.temp_files_removed = run.fmt.clean_temp_files([s.key for s in samples])
    return samples


def tokenize(run: Run, renderer: Any, convs: list[Any]) -> list[Any]:
    """Render and tokenize a chunk; apply the length and supervision policies."""
    from payload.extract.tokens import BoundaryError, truncate

    cfg, stats = run.cfg, run.stats
    kept = []
    for conv, res in zip(convs, renderer.encode_many(convs), strict=True):
        if isinstance(res, BoundaryError):
            stats.failed_boundary += 1
            run.errors.add(conv.id, conv.line_no, "boundary", str(res))
            continue
        if res.mismatches:  # re-tokenized text the target did not sample as counted
            skip = cfg.on_mismatch == "skip"
            for turn, supervised, completion in res.mismatches:
                stats.retokenized_mismatch += 1
                run.mismatches.add(conv.id, conv.line_no, turn, supervised, completion,
                                   "skipped" if skip else "kept")
            if skip:
                stats.skipped_mismatch += 1
                continue
        if res.num_tokens > cfg.max_length:
            if cfg.overlong == "skip":
                stats.skipped_overlong += 1
                continue
            res = truncate(res, cfg.max_length)
            stats.truncated += 1
        if res.num_supervised == 0:
            stats.dropped_unsupervised += 1
            continue
        if res.from_ids:
            stats.supervised_from_token_ids += res.num_supervised
        else:
            stats.supervised_retokenized += res.num_supervised
        kept.append(res)
    return kept


# -- preflight -----------------------------------------------------------------------
def report_preflight(run: Run, samples: list[Any]) -> int:
    """--preflight-only: the estimate as one JSON line on stdout; 0 fits, 2 does not."""
    from payload.extract import preflight

    est = preflight.estimate(samples, run.fmt, run.info.vocab_size)
    free = preflight.free_bytes(preflight.existing(run.out))
    fits = est.bytes * run.rank.local_world + run.cfg.reserve_bytes <= free
    print(json.dumps({"format": run.cfg.format, "feature_dtype": run.cfg.feature_dtype,
                      "compress": run.cfg.compress, "samples": est.samples, "tokens": est.tokens,
                      "estimate_bytes": est.bytes, "bytes_per_token": est.per_token,
                      "already_done": run.stats.already_done, "free_bytes": free,
                      "reserve_bytes": run.cfg.reserve_bytes, "fits": fits}), flush=True)
    return ExitCode.OK if fits else ExitCode.USAGE


def check_disk(run: Run, samples: list[Any]) -> None:
    """Raises DiskTooSmall (exit 2) unless the features fit, or --force."""
    from payload.extract import preflight

    est = preflight.estimate(samples, run.fmt, run.info.vocab_size)
    run.stats.estimate_bytes = est.bytes
    print(preflight.check(est, run.out, reserve=run.cfg.reserve_bytes,
                          sharers=run.rank.local_world, force=run.cfg.force),
          file=sys.stderr, flush=True)


# -- extract -------------------------------------------------------------------------
def extract(run: Run, samples: list[Any], tokenizer: Any) -> None:
    """Forward and write every sample; raises Stopped after a SIGTERM drained."""
    run.save_stats("running")
    stop = StopFlag()
    with stop.installed():
        if samples:
            try:
                forward_and_write(run, samples, tokenizer, stop)
            except Exception as exc:
                if type(exc).__name__ != "OutOfMemoryError":
                    raise
                raise OutOfMemory(
                    f"out of GPU memory ({exc}); lower --batch-tokens (now "
                    f"{run.cfg.batch_tokens}) or --max-length; the run is resumable") from None
    if stop.set:
        raise Stopped(f"stopped by SIGTERM after {run.stats.written} samples; rerun the "
                      "same command to resume")


def load_backend(run: Run, samples: list[Any]) -> Any:
    """The model backend of --backend, loaded (HF in-process, or a vLLM engine)."""
    raw = run.fmt.raw_last_layer
    if run.cfg.backend == "vllm":
        from payload.extract.backends.vllm import VllmFeatureModel

        return VllmFeatureModel(run.cfg, run.info, run.rank, raw_last_layer=raw, out=run.out,
                                tag=run.tag, longest=max(s.num_tokens for s in samples))
    from payload.extract.backends.hf import FeatureModel

    return FeatureModel(run.cfg, run.info, run.rank, raw_last_layer=raw)


def forward_and_write(run: Run, samples: list[Any], tokenizer: Any, stop: StopFlag) -> None:
    from payload.extract.feature_dtype import store
    from payload.extract.progress import Progress

    stats = run.stats
    t0 = time.monotonic()
    if stop.set:  # before the load: nothing to load for
        raise Stopped("stopped by SIGTERM before the model loaded; rerun the same command "
                      "to resume")
    stop.loading = True  # a SIGTERM from here raises Stopped in the load (StopFlag)
    try:
        fm = load_backend(run, samples)
    except Exception:
        if stop.set:  # raised by the signal, or what the loader made of it (an engine
            # whose start was cut reports a start failure): a stop either way
            raise Stopped("stopped by SIGTERM while the model loaded; nothing was written "
                          "by this run: rerun the same command to resume") from None
        raise
    finally:
        stop.loading = False
    stats.device = fm.device_summary
    stats.load_s = time.monotonic() - t0
    print(f"[{run.label}] model loaded on {fm.device_summary} in {stats.load_s:.1f}s; "
          f"{len(samples)} samples; layers {list(run.info.layers)}; format {run.cfg.format} "
          f"(final state {run.cfg.final_state}); reasoning {stats.reasoning_mode}",
          file=sys.stderr, flush=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    progress = Progress(len(samples), sum(s.num_tokens for s in samples), run.cfg.progress,
                        run.label)
    t1, c1 = time.monotonic(), time.process_time()
    last_save = time.monotonic()
    try:
        with BatchWriter(run, progress) as writer:
            for batch, aux, final in fm.features(samples, pad, lambda: stop.set):
                stored = store(aux, final, run.cfg.feature_dtype)  # on the device
                ok = finite_rows(run, progress, batch, stored)
                writer.submit(batch.samples, stored, ok)
                if time.monotonic() - last_save > STATS_EVERY_S:
                    last_save = time.monotonic()
                    with run.lock:
                        update_rates(stats, time.monotonic() - t1)
                        run.save_stats("running")
        # Every sample is written here: the teardown below is the model's (for vllm, the
        # engine's processes joining: ~5-10 s on a busy CPU box, whatever the run's size),
        # counted apart as close_s, as load_s counts the start.
        stats.extract_s = time.monotonic() - t1
        stats.extract_cpu_s = time.process_time() - c1
    finally:
        progress.close()
        t2 = time.monotonic()
        fm.close()
        stats.close_s = time.monotonic() - t2
        if not stats.extract_s:  # failed or stopped mid-way: the phase ran until now
            stats.extract_s = t2 - t1
            stats.extract_cpu_s = time.process_time() - c1
    update_rates(stats, stats.extract_s)


def update_rates(stats: Stats, elapsed: float) -> None:
    el = max(elapsed, 1e-9)
    stats.samples_per_s = stats.written / el
    stats.tokens_per_s = stats.tokens_written / el


# -- settle, conclude ----------------------------------------------------------------
def settle(run: Run) -> None:
    """The format lists what was written (once, also after a failure or a stop)."""
    if run.settled:
        return
    run.settled = True
    line = run.fmt.close()
    if line:
        print(f"[{run.label}] {line}", file=sys.stderr, flush=True)


def conclude(run: Run) -> int:
    stats = run.stats
    run.save_stats("finished" if stats.failed == 0 else "finished_with_failures")
    print(json.dumps(stats.summary(run.tag)), file=sys.stderr, flush=True)
    return ExitCode.FAILED if stats.failed else ExitCode.OK
