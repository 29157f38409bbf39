"""Open a report in headless Chromium, offline, and say what a reader would see.

No driver package: Chromium speaks the DevTools protocol over two pipes
(``--remote-debugging-pipe``: it reads commands on fd 3 and writes replies on fd 4,
NUL-terminated JSON). That is enough to load a file, collect console errors, failed and
attempted network requests, measure whether an element is really visible (laid out,
not hidden, on top at its centre) and take a screenshot.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")

OFFLINE_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio",
    "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
)

_VISIBILITY_JS = """
(() => {
  const el = document.getElementById(%s);
  if (!el) return {found: false};
  if (%s) el.scrollIntoView({block: "center", inline: "nearest"});
  const r = el.getBoundingClientRect();
  const s = getComputedStyle(el);
  const cx = Math.min(Math.max(r.left + Math.min(r.width, 40) / 2, 0), innerWidth - 1);
  const cy = Math.min(Math.max(r.top + Math.min(r.height, 40) / 2, 0), innerHeight - 1);
  const top = document.elementFromPoint(cx, cy);
  return {found: true, left: r.left, top: r.top, width: r.width, height: r.height,
          display: s.display, scrollWidth: document.documentElement.scrollWidth,
          visibility: s.visibility, opacity: parseFloat(s.opacity),
          onTop: !!top && (top === el || el.contains(top)),
          inViewport: r.bottom > 0 && r.right > 0 && r.top < innerHeight && r.left < innerWidth};
})()
"""


class BrowserUnavailable(RuntimeError):
    """No Chromium here; the message says how to get one."""


def find_chromium() -> str | None:
    for candidate in CHROMIUM_CANDIDATES:
        path = candidate if os.path.isabs(candidate) else shutil.which(candidate)
        if path and os.access(path, os.X_OK):
            return path
    return None


@dataclass
class PageCheck:
    url: str
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    visibility: dict = field(default_factory=dict)
    screenshot_png: bytes = b""

    @property
    def external_requests(self) -> list[str]:
        return [u for u in self.requests if not u.startswith(("file:", "data:", "about:"))]

    @property
    def visible(self) -> bool:
        v = self.visibility
        return bool(v.get("found") and v["width"] > 0 and v["height"] > 0
                    and v["display"] != "none" and v["visibility"] == "visible"
                    and v["opacity"] > 0 and v["onTop"] and v["inViewport"])


class Chromium:
    """One headless, offline Chromium driven over the DevTools pipe; use as a context manager."""

    def __init__(self, executable: str | None = None, *, width: int = 1280, height: int = 900,
                 timeout_s: float = 30.0):
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise BrowserUnavailable("Chromium not found (looked for "
                                     f"{', '.join(CHROMIUM_CANDIDATES)}); install it with "
                                     "`apt-get install -y chromium`")
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict] = []

    def __enter__(self) -> "Chromium":
        self._profile = tempfile.TemporaryDirectory(prefix="lockstep-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire_pipes():  # runs in the child: fd 3 = commands in, fd 4 = replies out
            # Copy both ends above 4 first so neither dup2 can clobber the other; dup2's
            # targets are inheritable, the pipe's own fds (PEP 446) close on exec.
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 5)
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 5)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self._proc = subprocess.Popen(
            [self.executable, *OFFLINE_FLAGS, f"--user-data-dir={self._profile.name}",
             f"--window-size={self.width},{self.height}", "--remote-debugging-pipe",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=wire_pipes, close_fds=False)  # close_fds would close 3 and 4
        os.close(to_child_r)
        os.close(from_child_w)
        try:
            targets = self._call("Target.getTargets")["targetInfos"]
            page = next(t for t in targets if t["type"] == "page")
            self._session = self._call("Target.attachToTarget", targetId=page["targetId"],
                                       flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self._call(f"{domain}.enable", session=True)
            self._call("Emulation.setDeviceMetricsOverride", session=True, width=self.width,
                       height=self.height, deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            os.close(self._to_child)
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc.stderr.close()
        os.close(self._from_child)
        self._profile.cleanup()

    # -- the protocol ---------------------------------------------------------------------
    def _send(self, method: str, params: dict, session: bool) -> int:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer over the DevTools pipe in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe (it exited early)")
                self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)

    def _call(self, method: str, session: bool = False, **params) -> dict:
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout_s
        while True:
            message = self._read_message(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self._events.append(message)

    def _wait_event(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method:
                    return self._events.pop(i)
            self._events.append(self._read_message(deadline))

    # -- what a test asks ---------------------------------------------------------------------
    def check(self, path: str | os.PathLike, element_id: str = "matrix", *,
              scroll: bool = True) -> PageCheck:
        """Load ``path`` from disk and report console errors, requests, the element's
        visibility and a PNG screenshot of the viewport with the element scrolled in
        (``scroll=False``: as the page opens, to ask what its first screen shows)."""
        url = Path(path).resolve().as_uri()
        self._events.clear()
        self._call("Page.navigate", session=True, url=url)
        self._wait_event("Page.loadEventFired")
        result = PageCheck(url=url)
        visibility = self._call("Runtime.evaluate", session=True, returnByValue=True,
                                expression=_VISIBILITY_JS % (json.dumps(element_id),
                                                             json.dumps(scroll)))
        result.visibility = visibility.get("result", {}).get("value") or {}
        shot = self._call("Page.captureScreenshot", session=True, format="png")
        result.screenshot_png = base64.b64decode(shot["data"])
        self._call("Runtime.evaluate", session=True, expression="0")  # flush pending events
        for event in self._events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                text = " ".join(str(a.get("value", a.get("description", "")))
                                for a in params.get("args", []))
                result.console_errors.append(f"console.{params['type']}: {text}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                result.console_errors.append(f"exception: {details.get('text', '')} "
                                             f"{details.get('exception', {}).get('description', '')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                result.console_errors.append(f"{entry.get('source')}: {entry.get('text')} "
                                             f"{entry.get('url', '')}".strip())
            elif method == "Network.requestWillBeSent":
                result.requests.append(params["request"]["url"])
        self._events.clear()
        return result


def screenshot_report(path: str | os.PathLike, png: str | os.PathLike,
                      element_id: str = "matrix") -> PageCheck:
    """Open a report offline and write what the browser shows to ``png`` (for evidence)."""
    with Chromium() as browser:
        check = browser.check(path, element_id)
    Path(png).write_bytes(check.screenshot_png)
    return check
