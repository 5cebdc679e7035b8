"""Open report pages in headless Chromium and look at them as a reviewer's browser would.

A small client of the Chrome DevTools Protocol over ``--remote-debugging-pipe``: the browser reads
commands from its file descriptor 3 and writes replies and events to descriptor 4, each message one JSON
object followed by a NUL byte. A pipe needs no port (nothing to race for, nothing listening on the
machine) and no websocket library, and the browser exits when the pipe closes.

    with Chromium() as browser:
        page = browser.open(Path("reports/index.html"))
        page.evaluate("document.title")
        page.problems()          # console errors, uncaught exceptions, requests other than the file itself
        page.screenshot(Path("docs/report-index.png"))

Used by the browser test and by ``python -m harness.report.screenshots``.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
    "--no-default-browser-check", "--disable-features=Translate,MediaRouter,OptimizationHints",
)


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str | None:
    """The Chromium (or Chrome) executable: ``$CHROMIUM`` if set, else the first on ``PATH``."""
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() or shutil.which(explicit) else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class _Session:
    events: list[dict[str, Any]] = field(default_factory=list)


class Chromium:
    """One headless browser process; ``open`` a page per file."""

    def __init__(self, executable: str | None = None, *, width: int = 1400, height: int = 900,
                 timeout: float = 30.0) -> None:
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise BrowserError("no chromium on PATH (set $CHROMIUM to its path)")
        self.width, self.height, self.timeout = width, height, timeout
        self._next_id = 0
        self._inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._sessions: dict[str, _Session] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self._pid: int | None = None
        self._to_browser: int | None = None
        self._from_browser: int | None = None
        self._profile: tempfile.TemporaryDirectory | None = None

    # ---- process ------------------------------------------------------------------------------------
    def __enter__(self) -> Chromium:
        self._profile = tempfile.TemporaryDirectory(prefix="harness-chromium-")
        executable = shutil.which(self.executable) or self.executable
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # Move the browser's ends above 10 so that putting them at 3 and 4 in the child cannot clobber one
        # with the other; the originals close here, the copies close on exec (they are not inheritable).
        theirs = []
        for fd in (to_browser_r, from_browser_w):
            theirs.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
            os.close(fd)
        self._to_browser, self._from_browser = to_browser_w, from_browser_r
        self._stderr = Path(self._profile.name) / "stderr.log"
        args = [executable, *FLAGS, f"--user-data-dir={self._profile.name}", "--remote-debugging-pipe", "about:blank"]
        try:
            self._pid = os.posix_spawn(executable, args, os.environ, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, str(self._stderr), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                (os.POSIX_SPAWN_DUP2, theirs[0], 3),
                (os.POSIX_SPAWN_DUP2, theirs[1], 4),
            ])
        finally:
            for fd in theirs:
                os.close(fd)
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.call("Browser.getVersion")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._pid is not None:
            try:
                self._send({"id": self._new_id(), "method": "Browser.close"})
            except OSError:
                pass
            deadline = time.monotonic() + 5
            while os.waitpid(self._pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(self._pid, signal.SIGKILL)
                    os.waitpid(self._pid, 0)
                    break
                time.sleep(0.02)
            self._pid = None
        for fd in (self._to_browser, self._from_browser):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to_browser = self._from_browser = None
        if self._profile is not None:
            self._profile.cleanup()
            self._profile = None

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except (OSError, TypeError):
                break
            if not chunk:
                break
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                self._inbox.put(json.loads(raw))
        self._inbox.put(None)

    def _last_words(self) -> str:
        try:
            lines = self._stderr.read_text(errors="replace").splitlines()
        except OSError:
            return "(no stderr)"
        return " | ".join(line for line in lines if "dbus" not in line)[-1500:] or "(nothing)"

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._to_browser, data):]

    def _dispatch(self, deadline: float) -> None:
        try:
            message = self._inbox.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            return
        if message is None:
            self._inbox.put(None)  # stays closed for every later call
            raise BrowserError(f"chromium closed the DevTools pipe; its last words: {self._last_words()}")
        if "id" in message:
            self._replies[message["id"]] = message
        elif message.get("sessionId") in self._sessions:
            self._sessions[message["sessionId"]].events.append(message)

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None) -> dict[str, Any]:
        """Send one command and wait for its reply's ``result``."""
        ident = self._new_id()
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            self._send(message)
        except OSError as exc:
            raise BrowserError(f"{method}: chromium is gone ({exc}); its last words: {self._last_words()}") from None
        deadline = time.monotonic() + self.timeout
        while ident not in self._replies:
            if time.monotonic() > deadline:
                raise BrowserError(f"{method}: no reply within {self.timeout:.0f}s")
            self._dispatch(deadline)
        reply = self._replies.pop(ident)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def wait_for(self, session: str, method: str, start: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            for event in self._sessions[session].events[start:]:
                if event.get("method") == method:
                    return event
            if time.monotonic() > deadline:
                raise BrowserError(f"no {method} within {self.timeout:.0f}s")
            self._dispatch(deadline)

    # ---- pages --------------------------------------------------------------------------------------
    def open(self, path: Path, *, fragment: str = "") -> Page:
        """Load a local file in a fresh tab and wait for its load event."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._sessions[session] = _Session()
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=session)
        self.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session=session)
        url = Path(path).resolve().as_uri() + (f"#{fragment}" if fragment else "")
        mark = len(self._sessions[session].events)
        reply = self.call("Page.navigate", {"url": url}, session=session)
        if reply.get("errorText"):
            raise BrowserError(f"{url}: {reply['errorText']}")
        self.wait_for(session, "Page.loadEventFired", mark)
        return Page(self, session, target, url)


class Page:
    def __init__(self, browser: Chromium, session: str, target: str, url: str) -> None:
        self.browser, self.session, self.target, self.url = browser, session, target, url

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serializable values only)."""
        result = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, session=self.session)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression[:80]}: {details.get('exception', {}).get('description') or details.get('text')}")
        return result["result"].get("value")

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.browser._sessions[self.session].events

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions, failed loads and every request but the page itself."""
        page_file = self.url.split("#", 1)[0]
        out = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(f"exception: {params['exceptionDetails'].get('text')} "
                           f"{params['exceptionDetails'].get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
                out.append(f"console.{params['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                    for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
                out.append(f"log {params['entry']['level']}: {params['entry'].get('text')}")
            elif method == "Network.requestWillBeSent":
                url = params["request"]["url"]
                if url.split("#", 1)[0] != page_file and not url.startswith("data:"):
                    out.append(f"request: {url}")
            elif method == "Network.loadingFailed":
                out.append(f"load failed: {params.get('errorText')}")
        return out

    def screenshot(self, path: Path, *, full_page: bool = True, max_height: int = 4000,
                   clip: dict[str, float] | None = None) -> Path:
        """A PNG of the page (its whole height up to ``max_height``, or ``clip``: x, y, width, height in CSS px)."""
        call = self.browser.call
        if clip is None and full_page:
            size = call("Page.getLayoutMetrics", session=self.session)["cssContentSize"]
            height = min(int(size["height"]) + 1, max_height)
            clip = {"x": 0, "y": 0, "width": self.browser.width, "height": height}
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if clip is not None:
            params["clip"] = {**clip, "scale": 1}
        data = call("Page.captureScreenshot", params, session=self.session)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        self.browser.call("Target.closeTarget", {"targetId": self.target})
