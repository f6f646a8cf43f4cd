"""`fab report --watch` on fake hosts (handoff.testing.local: a folder stands for each host):
one round trip a host per refresh bringing the metrics lines since the last, the pages
rebuilt, a host that cannot be read kept as unreachable, and the server on 127.0.0.1 that
answers only requests naming it. The same against real sshd and a real browser:
tests/integration/test_report.py."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

from handoff.host.remote_code.jobs import metrics_since
from handoff.ops.report import live as serving
from handoff.testing.local import LocalSession
from tests.support.workstation import Workstation


def job_dir(ws: Workstation, host: str, job: str = "B3") -> Path:
    d = ws.remote_dir(host) / "jobs" / job
    d.mkdir(parents=True, exist_ok=True)
    return d


def put(d: Path, done: int, state: str = "finished", lines: int = 0, start: float = 1000.0) -> None:
    (d / "status.json").write_text(json.dumps({"state": state, "done": done, "failed": 0,
                                               "total": 100, "cost": done * 0.01}))
    (d / "job.json").write_text(json.dumps({"job": d.name, "role": "generator", "shard": "0/1"}))
    with (d / "metrics.jsonl").open("a") as fh:
        for i in range(lines):
            fh.write(json.dumps({"t": start + i, "done": i, "in_flight": 4, "window": 8}) + "\n")


def summary(html: bytes) -> dict:
    text = html.decode()
    return json.loads(text.split('id="handoff-summary">', 1)[1].split("</script>", 1)[0])


def test_metrics_since_reads_whole_lines_from_an_offset(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"t": 1}\n{"t": 2}\n{"t": 3, "torn')
    first = metrics_since(str(tmp_path), None, 1 << 20)
    assert first == {"from": 0, "to": 18, "text": '{"t": 1}\n{"t": 2}\n'}
    with path.open("ab") as fh:
        fh.write(b'}\n{"t": 4}\n')
    again = metrics_since(str(tmp_path), 18, 1 << 20)
    assert again is not None and again["text"] == '{"t": 3, "torn}\n{"t": 4}\n'
    # behind by more than the budget (or a first read of a big file): its end, from a line start
    tail = metrics_since(str(tmp_path), 0, 12)
    assert tail is not None and tail["text"] == '{"t": 4}\n' and tail["to"] == path.stat().st_size
    assert metrics_since(str(tmp_path / "none"), None, 100) is None


def test_each_refresh_reads_each_host_once_and_only_what_is_new(ws: Workstation, monkeypatch) -> None:
    calls: list[str] = []
    real = LocalSession.run_code

    def counted(self, module, args, what, **kw):  # type: ignore[no-untyped-def]
        calls.append(f"{self.target.label}:{args.get('op')}:{sorted((args.get('metrics') or {}).items())}")
        return real(self, module, args, what, **kw)

    monkeypatch.setattr(LocalSession, "run_code", counted)
    a, b = job_dir(ws, "a"), job_dir(ws, "b")
    put(a, 10, "running", lines=3)
    put(b, 20, "running", lines=2)
    live = serving.Live(ws.targets("a,b"), None, ws.connect, interval=1.0)
    try:
        live.refresh()
        assert sorted(calls) == ["a:list:[]", "b:list:[]"]
        got = summary(live.page("/B3/") or b"")
        assert got["samples"] == 30 and got["source"] == "live status"
        assert got["states"] == {"a": "dead", "b": "dead"}  # "running" with no process: dead
        sizes = {h: (d / "metrics.jsonl").stat().st_size for h, d in (("a", a), ("b", b))}
        put(a, 15, "running", lines=2, start=2000.0)
        calls.clear()
        live.refresh()
        assert sorted(calls) == [f"a:list:[('B3', {sizes['a']})]", f"b:list:[('B3', {sizes['b']})]"]
        assert len(live.known[("a", "B3")].series.points) == 5
        assert summary(live.page("/B3/report.html") or b"")["samples"] == 35
        assert summary(live.page("/") or b"")["samples"] == 35  # the run's page
        # a host that cannot be read keeps its figures and shows as unreachable
        monkeypatch.setattr(ws, "connect", lambda target: (_ for _ in ()).throw(
            ConnectionRefusedError("refused")))
        live.connect = ws.connect
        live.sessions.clear()
        live.refresh()
        got = summary(live.page("/B3/") or b"")
        assert got["states"] == {"a": "unreachable", "b": "unreachable"} and got["samples"] == 35
        assert set(live.errors) == {"a", "b"}
    finally:
        live.close()


def test_the_server_answers_only_requests_to_127_0_0_1(ws: Workstation) -> None:
    put(job_dir(ws, "a"), 5, lines=2)
    live = serving.Live(ws.targets("a"), None, ws.connect, interval=1.0)
    live.refresh()
    server = serving.serve(live)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"

        def get(path: str, name: str | None = None) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.putrequest("GET", path, skip_host=True)
            conn.putheader("Host", name or f"127.0.0.1:{port}")
            conn.endheaders()
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            return resp.status, body

        status, body = get("/")
        assert status == 200 and b"handoff report: the run" in body
        assert b'name="handoff-live"' in body  # it reloads itself
        assert get("/B3/")[0] == 200 and get(f"/B3/report.html?t={time.time()}")[0] == 200
        assert get("/nope/")[0] == 404
        assert get("/", f"localhost:{port}")[0] == 200
        assert get("/", f"evil.example:{port}")[0] == 403  # a DNS name rebound to 127.0.0.1
    finally:
        server.shutdown()
        server.server_close()
        live.close()
