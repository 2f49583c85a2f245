"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``):
open a page, evaluate JavaScript in it, take a screenshot, and record every network request.

No websocket library is needed: Chromium reads commands from fd 3 and writes
replies and events to fd 4, one JSON message per NUL-terminated chunk.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--remote-debugging-pipe"]


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium with one page. Use as a context manager."""

    def __init__(self, binary: str, *, width: int = 1280, height: int = 900, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="lakestep-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()

        def fds() -> None:  # in the child: commands on fd 3, replies on fd 4
            a, b = os.dup(cmd_r), os.dup(out_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self._log = open(os.path.join(self.profile, "chromium.log"), "wb")  # a pipe could fill and block it
        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                     preexec_fn=fds, close_fds=False)
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    # ------------------------------------------------------------- protocol
    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                with open(self._log.name, "rb") as f:
                    err = f.read().decode(errors="replace")
                raise RuntimeError(f"chromium closed the pipe: {err[-2000:]}")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, *, session: bool = False, **params: Any) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_for(self, event: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        for i, m in enumerate(self.events):
            if m.get("method") == event:
                return self.events.pop(i)
        while True:
            m = self._read(deadline)
            if m.get("method") == event:
                return m
            self.events.append(m)

    # ---------------------------------------------------------------- pages
    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:80]}...: {r['exceptionDetails']}")
        return r["result"].get("value")

    def requests(self) -> list[str]:
        """The URLs the page requested since it was opened."""
        return [m["params"]["request"]["url"] for m in self.events if m.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: str) -> tuple[int, int]:
        """A PNG of the whole page; returns its (width, height) in CSS pixels."""
        size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        w, h = int(size["width"]), int(size["height"])
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=w, height=h, deviceScaleFactor=1,
                  mobile=False)
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return w, h

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
