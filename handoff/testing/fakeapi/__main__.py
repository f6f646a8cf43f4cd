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
    args = parser.parse_args(argv)
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
                          token_ids=args.token_ids, thinking=args.thinking)

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
                          if k not in ("successes_by_prompt", "bodies")}), flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
