"""A real headless Chromium for tests (Debian's `chromium`, installed by scripts/bootstrap),
driven over the DevTools protocol with aiohttp's websocket client.

`Chromium` starts one browser (its own process group, a throwaway profile) and keeps it
off the network: every host name resolves to nothing but 127.0.0.1, and a proxy that does
not exist stands in front of everything else. `open(url)` loads a page in the one tab and
waits for its load event; what the page did wrong is collected as it happens: uncaught
exceptions, console errors, failed loads, and every request the page made besides its own
document (`requests`), so a test can assert that a report reached nothing.

    with Chromium(tmp_path) as browser:
        browser.open(path.as_uri())
        assert browser.errors == []
        browser.screenshot(tmp_path / "shot.png")
        browser.evaluate("document.title")

`python -m tests.support.browser PAGE OUT.png [--height H]` takes one screenshot of a page
(its top H pixels; how docs/report.png was made from `fab demo`'s report).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CLOSED_PORT = 9  # discard: nothing listens there on loopback


class BrowserError(RuntimeError):
    pass


class Chromium:
    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        if CHROMIUM is None:
            raise BrowserError("no chromium on PATH (scripts/bootstrap installs Debian's package)")
        self.profile = profile
        self.size = (width, height)
        self.errors: list[str] = []
        self.requests: list[str] = []  # every URL the page asked for, its document included
        self._id = 0
        self._loop = asyncio.new_event_loop()
        self._proc: subprocess.Popen[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._events: list[dict[str, Any]] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> Chromium:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self.profile.mkdir(parents=True, exist_ok=True)
        args = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}", "--no-first-run", "--no-default-browser-check",
                f"--proxy-server=http://127.0.0.1:{CLOSED_PORT}",
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-extensions", "--disable-default-apps",
                "--metrics-recording-only", "--mute-audio", "--hide-scrollbars",
                f"--window-size={self.size[0]},{self.size[1]}", "about:blank"]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not active.exists() or len(active.read_text().splitlines()) < 2:
            if self._proc.poll() is not None:
                raise BrowserError(f"chromium exited at start (code {self._proc.returncode})")
            if time.monotonic() > deadline:
                raise BrowserError("chromium did not open its DevTools port within 60 s")
            time.sleep(0.05)
        port = int(active.read_text().splitlines()[0])
        self._loop.run_until_complete(self._connect(port))
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=self.size[0], height=self.size[1],
                  deviceScaleFactor=1, mobile=False)

    async def _connect(self, port: int) -> None:
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next(t for t in targets if t.get("type") == "page")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"],
                                                  max_msg_size=256 << 20)

    def close(self) -> None:
        async def shut() -> None:
            if self._ws is not None:
                await self._ws.close()
            if self._session is not None:
                await self._session.close()

        try:
            self._loop.run_until_complete(shut())
        finally:
            self._loop.close()
            if self._proc is not None and self._proc.poll() is None:
                try:
                    os.killpg(self._proc.pid, signal.SIGTERM)
                    self._proc.wait(timeout=10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                    self._proc.wait(timeout=10)

    # -- the protocol ---------------------------------------------------------------------------
    def send(self, method: str, timeout: float = 60, **params: Any) -> dict[str, Any]:
        return self._loop.run_until_complete(self._call(method, params, timeout))

    async def _call(self, method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self._ws is not None
        self._id += 1
        me = self._id
        await self._ws.send_str(json.dumps({"id": me, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = await self._ws.receive(timeout=max(0.1, deadline - time.monotonic()))
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise BrowserError(f"DevTools connection closed ({msg.type})")
            data = json.loads(msg.data)
            if data.get("id") == me:
                if "error" in data:
                    raise BrowserError(f"{method}: {data['error']}")
                return data.get("result", {})
            self._event(data)

    def _event(self, data: dict[str, Any]) -> None:
        method, p = data.get("method"), data.get("params", {})
        self._events.append(data)
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.errors.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                            for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            self.errors.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}")
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            self.errors.append(f"load failed: {p.get('errorText')}")
        elif method == "Network.requestWillBeSent":
            self.requests.append(p.get("request", {}).get("url", ""))

    def _wait_event(self, method: str, timeout: float) -> None:
        async def wait() -> None:
            assert self._ws is not None
            deadline = time.monotonic() + timeout
            while True:
                msg = await self._ws.receive(timeout=max(0.1, deadline - time.monotonic()))
                if msg.type != aiohttp.WSMsgType.TEXT:
                    raise BrowserError(f"DevTools connection closed ({msg.type})")
                data = json.loads(msg.data)
                self._event(data)
                if data.get("method") == method:
                    return

        self._loop.run_until_complete(wait())

    # -- what tests use -------------------------------------------------------------------------
    def open(self, url: str, timeout: float = 60) -> None:
        """Load `url` and wait for its load event (then a moment for late errors)."""
        self.requests.clear()
        result = self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url}: {result['errorText']}")
        self._wait_event("Page.loadEventFired", timeout)
        self.evaluate("new Promise(r => setTimeout(r, 100))", await_promise=True)

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=await_promise)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = self.evaluate("Math.ceil(document.documentElement.scrollHeight)")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": self.size[0], "height": height, "scale": 1})
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="a screenshot of a page in headless Chromium")
    ap.add_argument("page", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--height", type=int, default=1400, help="pixels from the top (default 1400)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="handoff-shot-") as tmp, \
            Chromium(Path(tmp), height=args.height) as browser:
        browser.open(args.page.resolve().as_uri())
        if browser.errors:
            print("\n".join(browser.errors))
            return 1
        browser.screenshot(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
