"""The fake OpenRouter itself: an aiohttp server on loopback, in its own thread or in the
caller's loop (handoff.testing.fakeapi describes what it answers and the modes it has).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from aiohttp import web

from handoff.testing.fakeapi.answers import AnswerShapes
from handoff.testing.fakeapi.batches import BatchPlan, BatchService
from handoff.testing.fakeapi.faults import (
    DEFAULT_ENDPOINTS,
    PREFIX,
    FakeStats,
    FaultPlan,
    answer_digest,
)
from handoff.testing.fakeapi.streams import Streamer, StreamPlan
from handoff.testing.fakekeys import KeyStore
from payload.records import derive_id

UNPACED = 1e6  # a time_scale at which a default stream goes out as fast as it is written

_ARCHITECTURE = {"modality": "text->text", "input_modalities": ["text"],
                 "output_modalities": ["text"], "tokenizer": "Other", "instruct_type": None}


class FakeOpenRouter(AnswerShapes):
    """See the module docstring. `endpoints=None` serves DEFAULT_ENDPOINTS; `[]` serves an empty
    list; `serve_endpoints=False` answers 404 there (as a server without the list would)."""

    def __init__(self, *, api_key: str, host: str = "127.0.0.1", port: int = 0,
                 faults: FaultPlan | None = None, latency_s: float = 0.0,
                 cost_per_request: float = 0.0001, credit_limit: float | None = None,
                 endpoints: list[dict[str, Any]] | None = None, serve_endpoints: bool = True,
                 record_bodies: bool = False, completion_tokens: int = 32,
                 echo_key_in_errors: bool = False, capacity: int | None = None,
                 capacity_status: int = 429, capacity_retry_after: float | None = 1.0,
                 outage_at_s: float | None = None, outage_for_s: float = 0.0,
                 outage_kind: str = "503", known_models: set[str] | None = None,
                 stream_only: bool = False, error_null: bool = False,
                 content_parts: bool = False, report_cost: bool = True, pricing: bool = True,
                 fast_faults: bool = False, timeline: bool = False,
                 thinking: str | None = None, reasoning_tokens: int = 48,
                 reasoning_sigma: float = 0.0, stream: StreamPlan | None = None,
                 generation_header: bool = False, body_id: bool = True,
                 providers: list[str] | None = None, check_history: bool = False,
                 token_ids: bool = False, token_vocab: int = 100,
                 refuse_fields: tuple[str, ...] = (), batches: BatchPlan | None = None,
                 stable_ids: bool = False) -> None:
        if not host.startswith("127.") and host not in ("localhost", "::1"):
            raise ValueError("the fake API only listens on loopback")
        self.api_key = api_key
        self.host = host
        self.port = port
        self.faults = faults or FaultPlan()
        self.latency_s = latency_s
        self.cost_per_request = cost_per_request
        self.credit_limit = credit_limit
        self.endpoints = DEFAULT_ENDPOINTS if endpoints is None else endpoints
        self.serve_endpoints = serve_endpoints
        self.record_bodies = record_bodies
        self.completion_tokens = completion_tokens
        # Some proxies echo the Authorization header in error texts: lets tests prove that
        # the payload redacts whatever an API sends back.
        self.echo_key_in_errors = echo_key_in_errors
        self.capacity = capacity
        self.capacity_status = capacity_status
        self.capacity_retry_after = capacity_retry_after
        if outage_kind not in ("503", "reset", "refuse"):
            raise ValueError("outage_kind is one of 503, reset, refuse")
        self.outage_at_s = outage_at_s
        self.outage_for_s = outage_for_s
        self.outage_kind = outage_kind
        self.known_models = known_models
        self.stream_only = stream_only
        self.error_null = error_null
        self.content_parts = content_parts
        self.report_cost = report_cost
        self.pricing = pricing
        self.fast_faults = fast_faults
        self.record_timeline = timeline
        if thinking not in (None, "field", "tags"):
            raise ValueError("thinking is None, 'field' or 'tags'")
        self.thinking = thinking
        self.reasoning_tokens = reasoning_tokens
        self.reasoning_sigma = reasoning_sigma  # > 0: each prompt's length log-normal
        self.generation_header = generation_header
        self.body_id = body_id
        self.providers = providers or ["DeepInfra"]
        self.check_history = check_history
        self.token_ids = token_ids  # answer vLLM's token_ids when asked (return_token_ids)
        self.token_vocab = token_vocab
        self.refuse_fields = refuse_fields  # body fields refused with OpenAI's 400
        # The Batch API (/files, /batches: handoff.testing.fakeapi.batches); `stable_ids`: an
        # answer's id is its prompt's digest, the same whether asked alone or in a batch.
        self.batches = BatchService(self, batches)
        self.stable_ids = stable_ids
        self._answered: dict[str, str] = {}  # derive_id(history) -> the visible answer given
        self.serving = 0  # requests past the capacity gate
        self._t0: float | None = None  # first chat request (monotonic)
        self._outage_until = 0.0
        self._site: web.TCPSite | None = None
        self.stats = FakeStats()
        # "stream": true. Unpaced unless a test asks (a plan): the payload streams by
        # default, and a fake answering 32 tokens at 40/s would slow every test 0.8 s an answer.
        self.streamer = Streamer(stream or StreamPlan(time_scale=UNPACED), self.stats)
        self.keys = KeyStore(lambda: self.api_key)  # child keys, the management API (handoff.testing.fakekeys)
        self.base_url = ""
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(PREFIX + "/chat/completions", self._chat)
        app.router.add_get(PREFIX + "/key", self._key)
        app.router.add_get(PREFIX + "/models/{author}/{slug}/endpoints", self._endpoints)
        app.router.add_get("/_fake/stats", self._stats)
        self.keys.add_routes(app, PREFIX)
        self.batches.add_routes(app, PREFIX)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self._app(), access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        await self._listen()
        self.base_url = f"http://{self.host}:{self.port}{PREFIX}"
        return self.base_url

    async def _listen(self) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.host, self.port, backlog=4096,
                           reuse_address=True)
        await site.start()
        server = site._server
        assert server is not None and isinstance(server, asyncio.base_events.Server)
        self.port = server.sockets[0].getsockname()[1]
        self._site = site

    # -- outages -------------------------------------------------------------------------------
    def start_outage(self, seconds: float, kind: str | None = None) -> None:
        """From any thread: every request fails for `seconds` (kind: 503, reset, refuse)."""
        kind = kind or self.outage_kind
        if self._loop is not None and threading.current_thread() is not self._thread:
            self._loop.call_soon_threadsafe(self._begin_outage, seconds, kind)
        else:
            self._begin_outage(seconds, kind)

    def _begin_outage(self, seconds: float, kind: str) -> None:
        now = time.monotonic()
        self.outage_kind = kind
        self._outage_until = now + seconds
        t0 = self._t0 if self._t0 is not None else now
        self.stats.outage_windows.append((round(now - t0, 3), round(now - t0 + seconds, 3)))
        if kind == "refuse" and self._site is not None:
            site, self._site = self._site, None
            loop = asyncio.get_running_loop()
            stopping = loop.create_task(site.stop())
            loop.call_later(seconds, lambda: loop.create_task(self._reopen(stopping)))

    async def _reopen(self, stopping: asyncio.Task[None]) -> None:
        await stopping
        await self._listen()

    def _in_outage(self, now: float) -> bool:
        if self.outage_at_s is not None and self._t0 is not None \
                and now - self._t0 >= self.outage_at_s:
            self.outage_at_s = None  # scheduled once
            self._begin_outage(self.outage_for_s, self.outage_kind)
        return now < self._outage_until

    def _tick(self, now: float, column: int, peak: int | None = None) -> None:
        assert self._t0 is not None
        row = self.stats.timeline.setdefault(int((now - self._t0) * 10), [0, 0, 0, 0])
        row[column] += 1
        if peak is not None and peak > row[3]:
            row[3] = peak

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start_in_thread(self) -> str:
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:  # reported to the caller below
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            pending = asyncio.all_tasks(loop)  # e.g. handlers of a scripted hang
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=main, name="fake-openrouter", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise failure[0]
        return self.base_url

    def stop_thread(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None
            self._loop = None

    # -- handlers ------------------------------------------------------------------------------
    def _authorized(self, request: web.Request) -> bool:
        return self.keys.authorize(request)  # the account's key, or a live child key

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        stats = self.stats
        stats.requests += 1
        request_no = stats.requests
        stats.in_flight += 1
        stats.peak_concurrency = max(stats.peak_concurrency, stats.in_flight)
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        if self.record_timeline:
            self._tick(now, 0, stats.in_flight)
        try:
            return await self._chat_inner(request, request_no, now)
        finally:
            stats.in_flight -= 1

    def _refuse(self, status: int, retry_after: float | None, now: float) -> web.Response:
        if self.record_timeline:
            self._tick(now, 2)
        if status == 402:
            return self._error(402, "Too many requests in flight for this key's balance",
                               retry_after=retry_after)
        return self._error(status, retry_after=retry_after)

    async def _chat_inner(self, request: web.Request, request_no: int, now: float
                          ) -> web.StreamResponse:
        if self._in_outage(now):
            self.stats.outage_refusals += 1
            if self.outage_kind == "503" or request.transport is None:
                return self._refuse(503, None, now)
            request.transport.abort()  # reset, or a connection kept alive across "refuse"
            raise ConnectionResetError("fake outage")
        if not self._authorized(request):
            return self._error(401, self.keys.refusal(request))
        try:
            body = await request.json()
            messages = body["messages"]
        except (ValueError, KeyError, TypeError):
            return self._error(400, "request body is not a chat completion request")
        if self.record_bodies:
            self.stats.bodies.append(body)
        if isinstance(body, dict) and body.get("return_token_ids") is True:
            self.stats.token_id_requests += 1
        refused = [f for f in self.refuse_fields if isinstance(body, dict) and f in body]
        if refused:
            return self._error(400, f"Unrecognized request argument supplied: {refused[0]}")
        if isinstance(messages, list):
            self.stats.requests_by_prompt[derive_id(messages)] += 1
            if self.check_history:
                self._check_history(messages)
        if self.known_models is not None and body.get("model") not in self.known_models:
            return self._error(400, f"Invalid model name passed in model={body.get('model')}. "
                               "Call `/v1/models` to view available models for your key.")
        if self.capacity is not None:
            if self.serving >= self.capacity:
                self.stats.capacity_refusals += 1
                return self._refuse(self.capacity_status, self.capacity_retry_after, now)
            self.serving += 1
        try:
            return await self._serve(request, request_no, body, messages)
        finally:
            if self.capacity is not None:
                self.serving -= 1

    async def _serve(self, request: web.Request, request_no: int, body: dict[str, Any],
                     messages: list[dict[str, Any]]) -> web.StreamResponse:
        fault = self.faults.draw(request_no) if self.fast_faults else None
        if fault is None and self.latency_s:
            await asyncio.sleep(self.latency_s)
        if not self.fast_faults:
            fault = self.faults.draw(request_no)
        if fault is not None:
            self.stats.faults[fault] += 1
            response = await self._fault(fault, request)
            if response is not None:
                return response
        if (key_limit := self.keys.over_limit(request, self.cost_per_request)) is not None:
            return self._error(402, **key_limit)
        if self.credit_limit is not None and (
                self.stats.total_cost + self.cost_per_request > self.credit_limit + 1e-12):
            return self._error(402, "Key limit exceeded: this key's credit limit is reached",
                               metadata={"limit": self.credit_limit})
        prompt_id = derive_id(messages)
        self.stats.successes += 1
        self.stats.successes_by_prompt[prompt_id] += 1
        self.stats.total_cost += self.cost_per_request
        self.keys.charge(request, self.cost_per_request)
        if self.record_timeline:
            self._tick(time.monotonic(), 1)
        content = f"answer {answer_digest(messages)}"
        if self.stream_only and body.get("stream") is not True:
            return self._sse(body, content)
        if self.thinking is not None:
            return await self._answer(request, body, self._thinking_result(body, messages,
                                                                           content))
        if self.check_history:
            self._answered[prompt_id] = content
        return await self._answer(request, body, self._result(
            body, content, "stop", provider=self._provider(messages)))

    async def _key(self, request: web.Request) -> web.Response:
        self.stats.key_calls += 1
        if not self._authorized(request):
            return self._error(401, self.keys.refusal(request))
        if (child := self.keys.child_of(request)) is not None:
            return web.json_response({"data": child.current_key()})
        limit = self.credit_limit
        usage = round(self.stats.total_cost, 10)
        return web.json_response({"data": {
            "label": "sk-or-v1-fak...e00", "usage": usage, "limit": limit,
            "limit_remaining": None if limit is None else round(limit - usage, 10),
            "limit_reset": None, "is_free_tier": False, "is_management_key": False,
            "is_provisioning_key": False, "include_byok_in_limit": False,
            "byok_usage": 0, "usage_daily": usage, "usage_weekly": usage,
            "usage_monthly": usage}})

    async def _endpoints(self, request: web.Request) -> web.Response:
        self.stats.endpoint_calls += 1
        if not self.serve_endpoints:
            return self._error(404, "Resource not found")
        model = f"{request.match_info['author']}/{request.match_info['slug']}"
        endpoints = []
        for ep in self.endpoints:
            full = {"name": f"{ep['provider_name']}: {model}", "model_id": model,
                    "model_name": model, "context_length": 262144,
                    "max_completion_tokens": 65536, "max_prompt_tokens": None,
                    "pricing": {"prompt": "0", "completion": "0",
                                "request": f"{self.cost_per_request:.10f}"},
                    "status": 0, "supported_parameters": ["max_tokens", "temperature",
                                                          "top_p", "reasoning"],
                    "uptime_last_30m": 100, "uptime_last_5m": 100, "uptime_last_1d": 100,
                    "supports_implicit_caching": False,
                    "latency_last_30m": {"p50": 0.2, "p75": 0.3, "p90": 0.4, "p99": 0.8},
                    "throughput_last_30m": {"p50": 50, "p75": 40, "p90": 30, "p99": 15}}
            full.update(ep)
            if not self.pricing:
                full.pop("pricing", None)
            endpoints.append(full)
        return web.json_response({"data": {"id": model, "name": model, "created": 0,
                                           "description": "fake",
                                           "architecture": _ARCHITECTURE,
                                           "endpoints": endpoints}})

    async def _stats(self, request: web.Request) -> web.Response:
        """The counters; `?billed_after=T` (a `time.monotonic()` moment) adds
        `tokens_billed_after`: completion tokens streamed after T."""
        out = {**self.stats.as_dict(), "batches": self.batches.stats.as_dict()}
        if (after := request.query.get("billed_after")) is not None:
            try:
                out["tokens_billed_after"] = self.stats.tokens_billed_after(float(after))
            except ValueError:
                return self._error(400, "billed_after is a number (time.monotonic())")
        return web.json_response(out)


__all__ = ["FakeOpenRouter"]
