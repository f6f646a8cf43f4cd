"""`python -m payload generate|smoke|extract` (and `python payload.pyz …`, same entry).

Everything printed goes through redaction of the API key: stdout and stderr are wrapped
for the duration of `main`, so no code path can print the key by accident. The wrapper
also drops what cannot be written (the log on a full disk): a message lost is better
than a run that dies, or loops, on its own log.

This is the top of the payload: it parses flags into each command's settings, and maps
every expected failure (a `payload.errors.PayloadError`, whatever raised it) to its exit
code and one `error: …` line, in `main` only. Each command's modules are imported when
it runs (the extractor's heavy ones only inside `extract.run`), so `generate` and `smoke`
never need torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from payload import defaults
from payload.errors import ExitCode, PayloadError
from payload.records import parse_shard, sibling_path
from payload.redact import RedactingStream
from payload.report import Reporter

EXIT_USAGE = ExitCode.USAGE
_REPORT = Reporter()  # what the command entry itself says (stderr, redacted)


class _LogStream(RedactingStream):
    """Redacts, and swallows write errors (ENOSPC, EPIPE) instead of raising them into
    whatever code path was reporting something."""

    def write(self, text: str) -> int:
        try:
            return super().write(text)
        except (OSError, ValueError):
            return 0

    def flush(self) -> None:
        try:
            super().flush()
        except (OSError, ValueError):
            pass


_UNSET: Any = object()


class _Parser(argparse.ArgumentParser):
    """Every parser of the payload, subcommands included (`parser_class`): no abbreviated
    flags (argparse would take `--mode` for `--model`, silently, and a flag added later would
    change what an old command line means), and a redacted usage error, exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # argparse exits 2 too; keep its message redacted
        self.print_usage(sys.stderr)
        _REPORT.say(f"{self.prog}: error: {message}")
        raise SystemExit(EXIT_USAGE)


def _json_object(flag: str, allow_null: bool = False) -> Any:
    def parse(text: str) -> dict[str, Any] | None:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{flag} is not valid JSON: {exc}") from None
        if value is None and allow_null:
            return None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} must be a JSON object")
        return value
    return parse


def _shard(text: str) -> Any:
    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value == float("inf"):  # nan and inf too: a timeout of nan never fires
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _checked(parse: Any) -> Any:
    def run(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return run


def parse_prices_arg(text: str) -> Any:
    from payload.generate.budget import parse_prices
    return parse_prices(text)


def parse_max_failed_arg(text: str) -> Any:
    from payload.generate.settings import parse_max_failed
    return parse_max_failed(text)


def _provider(args: argparse.Namespace) -> dict[str, Any] | None:
    from payload.generate.settings import provider_for
    explicit = args.provider is not _UNSET
    return provider_for(args.base_url, args.provider if explicit else defaults.PROVIDER,
                        explicit)


def _add_key_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key-file", help="file holding the key, mode 0600 "
                   "(default: $OPENROUTER_API_KEY)")
    p.add_argument("--consume-key", action="store_true",
                   help="delete the key file once read")
    p.add_argument("--base-url", default=defaults.BASE_URL)
    p.add_argument("--model", default=defaults.MODEL)
    p.add_argument("--provider", type=_json_object("--provider", allow_null=True),
                   default=_UNSET,
                   help="provider routing JSON, sent as given; 'null' sends none (default: "
                        f"{json.dumps(defaults.PROVIDER)} when the base URL is openrouter.ai, "
                        "none elsewhere)")


