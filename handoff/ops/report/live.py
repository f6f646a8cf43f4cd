"""`fab report --watch`: the report's pages served live on 127.0.0.1, from the hosts.

Every refresh reads each host in ONE round trip (as `fab status --wait`): the jobs'
state, status.json and job.json, and the lines each job's metrics.jsonl gained since the
last refresh (handoff.host.remote_code.jobs `list` with `metrics`); the sessions stay open
between refreshes. The pages are then rebuilt from that (handoff.ops.report.build.render,
`live=True`: counts from the status files, plots from the metrics) and served by a
threaded HTTP server bound to 127.0.0.1 only; a page reloads itself every `interval`
seconds. A host that cannot be read keeps its last figures and shows as `unreachable`.

The server answers only GET of `/` (the run), `/<job>/` and `/<job>/report.html`, and
only to a Host header naming 127.0.0.1 or localhost with its port (a web page elsewhere
cannot read the report through a DNS name rebound to 127.0.0.1).
"""

from __future__ import annotations

import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from handoff.host import remote_code, untrusted
from handoff.host.session import Connector, Session
from handoff.host.targets import Target
from handoff.ops.jobs.state import JobState, job_name
from handoff.ops.report import build, runs
from handoff.ops.report.runs import HostCopy
from handoff.ops.report.series import Series
from handoff.run.parallel import HostReport, run_parallel

MAX_TEXT = 4 << 20  # one job's metrics text in one answer (the host sends at most 2 MB)


@dataclass
class Known:
    """What the workstation knows of one host's job between refreshes."""

    copy: HostCopy
    series: Series = field(default_factory=Series)
    offset: int | None = None  # where the next metrics read starts


class Live:
    """The hosts read, and the pages rebuilt, at each `refresh`."""

    def __init__(self, targets: list[Target], job_flag: str | None, connect: Connector,
                 interval: float, sample_size: int = 200) -> None:
        self.targets = targets
        self.job_flag = job_flag
        self.connect = connect
        self.interval = interval
        self.sample_size = sample_size
        self.sessions: dict[str, Session] = {}
        self.known: dict[tuple[str, str], Known] = {}
        self.errors: dict[str, str] = {}  # host -> why it could not be read this time
        self.pages: dict[str, bytes] = {}
        self.refreshed = 0
        self.lock = threading.Lock()

    # -- reading the hosts ---------------------------------------------------------------------
    def _read(self, target: Target, offsets: dict[str, int | None], answers: dict[str, Any],
              report: HostReport) -> None:
        label = target.label
        try:
            s = self.sessions.get(label)
            if s is None or not s.connected:
                s = self.connect(target)
                s.connect()
                self.sessions[label] = s
            answers[label] = s.run_code(remote_code.JOBS, {
                "op": "list", "jobs_dir": target.layout.jobs, "metrics": offsets},
                "reading the jobs")
        except Exception:  # a host that cannot be read keeps its last figures
            old = self.sessions.pop(label, None)
            if old is not None:
                old.close()
            raise

    def _take(self, label: str, raw: Any, only: str | None) -> None:
        jobs = raw.get("jobs") if isinstance(raw, dict) else None
        for name, one in (jobs if isinstance(jobs, dict) else {}).items():
            if untrusted.name_problem(name) or (only is not None and name != only):
                continue
            state = JobState.from_json(one)
            k = self.known.get((label, name))
            if k is None:
                k = self.known[(label, name)] = Known(HostCopy(label, None))
            k.copy.status, k.copy.meta = state.status or {}, state.meta or {}
            k.copy.problems = list(state.problems)
            k.copy.state = state.state
            metrics = one.get("metrics") if isinstance(one, dict) else None
            if isinstance(metrics, dict):
                text, end = metrics.get("text"), untrusted.count(metrics.get("to"))
                start = untrusted.count(metrics.get("from"))
                if isinstance(text, str) and len(text) <= MAX_TEXT and end is not None:
                    if k.offset is not None and start != k.offset:
                        k.series = Series()  # the host's file was replaced, or we fell behind
                    k.series.add_text(text.encode("utf-8"))
                    k.offset = end
            k.copy.series = k.series

    def refresh(self) -> None:
        """Read every host once (in parallel), then rebuild the pages."""
        answers: dict[str, Any] = {}
        offsets = {t.label: {job: k.offset for (host, job), k in self.known.items()
                             if host == t.label} for t in self.targets}

        def one(target: Target, report: HostReport) -> None:
            self._read(target, offsets[target.label], answers, report)

        reports = run_parallel(self.targets, one, title="report", grouped=False, summary=False)
        for t, rep in zip(self.targets, reports, strict=False):
            if t.label in answers:
                self.errors.pop(t.label, None)
                self._take(t.label, answers[t.label],
                           job_name(t, self.job_flag) if self.job_flag else None)
                continue
            self.errors[t.label] = untrusted.visible(rep.error or "not read", 300)
            for (host, _), k in self.known.items():
                if host == t.label:
                    k.copy.state = "unreachable"
        by_job: dict[str, list[HostCopy]] = {}
        for (_, job), k in sorted(self.known.items()):
            by_job.setdefault(job, []).append(k.copy)
        jobs = [runs.live(job, copies) for job, copies in sorted(by_job.items())]
        pages, _, _ = build.render(jobs, sample_size=self.sample_size, live_every=self.interval)
        with self.lock:
            self.pages = {("/" if key == "" else f"/{urllib.parse.quote(key)}/"): html.encode()
                          for key, html in pages.items()}
            if not jobs:
                self.pages["/"] = _empty(self.targets, self.errors, self.interval)
            self.refreshed += 1

    def page(self, path: str) -> bytes | None:
        path = urllib.parse.urlsplit(path).path
        if path.endswith("/" + build.REPORT):
            path = path[:-len(build.REPORT)]
        if path == "/" + build.REPORT:
            path = "/"
        with self.lock:
            return self.pages.get(path if path.endswith("/") else path + "/")

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()


