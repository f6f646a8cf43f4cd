"""The fake OpenRouter's Batch API on its own (the payload's batch tests use it end to end):
validation failures, the states a poll sees, cancellation of a batch in flight, a server
without the API, and the key."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from handoff.testing.fakeapi import BatchPlan, FakeOpenRouter
from tests.payload.helpers import make_key


def line(cid: str, model: str = "m", url: str = "/v1/chat/completions") -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": url,
            "body": {"model": model, "messages": [{"role": "user", "content": f"q {cid}"}]}}


async def submit(session: aiohttp.ClientSession, base: str, lines: list[dict[str, Any]]
                 ) -> dict[str, Any]:
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", "".join(json.dumps(x) + "\n" for x in lines).encode(),
                   filename="in.jsonl")
    async with session.post(f"{base}/files", data=form) as r:
        assert r.status == 200, await r.text()
        fid = (await r.json())["id"]
    async with session.post(f"{base}/batches", json={
            "input_file_id": fid, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}) as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


async def until_ended(session: aiohttp.ClientSession, base: str, bid: str) -> tuple[
        dict[str, Any], list[str]]:
    seen: list[str] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        async with session.get(f"{base}/batches/{bid}") as r:
            b = await r.json()
        if not seen or seen[-1] != b["status"]:
            seen.append(b["status"])
        if b["status"] in ("completed", "failed", "expired", "cancelled"):
            return b, seen
        await asyncio.sleep(0.01)
    raise AssertionError(f"batch {bid} did not end: {seen}")


def run(fake: FakeOpenRouter, key: str, body: Any) -> Any:
    async def main() -> Any:
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            return await body(session, fake.base_url)
    return asyncio.run(main())


def test_states_validation_cancel_and_the_key() -> None:
    key = make_key()
    fake = FakeOpenRouter(api_key=key, batches=BatchPlan(run_s=0.05, line_s=0.05,
                                                         finalize_s=0.1))
    fake.start_in_thread()
    try:
        async def body(session: aiohttp.ClientSession, base: str) -> None:
            b = await submit(session, base, [line("a"), line("b")])
            assert b["status"] == "validating" and b["request_counts"]["total"] == 0
            done, seen = await until_ended(session, base, b["id"])
            assert seen[0] == "validating" and "in_progress" in seen
            assert seen[-2:] == ["finalizing", "completed"]
            assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
            async with session.get(f"{base}/files/{done['output_file_id']}/content") as r:
                out = [json.loads(x) for x in (await r.read()).splitlines()]
            assert sorted(x["custom_id"] for x in out) == ["a", "b"]
            assert all(x["response"]["status_code"] == 200 for x in out)
            assert out[0]["response"]["body"]["usage"]["cost"] == fake.cost_per_request / 2
            # A duplicate custom_id, a second model, a wrong url: the batch fails validation.
            bad = await submit(session, base, [line("a"), line("a"), line("c", model="n"),
                                               line("d", url="/v1/embeddings")])
            failed, _ = await until_ended(session, base, bad["id"])
            codes = sorted(e["code"] for e in failed["errors"]["data"])
            assert failed["status"] == "failed" and codes == [
                "duplicate_custom_id", "invalid_request", "mismatched_model"]
            # Cancelled mid-run: the lines not run are `batch_cancelled` in the error file.
            fake.batches.plan.line_s = 0.5
            slow = await submit(session, base, [line(str(i)) for i in range(6)])
            await asyncio.sleep(0.3)
            async with session.post(f"{base}/batches/{slow['id']}/cancel") as r:
                assert (await r.json())["status"] == "cancelling"
            cancelled, _ = await until_ended(session, base, slow["id"])
            assert cancelled["status"] == "cancelled"
            async with session.get(f"{base}/files/{cancelled['error_file_id']}/content") as r:
                errs = [json.loads(x) for x in (await r.read()).splitlines()]
            assert errs and {e["error"]["code"] for e in errs} == {"batch_cancelled"}
            assert len(errs) + cancelled["request_counts"]["completed"] == 6
            async with session.post(f"{base}/batches/{slow['id']}/cancel") as r:
                assert r.status == 400  # ended: nothing to cancel
            async with session.get(f"{base}/batches", params={"limit": "2"}) as r:
                page = await r.json()
            assert [x["id"] for x in page["data"]] == [slow["id"], bad["id"]] and page["has_more"]
            async with session.get(f"{base}/batches", headers={"Authorization": "Bearer x"}) as r:
                assert r.status == 401
        run(fake, key, body)
        assert fake.batches.stats.created == 3 and fake.batches.stats.cancels == 1
    finally:
        fake.stop_thread()


def test_a_server_without_the_batch_api() -> None:
    key = make_key()
    fake = FakeOpenRouter(api_key=key, batches=BatchPlan(enabled=False))
    fake.start_in_thread()
    try:
        async def body(session: aiohttp.ClientSession, base: str) -> list[int]:
            statuses = []
            for method, path in (("GET", "/batches"), ("POST", "/files"), ("POST", "/batches")):
                async with session.request(method, base + path) as r:
                    statuses.append(r.status)
            return statuses
        assert run(fake, key, body) == [404, 404, 404]
    finally:
        fake.stop_thread()