def _size(text: str) -> int:
    """A byte count: `200000000`, `200MB`, `190MiB`."""
    t = text.strip().upper().replace(" ", "")
    units = {"KIB": 1024, "MIB": 1024 ** 2, "GIB": 1024 ** 3, "KB": 1000, "MB": 1000 ** 2,
             "GB": 1000 ** 3, "B": 1}
    for suffix, factor in units.items():
        if t.endswith(suffix):
            t, scale = t[: -len(suffix)], factor
            break
    else:
        scale = 1
    try:
        value = int(float(t) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 200MB)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _add_batch_args(g: argparse.ArgumentParser) -> None:
    g.add_argument("--mode", choices=("sync", "batch", "auto"), default="sync",
                   help="sync (default): one request per prompt, answers in minutes; batch: "
                        "the provider's Batch API (OpenAI's /files + /batches), about half "
                        "the price, answers within 24 h; auto: batch when the server has a "
                        "Batch API, else sync (docs/generator.md, \"Batch mode\")")
    g.add_argument("--batches-file", type=Path,
                   help="the job's batch ledger (default: OUT with .jsonl replaced by "
                        ".batches.json); a rerun re-attaches to the batches it names")
    g.add_argument("--batch-requests", type=_positive(int), default=5000,
                   help="requests per batch at most (default 5000, OpenRouter's limit; "
                        "OpenAI takes 50000)")
    g.add_argument("--batch-bytes", type=_size, default=200_000_000,
                   help="bytes of requests per batch at most (default 200MB)")
    g.add_argument("--batch-poll", type=_positive(float), default=15.0,
                   help="seconds between polls of the live batches at first (default 15), "
                        "growing x1.5 while nothing changes ...")
    g.add_argument("--batch-poll-max", type=_positive(float),
                   help="... up to this (default: 20 x --batch-poll, at most 300)")
    g.add_argument("--batch-price", type=_share, default=0.5,
                   help="the batch price as a share of the synchronous one, for the "
                        "budget's expectation before the first answers (default 0.5)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="payload", description="handoff payload: runs on the containers")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="answer every prompt of a JSONL file (resumable)")
    g.add_argument("--input", required=True, type=Path)
    g.add_argument("--output", required=True, type=Path)
    _add_key_args(g)
    g.add_argument("--concurrency", type=_positive(int), default=defaults.CONCURRENCY)
    g.add_argument("--max-tokens", type=_positive(int))
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-p", type=float)
    g.add_argument("--seed", type=int, help="sampling seed, passed through (providers may "
                   "ignore it)")
    g.add_argument("--reasoning", type=_json_object("--reasoning"),
                   help="reasoning JSON passed through, e.g. '{\"effort\": \"high\"}'")
    g.add_argument("--max-cost", type=_positive(float), help="USD budget (cumulative over "
                   "resumed runs): dispatch while spent + expected cost of the requests in "
                   "flight fits; exit 3 when reached")
    g.add_argument("--prices", type=_checked(parse_prices_arg),
                   help="PROMPT,COMPLETION[,REQUEST]: USD per million prompt / completion "
                        "tokens (and per request), to price answers when the server reports "
                        "no usage.cost (default: the endpoint list's prices)")
    g.add_argument("--max-failed", type=_checked(parse_max_failed_arg), default="1%",
                   help="ids that may fail permanently before the run exits 1: a count (50) "
                        "or a share (2%%); default 1%%")
    g.add_argument("--outage-timeout", type=_positive(float), default=600.0,
                   help="seconds the server may fail as a whole (no connection, 5xx) before "
                        "the run stops, resumable (exit 3); default 600")
    g.add_argument("--shard", type=_shard, default=parse_shard("0/1"),
                   help="I/N: this host's share of the ids (I is 0-based; I,K/N for several)")
    g.add_argument("--exclude-ids", type=Path,
                   help="ids already answered elsewhere, one JSON string per line (a shard "
                        "taken over): never asked here, not in this shard's total")
    g.add_argument("--retry-failed", action="store_true",
                   help="retry the ids recorded in the errors file")
    g.add_argument("--status-file", type=Path,
                   help="JSON status, replaced every few seconds "
                        "(default: OUT with .jsonl replaced by .status.json)")
    g.add_argument("--request-timeout", type=_positive(float), default=3600.0,
                   help="seconds one request may take in all, streamed or not (default 3600)")
    g.add_argument("--stream", choices=("auto", "on", "off"), default="auto",
                   help="stream the answers (server-sent events): auto (default) streams and "
                        "stops streaming to a server that refuses it; on streams; off sends "
                        "plain requests, each answer one JSON body")
    g.add_argument("--idle-timeout", type=_positive(float), default=120.0,
                   help="seconds a stream may be silent once its answer began (default 120)")
    g.add_argument("--first-token-timeout", type=_positive(float), default=600.0,
                   help="seconds a stream may take to begin its answer; the server's "
                        "keep-alive comments do not extend it (default 600)")
    g.add_argument("--max-attempts", type=_positive(int), default=6,
                   help="attempts per prompt before it is recorded as failed")
    g.add_argument("--backoff-base", type=_positive(float), default=1.0,
                   help="first retry delay bound in seconds (full-jitter exponential)")
    g.add_argument("--drain-timeout", type=_non_negative, default=30.0,
                   help="on SIGTERM/SIGINT, seconds in-flight requests may take to finish "
                        "before they are closed (asked again on resume; 0: at once); default "
                        "30. A budget stop or a 402 closes them at once")
    g.add_argument("--no-preflight", action="store_true",
                   help="skip the endpoints check of the provider filter")
    g.add_argument("--max-timeouts", type=_count, default=1,
                   help="times a prompt that timed out is asked again (each timed-out "
                        "request may have been billed in full); default 1")
    g.add_argument("--think-in-content", choices=("split", "refuse"), default="split",
                   help="an answer with <think> markers in content and no reasoning field: "
                        "split them into reasoning (default) or refuse it (a permanent "
                        "error think_in_content)")
    g.add_argument("--turns", choices=("last", "all"), default="last",
                   help="last: regenerate the final assistant turn (default); all: every "
                        "assistant turn in order, each on the regenerated history")
    g.add_argument("--token-ids", choices=("auto", "on", "off"), default="auto",
                   help="ask the server for the sampled token ids (return_token_ids, vLLM >= "
                        "0.10.2) and store them as response_token_ids: auto (default) asks any "
                        "server but OpenRouter and stops asking one that refuses the field; "
                        "on asks (refused for OpenRouter); off never asks")
    g.add_argument("--status-every", type=_positive(float), default=2.0,
                   help="seconds between status file updates (and the outage and stall "
                        "checks); default 2")
    _add_batch_args(g)

    sm = sub.add_parser("smoke", help="one request: model, provider, latency, tokens, cost, "
                        "key credit left")
    _add_key_args(sm)
    sm.add_argument("--max-tokens", type=_positive(int), default=64)
    sm.add_argument("--request-timeout", type=_positive(float), default=120.0)

    b = sub.add_parser("batches", help="the batches of a `generate --mode batch` job: their "
                       "state at the provider; --cancel cancels the live ones")
    b.add_argument("--batches-file", type=Path, required=True,
                   help="the job's batch ledger (generate's --batches-file)")
    b.add_argument("--api-key-file", help="file holding the key, mode 0600 "
                   "(default: $OPENROUTER_API_KEY)")
    b.add_argument("--consume-key", action="store_true", help=argparse.SUPPRESS)
    b.add_argument("--base-url", default=defaults.BASE_URL)
    b.add_argument("--cancel", action="store_true",
                   help="cancel every live batch (refused while a run holds them)")
    b.add_argument("--json", action="store_true", help="one JSON summary line")

    ex = sub.add_parser("extract", help="EAGLE-3 features from generated conversations (GPU)")
    try:
        from payload import extract
    except ImportError as exc:
        ex.set_defaults(_extract_missing=str(exc))
    else:
        extract.add_arguments(ex)
    return parser


def _load_key(args: argparse.Namespace) -> str:
    """The key from --api-key-file or $OPENROUTER_API_KEY (a KeyFileError, exit 2, if refused)."""
    from payload.keyfile import load_key
    return load_key(args.api_key_file, consume=args.consume_key)


def _generate(args: argparse.Namespace) -> int:
    from payload.generate.run import run
    from payload.generate.settings import Settings
    key = _load_key(args)
    settings = Settings(
        input=args.input, output=args.output,
        status_file=args.status_file or sibling_path(args.output, ".status.json"),
        model=args.model, base_url=args.base_url, api_key=key,
        concurrency=args.concurrency, max_tokens=args.max_tokens,
        temperature=args.temperature, top_p=args.top_p, seed=args.seed,
        provider=_provider(args),
        reasoning=args.reasoning, max_cost=args.max_cost, prices=args.prices,
        shard=_owned(args.shard, args.exclude_ids),
        retry_failed=args.retry_failed, request_timeout=args.request_timeout,
        stream=args.stream, idle_timeout=args.idle_timeout,
        first_token_timeout=args.first_token_timeout,
        max_attempts=args.max_attempts, backoff_base=args.backoff_base,
        drain_timeout=args.drain_timeout, outage_timeout=args.outage_timeout,
        max_failed=args.max_failed if not isinstance(args.max_failed, str)
        else parse_max_failed_arg(args.max_failed),
        preflight=not args.no_preflight, status_every=args.status_every,
        max_timeouts=args.max_timeouts, think_in_content=args.think_in_content,
        turns=args.turns, token_ids=args.token_ids, mode=args.mode,
        batches_file=args.batches_file, batch_requests=args.batch_requests,
        batch_bytes=args.batch_bytes, batch_poll=args.batch_poll,
        batch_poll_max=max(args.batch_poll, args.batch_poll_max
                           or min(300.0, 20 * args.batch_poll)),
        batch_price=args.batch_price)
    return run(settings)


def _owned(shard: Any, exclude: Path | None) -> Any:
    """The shard less the ids answered elsewhere (`--exclude-ids`)."""
    if exclude is None:
        return shard
    import dataclasses

    from payload.generate.inputs import exclusions
    return dataclasses.replace(shard, skip=exclusions(exclude))


def _batches(args: argparse.Namespace) -> int:
    import asyncio

    from payload.generate.batch import batches_command
    key = _load_key(args)
    return asyncio.run(batches_command(args.batches_file, args.base_url, key,
                                       cancel=args.cancel, as_json=args.json, say=_REPORT))


def _smoke(args: argparse.Namespace) -> int:
    from payload.generate.smoke import run_smoke
    key = _load_key(args)
    return run_smoke(base_url=args.base_url, api_key=key, model=args.model,
                     provider=_provider(args), max_tokens=args.max_tokens,
                     timeout=args.request_timeout)


def _extract(args: argparse.Namespace) -> int:
    missing = getattr(args, "_extract_missing", None)
    if missing is not None:
        _REPORT.error(f"the extract command is not available in this payload ({missing})")
        return EXIT_USAGE
    from payload import extract
    return int(extract.run(args))


def main(argv: list[str] | None = None) -> int:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _LogStream(out), _LogStream(err)
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown and getattr(args, "_extract_missing", None) is None:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        handler = {"generate": _generate, "smoke": _smoke, "extract": _extract,
                   "batches": _batches}[args.command]
        return handler(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except PayloadError as exc:
        _REPORT.error(str(exc))
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return 3
    except Exception:  # an unexpected failure: a redacted traceback, never the raw one
        import traceback
        _REPORT.say(traceback.format_exc().rstrip("\n"))
        return 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        sys.stdout, sys.stderr = out, err
