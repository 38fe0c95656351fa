"""Headless Chromium (Debian's ``chromium``) driven through the Chrome DevTools Protocol over
``--remote-debugging-pipe``: NUL-terminated JSON messages on the child's fds 3 (in) and 4 (out),
so browser tests need no driver, no WebSocket client and no network.

Only what the browser tests use: open a page, evaluate JavaScript, click at an element's
position with real input events, take a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # tests run as root here
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    # no connections out: the machine's network is closed
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
    "--window-size=1000,900",
)


def chromium_path() -> str | None:
    """The Chromium binary (``$CHROMIUM``, else ``chromium`` on PATH), or None."""
    return os.environ.get("CHROMIUM") or shutil.which("chromium")


class CdpError(RuntimeError):
    """A DevTools command failed, or the browser went away."""


class Browser:
    """One Chromium process and one page of it."""

    def __init__(self, binary: str, user_data_dir: Path) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def child_fds() -> None:
            # The protocol's fixed descriptors. Copies first: either end may itself be 3 or 4.
            # (close_fds must stay off: subprocess would close 3 and 4 after this runs; the
            # parent's other descriptors are non-inheritable anyway.)
            inbound, outbound = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(inbound, 3)
            os.dup2(outbound, 4)

        self._process = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={user_data_dir}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=child_fds,
            close_fds=False,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.session = ""
        targets = self.call("Target.getTargets")["targetInfos"]
        pages = [t["targetId"] for t in targets if t["type"] == "page"]
        target = pages[0] if pages else self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")

    # --- protocol ------------------------------------------------------------------------------
    def _read_message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            data = os.read(self._from_child, 1 << 16)
            if not data:
                raise CdpError(f"chromium closed the DevTools pipe (exit code {self._process.poll()})")
            self._buffer += data
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command (to the page's session once attached) and return its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:  # events arrive in between; nothing here needs them
            reply = self._read_message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                return reply["result"]

    # --- page helpers --------------------------------------------------------------------------
    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited; JSON values)."""
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise CdpError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """Poll until ``expression`` is truthy; its value. CdpError naming ``what`` on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise CdpError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def open(self, url: str, timeout: float = 20.0) -> None:
        """Navigate and wait until the document has loaded."""
        self.call("Page.navigate", url=url)
        self.wait_for(
            f"location.href.startsWith({json.dumps(url.rstrip('/'))}) && document.readyState === 'complete'",
            timeout,
            f"{url} to load",
        )

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the centre of the element: a user gesture,
        as far as the page can tell."""
        box = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            " return {x: r.x + r.width / 2, y: r.y + r.height / 2}; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"], button="left", clickCount=1
            )

    def screenshot(self, path: Path) -> Path:
        """A PNG of the page at ``path``."""
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (CdpError, OSError):
            pass
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._to_child)
        os.close(self._from_child)


@contextmanager
def chromium(binary: str) -> Iterator[Browser]:
    """A headless browser with a fresh profile, closed on exit."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        browser = Browser(binary, Path(profile))
        try:
            yield browser
        finally:
            browser.close()


__all__ = ["Browser", "CdpError", "chromium", "chromium_path"]
