"""The extract run: read → own → resume check → tokenize → preflight → forward → write.

Everything that can refuse (flags, layers, meta mismatch, disk) does so before the
model loads. SIGTERM (`fab stop`, or torchrun forwarding it) drains: the batch in hand
is written, the manifest merged, and the run exits 3 (stopped, resumable), as `generate`. Per-sample problems never stop the run: bad lines, boundary mismatches
and NaN/Inf are counted and reported (errors.<tag>.jsonl), and the exit code says
whether any sample failed (1) or all were written, already done, or dropped by a
stated policy (0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from payload.errors import ExitCode, UsageError
from payload.extract.config import ExtractConfig, Rank, from_args
from payload.records import BadRecord, iter_lines, shard_of

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED = (ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE,
                                                  ExitCode.STOPPED)
CHUNK = 512  # records rendered and tokenized together
MAX_PENDING_BATCHES = 3  # batches whose writes may lag behind the GPU (bounds host memory)


class StopFlag:
    """Set by SIGTERM; checked between batches (a signal handler must not do the I/O)."""

    def __init__(self) -> None:
        self.set = False

    @contextlib.contextmanager
    def installed(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signal handlers live in the main thread only
            return

        def handler(_sig: int, _frame: Any) -> None:
            self.set = True
            print("extract: SIGTERM: finishing the current batch, then stopping (resumable)",
                  file=sys.stderr, flush=True)

        old = signal.signal(signal.SIGTERM, handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, old)


@dataclass
class Stats:
    state: str = "starting"
    run_id: str = ""
    shard: str = "0/1"
    rank: int = 0
    world: int = 1
    lines: int = 0
    bad_lines: int = 0
    duplicates: int = 0
    owned: int = 0
    already_done: int = 0
    written: int = 0
    failed_boundary: int = 0
    failed_nonfinite: int = 0
    truncated: int = 0
    skipped_overlong: int = 0
    dropped_unsupervised: int = 0
    tokens_written: int = 0
    supervised_written: int = 0
    bytes_written: int = 0
    estimate_bytes: int = 0
    temp_files_removed: int = 0
    reasoning_mode: str = ""
    device: str = ""
    started: float = 0.0
    updated: float = 0.0
    tokenize_s: float = 0.0
    load_s: float = 0.0
    extract_s: float = 0.0
    extract_cpu_s: float = 0.0  # process CPU time of the extract phase (all threads)
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0
    last_error: str = ""

    @property
    def failed(self) -> int:
        return self.failed_boundary + self.failed_nonfinite


_STATE_ORDER = ("aborted", "stopped", "running", "finished")
_AS_JOB_STATE = {"refused": "aborted", "starting": "running",
                 "finished_with_failures": "finished"}


def job_status(out_dir: Path, run_id: str, world: int) -> dict[str, Any]:
    """The job's status file (the `generate` shape), summed over this launch's ranks.

    Each rank rewrites it from every rank's stats file of the same run id (atomic rename,
    so any reader sees one whole snapshot); no rank waits for another.
    """
    ranks = []
    for p in out_dir.glob("stats.*.json"):
        try:
            s = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # being replaced right now; the next snapshot has it
        if s.get("run_id") == run_id:
            ranks.append(s)
    states = {_AS_JOB_STATE.get(s["state"], s["state"]) for s in ranks}
    if len(ranks) < world:
        states.add("running")  # a rank that has not written yet is still starting
    state = next((st for st in _STATE_ORDER if st in states), "running")

    def total(key: str) -> Any:
        return sum(s.get(key, 0) for s in ranks)

    return {
        "state": state, "done": total("written") + total("already_done"),
        "failed": total("failed_boundary") + total("failed_nonfinite"),
        "total": total("owned") - total("skipped_overlong") - total("dropped_unsupervised"),
        "in_flight": 0, "skipped_overlong": total("skipped_overlong"),
        "dropped_unsupervised": total("dropped_unsupervised"), "truncated": total("truncated"),
        "bad_lines": max((s.get("bad_lines", 0) for s in ranks), default=0),
        "tokens_written": total("tokens_written"), "bytes_written": total("bytes_written"),
        "estimate_bytes": total("estimate_bytes"), "tokens_per_s": total("tokens_per_s"),
        "rate_rps": total("samples_per_s"), "cost": 0.0, "ranks": len(ranks), "world": world,
        "started": min((s["started"] for s in ranks), default=time.time()),
        "updated": max((s["updated"] for s in ranks), default=time.time()),
        "last_error": next((s["last_error"] for s in ranks if s.get("last_error")), None),
    }


def owns(cfg: ExtractConfig, rank: Rank, key: str) -> bool:
    """Host share (`--shard I/N`, same hash as `generate`), then this rank's share of it.

    The rank split hashes a salted key, so the host-level partition is the generator's
    and any mix of ranks per host still partitions ids exactly once.
    """
    if not cfg.shard.owns(key):
        return False
    return rank.world == 1 or shard_of(f"{key}\x1frank", rank.world) == rank.rank


def _meta(cfg: ExtractConfig, info: Any) -> dict[str, Any]:
    return {"model": str(cfg.model.resolve()), "num_layers": info.num_layers,
            "hidden_size": info.hidden, "layers": list(info.layers), "dtype": cfg.dtype,
            "final_normed": True, "max_length": cfg.max_length, "overlong": cfg.overlong,
            "reasoning": cfg.reasoning,
            "keys": {"input_ids": "int64 [T]", "loss_mask": "uint8 [T]",
                     "aux_hidden_states": f"{cfg.dtype} [T, 3H] (layers in order)",
                     "hidden_state": f"{cfg.dtype} [T, H] (final norm output)"}}


SETTINGS = ("num_layers", "hidden_size", "layers", "dtype", "max_length", "overlong",
            "reasoning")


def _check_meta(out_dir: Path, meta: dict[str, Any], write: bool = True) -> None:
    """One output dir holds one kind of features: refuse to mix settings on resume."""
    from payload.extract.writer import write_json_atomic

    path = out_dir / "meta.json"
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path}: unreadable ({exc}); move it away to start over") from None
        diff = {k: (old.get(k), meta[k]) for k in SETTINGS if old.get(k) != meta[k]}
        if diff:
            desc = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
            raise UsageError(f"{out_dir} holds features made with other settings ({desc}); "
                             "use another --output-dir or the same flags")
        if old == meta:
            return
    if write:
        write_json_atomic(path, meta)


def _eos_ids(tokenizer: Any, model_dir: Path) -> set[int]:
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


class ErrorLog:
    def __init__(self, path: Path, record: bool = True) -> None:
        self.path = path
        self.record = record
        self._lock = threading.Lock()
        self.last = ""
        if record:
            path.unlink(missing_ok=True)  # this run's failures only (a rerun retries them)

    def add(self, rid: Any, line_no: int | None, kind: str, message: str) -> None:
        print(f"extract: {kind}: {message}", file=sys.stderr, flush=True)
        self.last = f"{kind}: id {rid}"
        if not self.record:
            return
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"id": rid, "line": line_no, "error": kind,
                                 "message": message}, ensure_ascii=False) + "\n")


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except UsageError as exc:
        print(f"extract: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _main(args: argparse.Namespace) -> int:
    from payload.extract import preflight
    from payload.extract.model import read_info
    from payload.extract.tokens import BoundaryError, Renderer, Sample, parse_record, truncate
    from payload.extract.writer import (
        ManifestPart,
        clean_temp_files,
        count_supervised,
        merge_manifest,
        read_manifest_keys,
        sample_relpath,
        validate,
        write_json_atomic,
    )

    cfg = from_args(args)
    rank = Rank.from_env()
    info = read_info(cfg)
    out = cfg.output_dir
    # --preflight-only (run by `fab verify`) writes nothing: a meta.json from verify's flags
    # would make the real launch's (other) flags look like a settings change.
    dry = cfg.preflight_only
    if not dry:
        out.mkdir(parents=True, exist_ok=True)
    _check_meta(out, _meta(cfg, info), write=not dry)
    tag = f"shard{cfg.shard.index}-of-{cfg.shard.count}.{rank.tag}"
    label = f"extract {tag}"
    # torchrun gives every rank of one launch the same run id; a lone process is its own run
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or f"pid{os.getpid()}"
    stats = Stats(shard=str(cfg.shard), rank=rank.rank, world=rank.world, started=time.time(),
                  run_id=run_id)
    stats_path = out / f"stats.{tag}.json"
    errors = ErrorLog(out / f"errors.{tag}.jsonl", record=not dry)

    def save_stats(state: str) -> None:
        if dry:
            return
        stats.state, stats.updated, stats.last_error = state, time.time(), errors.last
        write_json_atomic(stats_path, asdict(stats))
        if cfg.status_file is not None:
            write_json_atomic(cfg.status_file, job_status(out, run_id, rank.world))

    save_stats("starting")

    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model, local_files_only=True,
                                                  trust_remote_code=cfg.trust_remote_code)
        renderer = Renderer(tokenizer, cfg.reasoning, _eos_ids(tokenizer, cfg.model))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--model {cfg.model}: tokenizer: {exc}") from None
    stats.reasoning_mode = renderer.reasoning_mode

    # 1. Read, keep what this rank owns and is not done, tokenize in chunks.
    t0 = time.monotonic()
    listed = read_manifest_keys(out)
    part = None if dry else ManifestPart(out, tag)
    seen: set[str] = set()
    samples: list[Sample] = []
    chunk: list[Any] = []

    def flush_chunk() -> None:
        for conv, res in zip(chunk, renderer.encode_many(chunk), strict=True):
            if isinstance(res, BoundaryError):
                stats.failed_boundary += 1
                errors.add(conv.id, conv.line_no, "boundary", str(res))
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
            samples.append(res)
        chunk.clear()

    for line_no, line in iter_lines(cfg.input):
        stats.lines += 1
        try:
            conv = parse_record(line, line_no)
        except BadRecord as exc:
            stats.bad_lines += 1
            print(f"extract: {cfg.input}:{line_no}: skipped: {exc}", file=sys.stderr)
            continue
        if not owns(cfg, rank, conv.key):
            continue
        if conv.key in seen:
            stats.duplicates += 1
            continue
        seen.add(conv.key)
        stats.owned += 1
        rel = sample_relpath(conv.key)
        t = validate(out / rel, info.hidden, cfg.dtype) if (out / rel).exists() else None
        if t is not None:
            stats.already_done += 1
            if part is not None and conv.key not in listed:  # renamed, killed before the line
                part.add(conv.id, rel, t, count_supervised(out / rel))
            continue
        chunk.append(conv)
        if len(chunk) >= CHUNK:
            flush_chunk()
    if chunk:
        flush_chunk()
    stats.tokenize_s = time.monotonic() - t0
    if stats.lines == 0:
        raise UsageError(f"--input {cfg.input} has no records")
    if not dry:
        owned_paths = {sample_relpath(s.key) for s in samples}
        stats.temp_files_removed = clean_temp_files(out, owned_paths)

    # 2. Disk preflight for what is left to write.
    est = preflight.estimate((s.num_tokens for s in samples), info.hidden, cfg.dtype)
    stats.estimate_bytes = est.bytes
    if cfg.preflight_only:
        free = preflight.free_bytes(preflight.existing(out))
        fits = est.bytes * rank.local_world + cfg.reserve_bytes <= free
        print(json.dumps({"samples": est.samples, "tokens": est.tokens,
                          "estimate_bytes": est.bytes, "bytes_per_token": est.per_token,
                          "already_done": stats.already_done, "free_bytes": free,
                          "reserve_bytes": cfg.reserve_bytes, "fits": fits}), flush=True)
        return EXIT_OK if fits else EXIT_USAGE
    try:
        print(preflight.check(est, out, reserve=cfg.reserve_bytes, sharers=rank.local_world,
                              force=cfg.force), file=sys.stderr, flush=True)
    except preflight.DiskTooSmall as exc:
        print(f"extract: {exc}", file=sys.stderr)
        assert part is not None
        part.close()
        save_stats("refused")
        return EXIT_USAGE
    save_stats("running")
    assert part is not None

    stop = StopFlag()
    try:
        with stop.installed():
            if samples:
                _extract(cfg, rank, info, samples, tokenizer, part, stats, errors, label,
                         save_stats, stop)
    except Exception as exc:
        if type(exc).__name__ != "OutOfMemoryError":
            save_stats("aborted")
            raise
        print(f"extract: out of GPU memory ({exc}); lower --batch-tokens (now "
              f"{cfg.batch_tokens}) or --max-length; the run is resumable",
              file=sys.stderr, flush=True)
        save_stats("aborted")
        return EXIT_FAILED
    finally:
        part.close()
        merge_manifest(out)
    if stop.set:
        save_stats("stopped")
        print(f"extract: stopped by SIGTERM after {stats.written} samples; rerun the same "
              "command to resume", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    save_stats("finished" if stats.failed == 0 else "finished_with_failures")
    print(json.dumps({"extract": tag, "written": stats.written,
                      "already_done": stats.already_done, "failed": stats.failed,
                      "skipped_overlong": stats.skipped_overlong, "truncated": stats.truncated,
                      "dropped_unsupervised": stats.dropped_unsupervised,
                      "bad_lines": stats.bad_lines, "tokens_per_s": round(stats.tokens_per_s),
                      "bytes_written": stats.bytes_written}), file=sys.stderr, flush=True)
    return EXIT_FAILED if stats.failed else EXIT_OK


def _extract(cfg: ExtractConfig, rank: Rank, info: Any, samples: list[Any], tokenizer: Any,
             part: Any, stats: Stats, errors: ErrorLog, label: str, save_stats: Any,
             stop: StopFlag) -> None:
    import torch

    from payload.extract.batching import collate, plan_batches
    from payload.extract.model import FeatureModel
    from payload.extract.progress import Progress
    from payload.extract.writer import sample_relpath, write_sample

    t0 = time.monotonic()
    fm = FeatureModel(cfg, info, rank)
    stats.device = fm.device_summary
    stats.load_s = time.monotonic() - t0
    print(f"[{label}] model loaded on {fm.device_summary} in {stats.load_s:.1f}s; "
          f"{len(samples)} samples; layers {list(info.layers)}; reasoning {stats.reasoning_mode}",
          file=sys.stderr, flush=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batches = plan_batches([s.num_tokens for s in samples], cfg.batch_tokens)
    progress = Progress(len(samples), sum(s.num_tokens for s in samples), cfg.progress, label)
    lock = threading.Lock()
    out = cfg.output_dir
    last_save = time.monotonic()

    def write_batch(batch_samples: list[Any], aux: Any, hidden: Any, ok: list[bool],
                    ready: Any) -> None:
        if ready is not None:
            ready.synchronize()  # the device-to-host copies of this batch have landed
        for i, s in enumerate(batch_samples):
            if not ok[i]:
                continue
            t = s.num_tokens
            mask = torch.zeros(t, dtype=torch.uint8)
            mask[s.prompt_len:min(s.sup_end, t)] = 1
            tensors = {
                "input_ids": torch.frombuffer(s.input_ids, dtype=torch.int32).to(torch.long),
                "loss_mask": mask,
                "aux_hidden_states": aux[i, :t],
                "hidden_state": hidden[i, :t],
            }
            rel = sample_relpath(s.key)
            nbytes = write_sample(out / rel, tensors)
            with lock:
                part.add(s.id, rel, t, s.num_supervised)
                stats.written += 1
                stats.tokens_written += t
                stats.supervised_written += s.num_supervised
                stats.bytes_written += nbytes
                progress.update(done=1, tokens=t, nbytes=nbytes)

    t1, c1 = time.monotonic(), time.process_time()
    pending: deque[Future[None]] = deque()
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="extract-write") as pool:
        for idx in batches:
            if stop.set:
                break
            batch = collate([samples[i] for i in idx], pad)
            aux, hidden = fm.forward(batch)
            valid = batch.attention_mask.to(aux.device).bool()
            finite = torch.isfinite(aux).all(-1) & torch.isfinite(hidden).all(-1)
            ok = (finite | ~valid).all(-1).tolist()
            for i, good in enumerate(ok):
                if not good:
                    s = batch.samples[i]
                    with lock:
                        stats.failed_nonfinite += 1
                        progress.update(failed=1)
                    errors.add(s.id, None, "nonfinite",
                               f"id {s.key}: NaN or Inf in the features; not written "
                               f"(try --dtype float32 or bfloat16 instead of float16)")
            ready = None
            if aux.device.type == "cuda":
                aux = aux.to("cpu", non_blocking=True)
                hidden = hidden.to("cpu", non_blocking=True)
                ready = torch.cuda.Event()
                ready.record()
            pending.append(pool.submit(write_batch, batch.samples, aux, hidden, ok, ready))
            while len(pending) > MAX_PENDING_BATCHES:
                pending.popleft().result()
            if time.monotonic() - last_save > 5:
                last_save = time.monotonic()
                with lock:
                    el = max(time.monotonic() - t1, 1e-9)
                    stats.samples_per_s = stats.written / el
                    stats.tokens_per_s = stats.tokens_written / el
                    save_stats("running")
        while pending:
            pending.popleft().result()
    progress.close()
    fm.close()
    stats.extract_s = time.monotonic() - t1
    stats.extract_cpu_s = time.process_time() - c1
    stats.samples_per_s = stats.written / max(stats.extract_s, 1e-9)
    stats.tokens_per_s = stats.tokens_written / max(stats.extract_s, 1e-9)
