"""What one `generate` run was asked to do: its settings, and the checks they get before
anything is sent.

`Settings` is plain data built by `payload/cli.py` from the flags (or by a test); the
rules that belong to single flags live beside it: `--max-failed` (a count or a share),
which routing object goes to which server (`provider_for`), and the paths check (a
missing or empty input, an unwritable output: exit 2 before the first request).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from payload.errors import UsageError
from payload.generate.batchstate import default_path as default_batch_ledger
from payload.generate.budget import Prices
from payload.generate.turns import turns_path
from payload.records import ALL, Shard, errors_path

# Completion tokens assumed for the budget's first expectation when --max-tokens is unset.
FIRST_COMPLETION_GUESS = 8192
# How often the status file is replaced (and the outage and stall limits checked).
STATUS_EVERY_S = 2.0


@dataclass(frozen=True)
class MaxFailed:
    """`--max-failed`: a count (`50`) or a share of the ids (`2%`) that may fail permanently
    before the run exits 1."""

    count: int | None = None
    fraction: float | None = None

    def allowed(self, total: int) -> int:
        if self.count is not None:
            return self.count
        return int(total * (self.fraction or 0.0) + 1e-9)

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{(self.fraction or 0) * 100:g}%"


def parse_max_failed(text: str) -> MaxFailed:
    t = text.strip()
    try:
        if t.endswith("%"):
            pct = float(t[:-1])
            if 0 <= pct <= 100:
                return MaxFailed(fraction=pct / 100)
        else:
            n = int(t)
            if n >= 0:
                return MaxFailed(count=n)
    except ValueError:
        pass
    raise ValueError(f"--max-failed takes a count (e.g. 50) or a percentage (e.g. 2%), got {text!r}")


def is_openrouter(base_url: str) -> bool:
    host = (urlsplit(base_url).hostname or "").lower()
    return host == "openrouter.ai" or host.endswith(".openrouter.ai")


def provider_for(base_url: str, provider: Any, explicit: bool) -> dict[str, Any] | None:
    """The routing object is OpenRouter's: sent to openrouter.ai, or anywhere when the user
    gave it (other OpenAI-compatible APIs reject unknown fields)."""
    if explicit:
        return provider if isinstance(provider, dict) else None
    return provider if is_openrouter(base_url) and isinstance(provider, dict) else None


TOKEN_ID_MODES = ("auto", "on", "off")


def token_ids_for(base_url: str, mode: str) -> bool:
    """Whether requests ask for the sampled token ids (`return_token_ids`, vLLM >= 0.10.2):
    `auto` asks any server but OpenRouter (whose request schema has no such field: it is
    never sent there), `on` asks and refuses OpenRouter (exit 2), `off` never asks."""
    if mode == "off":
        return False
    if is_openrouter(base_url):
        if mode == "on":
            raise UsageError("--token-ids on: OpenRouter cannot return the sampled token ids "
                             "(its API has no return_token_ids); use --token-ids auto or off, "
                             "or a server that can (vLLM >= 0.10.2)")
        return False
    return True


STREAM_MODES = ("auto", "on", "off")


def refuses_streaming(status: int | None, message: str) -> bool:
    """A server that does not take the streaming fields and says so (a 400/422 naming
    `stream_options` or `stream`)."""
    return status in (400, 422) and _STREAM_WORD.search(message) is not None


_STREAM_WORD = re.compile(r"\bstream(ing|_options)?\b", re.IGNORECASE)  # not "upstream"


@dataclass
class Settings:
    input: Path
    output: Path
    status_file: Path | None
    model: str
    base_url: str
    api_key: str
    concurrency: int = 2000
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    provider: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_cost: float | None = None
    prices: Prices | None = None  # --prices: overrides the endpoint list's
    shard: Shard = ALL
    retry_failed: bool = False
    request_timeout: float = 3600.0  # the overall cap of one request (s)
    stream: str = "auto"  # auto | on | off: stream the answers (off: one JSON body each)
    idle_timeout: float = 120.0  # the longest silence of a stream once its answer began
    first_token_timeout: float = 600.0  # the longest wait for a stream's first data event
    max_attempts: int = 6
    backoff_base: float = 1.0
    drain_timeout: float = 60.0
    outage_timeout: float = 600.0
    max_failed: MaxFailed = MaxFailed(fraction=0.01)
    preflight: bool = True
    status_every: float = STATUS_EVERY_S
    max_timeouts: int = 1  # a prompt's timeouts retried at most this often (each may be billed)
    think_in_content: str = "split"  # <think> in content with no reasoning: split | refuse
    turns: str = "last"  # last | all: which assistant turns are regenerated
    token_ids: str = "auto"  # auto | on | off: ask the server for the sampled token ids
    # --mode batch|auto (payload.generate.batch): the Batch API, its ledger, its limits
    mode: str = "sync"  # sync | batch | auto
    batches_file: Path | None = None  # the batch ledger (default: OUT.batches.json)
    batch_requests: int = 5000  # requests per batch (OpenRouter documents 5,000)
    batch_bytes: int = 200_000_000  # bytes of requests per batch (200 MB)
    batch_poll: float = 15.0  # first wait between polls of the live batches (s) ...
    batch_poll_max: float = 300.0  # ... growing while nothing changes, up to this
    batch_price: float = 0.5  # the batch price as a share of the synchronous one (budget)

    @property
    def errors(self) -> Path:
        return errors_path(self.output)

    @property
    def batch_ledger(self) -> Path:
        """The job's batch ledger (`--batches-file`, default OUT.batches.json)."""
        return self.batches_file or default_batch_ledger(self.output)

    @property
    def turn_journal(self) -> Path | None:
        """The journal of regenerated turns, with --turns all only."""
        return turns_path(self.output) if self.turns == "all" else None


def check_paths(s: Settings) -> None:
    """Missing/empty input and unwritable outputs fail before anything is sent."""
    if not s.input.is_file():
        raise UsageError(f"input file {s.input} does not exist (or is not a file)")
    with s.input.open("rb") as fh:
        if not any(line.strip() for line in _head_lines(fh)):
            raise UsageError(f"input file {s.input} is empty: nothing to generate")
    if s.output.resolve() == s.input.resolve():
        raise UsageError("--output must differ from --input")
    for path in (s.output, s.errors, s.status_file, s.turn_journal):
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab"):
                pass
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def _head_lines(fh: BinaryIO, limit: int = 1 << 20) -> Any:
    """Lines until the first non-blank one (bounded read, for the emptiness check)."""
    read = 0
    for line in fh:
        yield line
        read += len(line)
        if line.strip() or read > limit:
            return
