"""`python -m handoff.testing.fakeapi`: the fake OpenRouter alone, until SIGTERM/SIGINT; it
prints `base_url=...` once listening and its counters as JSON at exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

from handoff.testing import fakeapi
from handoff.testing.fakeapi.faults import FaultPlan
from handoff.testing.fakeapi.server import FakeOpenRouter
from handoff.testing.fakeapi.streams import StreamPlan

# StreamPlan field -> (type, help): one flag each, overriding --stream-plan's value
_STREAM_FLAGS: dict[str, tuple[type, str]] = {
    "tokens_per_s": (float, "mean decode rate of a request, tokens per fake second (40)"),
    "rate_sigma": (float, "log-normal sigma of the per-request rate (0: all the same)"),
    "queue_s": (float, "mean fake seconds queued before the first token (0)"),
    "queue_sigma": (float, "log-normal sigma of the queue time (0)"),
    "comment_every_s": (float, "a ': OPENROUTER PROCESSING' line this often while queued (5)"),
    "time_scale": (float, "fake seconds per real second (1; 600: a 10-minute answer in 1 s)"),
    "write_every_s": (float, "REAL seconds: the least gap between writes to a stream (0.02)"),
    "error_share": (float, "share of streams ended by a mid-stream error event"),
    "cut_share": (float, "share of streams whose connection is closed before [DONE]"),
    "stall_share": (float, "share of streams that stall mid-way for --stall-s"),
    "stall_s": (float, "fake seconds a stall lasts (30); < 0: until the client leaves"),
    "seed": (int, "seed of the stream draws (rates, chunk sizes, trouble)"),
}


def _read_key(path: str | None) -> str:
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    key = os.environ.get("FAKEAPI_KEY") or os.environ.get("OPENROUTER_API_KEY")
    if not key:
        raise SystemExit("fakeapi: give --key-file F or set $FAKEAPI_KEY (never the key in argv)")
    return key.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m handoff.testing.fakeapi", description=fakeapi.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--key-file", help="file holding the one key the fake accepts")
    parser.add_argument("--faults", default="{}", help='FaultPlan JSON: {"rates": {...}, '
                        '"schedule": {...}, "seed": 1, "retry_after_s": 0.2}')
    parser.add_argument("--fault-mix", type=float, default=0.0,
                        help="fail this fraction of requests, spread over retryable faults")
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--cost", type=float, default=0.0001)
    parser.add_argument("--credit-limit", type=float, default=None)
    parser.add_argument("--no-endpoints", action="store_true", help="answer 404 to /endpoints")
    parser.add_argument("--capacity", type=int, help="serve at most K at once; refuse the rest")
    parser.add_argument("--capacity-status", type=int, default=429, choices=(429, 402))
    parser.add_argument("--capacity-retry-after", type=float, default=1.0,
                        help="Retry-After of a refusal (s); negative: none")
    parser.add_argument("--outage-at", type=float, help="seconds after the first request")
    parser.add_argument("--outage-for", type=float, default=0.0)
    parser.add_argument("--outage-kind", default="503", choices=("503", "reset", "refuse"))
    parser.add_argument("--fast-faults", action="store_true",
                        help="draw faults at the door, before the latency")
    parser.add_argument("--no-cost", action="store_true", help="no usage.cost in answers")
    parser.add_argument("--timeline", action="store_true",
                        help="record a per-100 ms timeline (in the stats printed at exit)")
    parser.add_argument("--token-ids", action="store_true",
                        help="answer vLLM's token_ids to a request with return_token_ids")
    parser.add_argument("--thinking", choices=("field", "tags"),
                        help="a thinking model: reasoning before the answer")
    parser.add_argument("--reasoning-tokens", type=int, default=48,
                        help="a thinking answer's reasoning tokens (the mean with a sigma)")
    parser.add_argument("--reasoning-sigma", type=float, default=0.0,
                        help="> 0: each prompt's reasoning length log-normal with this sigma")
    parser.add_argument("--stable-ids", action="store_true",
                        help="an answer's id is its prompt's digest")
    streaming = parser.add_argument_group(
        "streaming (\"stream\": true)", "StreamPlan's fields, in the fake's seconds (real = fake "
        "/ --time-scale) except --write-every-s; --stall-s < 0 stalls until the client leaves")
    streaming.add_argument("--stream-plan", default="{}", help="StreamPlan JSON, e.g. "
                           '{"schedule": {"1": "cut"}, "first_attempt": "error"}')
    streaming.add_argument("--chunk-tokens", help="least,most tokens a chunk (default 1,4)")
    for name, (kind, text) in _STREAM_FLAGS.items():
        flag = "--stream-seed" if name == "seed" else "--" + name.replace("_", "-")
        streaming.add_argument(flag, dest=name, type=kind, default=None, help=text)
    streaming.add_argument("--stall-comments", action="store_true",
                           help="comment lines go on through a stall (OpenRouter's keep-alive)")
    streaming.add_argument("--usage-when-asked", action="store_true",
                           help="the usage chunk only with stream_options.include_usage (vLLM)")
    args = parser.parse_args(argv)
    plan_fields = json.loads(args.stream_plan)
    plan_fields.update({k: getattr(args, k) for k in _STREAM_FLAGS if getattr(args, k) is not None})
    if args.chunk_tokens:
        plan_fields["chunk_tokens"] = [int(x) for x in args.chunk_tokens.split(",")]
    if plan_fields.get("stall_s") is not None and plan_fields["stall_s"] < 0:
        plan_fields["stall_s"] = None
    if args.stall_comments:
        plan_fields["stall_comments"] = True
    if args.usage_when_asked:
        plan_fields["usage_always"] = False
    # No streaming flag: the server's own default plan, as FakeOpenRouter() gets it.
    stream_plan = StreamPlan.from_json(json.dumps(plan_fields)) if plan_fields else None
    plan = FaultPlan.mix(args.fault_mix, seed=1) if args.fault_mix else FaultPlan.from_json(
        args.faults)
    fake = FakeOpenRouter(api_key=_read_key(args.key_file), host=args.host, port=args.port,
                          faults=plan, latency_s=args.latency, cost_per_request=args.cost,
                          credit_limit=args.credit_limit, serve_endpoints=not args.no_endpoints,
                          capacity=args.capacity, capacity_status=args.capacity_status,
                          capacity_retry_after=(None if args.capacity_retry_after < 0
                                                else args.capacity_retry_after),
                          outage_at_s=args.outage_at, outage_for_s=args.outage_for,
                          outage_kind=args.outage_kind, fast_faults=args.fast_faults,
                          report_cost=not args.no_cost, timeline=args.timeline,
                          token_ids=args.token_ids, thinking=args.thinking,
                          reasoning_tokens=args.reasoning_tokens,
                          reasoning_sigma=args.reasoning_sigma, stable_ids=args.stable_ids,
                          stream=stream_plan)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        url = await fake.start()
        print(f"base_url={url}", flush=True)
        await stop.wait()
        await fake.stop()
        print(json.dumps({k: v for k, v in fake.stats.as_dict().items()
                          if k not in ("successes_by_prompt", "bodies", "stream_log")}),
              flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