def _empty(targets: list[Target], errors: dict[str, str], interval: float) -> bytes:
    from handoff.ops.report import page

    rows = "".join(f"<li>{page.e(t.label)}: {page.e(errors.get(t.label, 'no job yet'))}</li>"
                   for t in targets)
    return page.document("handoff report: the run", "live from the hosts", f"<ul>{rows}</ul>",
                         {"jobs": [], "samples": 0}, interval).encode()


class _Handler(BaseHTTPRequestHandler):
    live: Live
    allowed: set[str]

    def do_GET(self) -> None:
        if self.headers.get("Host", "") not in self.allowed:
            self._send(403, b"forbidden: this server answers requests to 127.0.0.1 only\n",
                       "text/plain")
            return
        body = self.live.page(self.path)
        if body is None:
            self._send(404, b"not found\n", "text/plain")
        else:
            self._send(200, body, "text/html; charset=utf-8")

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the terminal shows the refreshes, not every request


def serve(live: Live, port: int = 0) -> ThreadingHTTPServer:
    """A server for `live`'s pages on 127.0.0.1:`port` (0: a free one), started in a thread."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    bound = server.server_address[1]
    handler = type("Handler", (_Handler,), {"live": live, "allowed": {
        f"127.0.0.1:{bound}", f"localhost:{bound}"}})
    server.RequestHandlerClass = handler
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="report-server", daemon=True).start()
    return server


def run(live: Live, server: ThreadingHTTPServer, say: Any, stop: threading.Event) -> None:
    """Refresh every `interval` seconds until `stop` is set (Ctrl-C)."""
    while not stop.wait(live.interval):
        live.refresh()
        if live.errors:
            say("; ".join(f"{h}: unreachable ({untrusted.visible(e, 200)})"
                          for h, e in sorted(live.errors.items())))
