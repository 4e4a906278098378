"""A real headless Chromium driven over the DevTools protocol, for the web console's tests.

No WebDriver and no Python browser package: Chromium is started with
``--remote-debugging-pipe``, which speaks the DevTools protocol as JSON
messages ended by a NUL byte on file descriptors 3 (commands in) and 4
(replies and events out). Debian's ``chromium`` package is the browser
(``make setup`` installs it when absent, as it does Java).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Browser", "chromium_path"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One headless Chromium with one page (tab); ``close()`` ends it."""

    def __init__(self, profile_dir: Path, width: int = 1400, height: int = 900) -> None:
        binary = chromium_path()
        if binary is None:
            raise RuntimeError("no chromium on PATH: run `make setup` (installs Debian's "
                               "chromium package) or apt-get install chromium")
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        args = [binary, "--headless=new", "--remote-debugging-pipe", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-dev-shm-usage",
                "--hide-scrollbars", "--mute-audio", f"--user-data-dir={profile_dir}",
                f"--window-size={width},{height}", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        # A small Python shim puts our pipe ends on descriptors 3 and 4, then becomes
        # Chromium (a shell cannot: dash redirects only descriptors 0-9).
        shim = ("import os, sys; r, w = [os.dup(int(a)) for a in sys.argv[1:3]]; "
                "os.dup2(r, 3); os.dup2(w, 4); os.set_inheritable(3, True); "
                "os.set_inheritable(4, True); os.execv(sys.argv[3], sys.argv[3:])")
        self.log_path = profile_dir.parent / f"{profile_dir.name}-chromium.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", shim, str(to_browser_r), str(from_browser_w), *args],
                pass_fds=(to_browser_r, from_browser_w), stdout=subprocess.DEVNULL, stderr=log)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._out = os.fdopen(to_browser_w, "wb", buffering=0)
        self._in = os.fdopen(from_browser_r, "rb", buffering=0)
        self._next_id = 0
        self._lock = threading.Lock()
        self._replies: dict[int, dict[str, Any]] = {}
        self._arrived = threading.Condition(self._lock)
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=True)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                  session=True)

    # ------------------------------------------------------------ protocol

    def _read(self) -> None:
        buffer = b""
        while True:
            chunk = self._in.read(65536)
            if not chunk:
                with self._arrived:
                    self._arrived.notify_all()
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                with self._arrived:
                    if "id" in message:
                        self._replies[message["id"]] = message
                    else:
                        self.events.append(message)
                    self._arrived.notify_all()

    def send(self, method: str, params: dict[str, Any] | None = None, *,
             session: bool = False, timeout: float = 30.0) -> dict[str, Any]:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        self._out.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._arrived:
            while ident not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise TimeoutError(f"no reply to {method} from chromium")
                self._arrived.wait(left)
            reply = self._replies.pop(ident)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    # ------------------------------------------------------------ page

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", {"url": url}, session=True)

    def wait_for(self, expression: str, what: str, timeout: float = 20.0) -> Any:
        """Poll a JavaScript expression until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        value: Any = None
        while time.monotonic() < deadline:
            try:  # an element counts as found (it would come back as {})
                value = self.evaluate(f"(v => v instanceof Node ? true : v)({expression})")
            except RuntimeError:  # the page is navigating
                value = None
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"{what}: {expression} stayed {value!r}; page text:\n"
                             + str(self.evaluate("document.body && document.body.innerText")))

    def until(self, check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(what)
            time.sleep(0.1)

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                         session=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def errors(self) -> list[str]:
        """JavaScript exceptions and console/log errors (CSP violations among them) so far."""
        found = []
        with self._lock:
            events = list(self.events)
        for event in events:
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                found.append(str(params.get("exceptionDetails")))
            elif event.get("method") == "Log.entryAdded" and (
                    params.get("entry", {}).get("level") == "error"):
                entry = params["entry"]
                if entry.get("source") == "network" and "401" in entry.get("text", ""):
                    continue  # the console's token check answers 401 on purpose
                found.append(entry.get("text", ""))
            elif event.get("method") == "Runtime.consoleAPICalled" and (
                    params.get("type") == "error"):
                found.append(str(params.get("args")))
        return found

    def requested_urls(self) -> list[str]:
        with self._lock:
            return [e["params"]["request"]["url"] for e in self.events
                    if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        with contextlib.suppress(TimeoutError, RuntimeError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()
        self._in.close()
