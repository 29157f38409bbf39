"""A server process that lockstep starts and stops: ``llama-server`` on the package's GGUF,
on 127.0.0.1 and a free port.

It is owned by the engine that started it: started in the engine's constructor, stopped by
``Engine.close`` (which the runner calls after the engine's last cell, on an exception and on
Ctrl-C, since the run's ``finally`` closes it), and as a last resort when lockstep's own
process ends (``atexit``, and on Linux the kernel's parent-death signal, so a killed lockstep
leaves no server behind). Its output is read by a thread into a log file, kept with the
evidence once the run names a folder (``move_log``), and its last lines are quoted in every
error that concerns it: a server that died says why in the cell's reason.
"""
from __future__ import annotations

import atexit
import collections
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from engines.backends.http.client import HttpClient, ServerError, trimmed

LAST_LINES = 12


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's choice); a server that loses the race
    for it is started again on another."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the kernel sends SIGTERM to the server when lockstep's process dies."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


class ServerProcess:
    """One started server. ``argv`` must contain ``{port}`` where the port goes."""

    def __init__(self, name: str, argv: list[str], host: str = "127.0.0.1"):
        self.name, self.template, self.host = name, list(argv), host
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.last = collections.deque(maxlen=LAST_LINES)
        self._lock = threading.Lock()
        self._tmp = Path(tempfile.mkdtemp(prefix="lockstep-server-"))
        self.log_path = self._tmp / f"{name}.log"
        self._log = open(self.log_path, "a", encoding="utf-8", errors="replace")
        self._reader: threading.Thread | None = None
        self.exit_code: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def argv(self) -> list[str]:
        return [a.replace("{port}", str(self.port)) for a in self.template]

    # -- life ----------------------------------------------------------------------------
    def start(self, ready_timeout: float, health_path: str = "/health",
              tries: int = 3) -> "ServerProcess":
        """Start the server and wait (at most ``ready_timeout`` seconds in all) until
        ``health_path`` answers 200. A server that exits while starting because its port was
        taken meanwhile is started again on another port; any other exit, or no answer in
        time, is a :class:`ServerError` quoting its last lines (the server is stopped)."""
        deadline = time.monotonic() + ready_timeout
        for attempt in range(tries):
            self.port = free_port(self.host)
            self._spawn()
            try:
                self._wait_ready(deadline, health_path)
                return self
            except ServerError as err:
                self.stop()
                taken = "address already in use" in " ".join(self.last).lower()
                if not (err.reason == "exited" and taken and attempt + 1 < tries):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn(self) -> None:
        self._log.write(f"# lockstep: {' '.join(self.argv)}\n")
        self._log.flush()
        self.exit_code = None
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        _LIVE.add(self)
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True,
                                        name=f"{self.name}-log")
        self._reader.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self.last.append(line)
                if not self._log.closed:
                    self._log.write(line + "\n")
                    self._log.flush()

    def _wait_ready(self, deadline: float, health_path: str) -> None:
        client = HttpClient(self.url, timeout=2.0, attempts=1)
        wait = 0.05
        while True:
            self.check_alive()
            try:
                client.request("GET", health_path, None, timeout=min(
                    2.0, max(deadline - time.monotonic(), 0.01)), retry=False)
                return
            except ServerError as err:
                if err.reason not in ("unreachable", "loading", "timeout"):
                    raise
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"{self.name} did not answer {health_path} within its start-up time",
                    reason="timeout", endpoint=f"GET {health_path}",
                    words=self.last_words(),
                    remedy="see its log; a large model needs more time "
                           "(LOCKSTEP_HTTP_STARTUP_TIMEOUT)")
            time.sleep(min(wait, max(deadline - time.monotonic(), 0)))
            wait = min(wait * 2, 0.5)

    def check_alive(self) -> None:
        """Raise a :class:`ServerError` (``reason="exited"``) if the process has ended."""
        proc = self.proc
        if proc is None or proc.poll() is None:
            return
        self.exit_code = proc.returncode
        if self._reader is not None:
            self._reader.join(timeout=2)
        raise ServerError(f"{self.name} (pid {proc.pid}) has exited with code "
                          f"{proc.returncode}", reason="exited", endpoint=self.url,
                          words=self.last_words(), remedy=f"see its log: {self.log_path}")

    def exited(self, within: float) -> ServerError | None:
        """The error saying the process has ended, if it ends within ``within`` seconds (a
        dropped connection is often a server dying: its exit code and last lines say why);
        None while it runs."""
        proc = self.proc
        if proc is None:
            return None
        try:
            proc.wait(within)
        except subprocess.TimeoutExpired:
            return None
        try:
            self.check_alive()
        except ServerError as err:
            return err
        return None

    def last_words(self) -> str:
        with self._lock:
            return trimmed(" | ".join(line for line in self.last if line.strip()), 600)

    def move_log(self, path: Path) -> Path:
        """Keep the log at ``path`` from now on (what was written so far is copied)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._log.flush()
            path.write_bytes(self.log_path.read_bytes())
            self._log.close()
            self.log_path.unlink(missing_ok=True)
            self.log_path = path
            self._log = open(path, "a", encoding="utf-8", errors="replace")
        try:
            self._tmp.rmdir()
        except OSError:
            pass
        return path

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``grace`` seconds; the log
        is flushed and kept. Safe to call twice."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(grace)
            self.exit_code = proc.returncode
            if self._reader is not None:
                self._reader.join(timeout=2)
            if proc.stdout is not None:
                proc.stdout.close()
        with self._lock:
            if not self._log.closed:
                self._log.write(f"# lockstep: stopped (exit code {self.exit_code})\n")
                self._log.flush()

    def close(self) -> None:
        self.stop()
        with self._lock:
            self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_LIVE: set[ServerProcess] = set()


@atexit.register
def _stop_all() -> None:  # pragma: no cover - interpreter shutdown
    for server in list(_LIVE):
        server.stop(grace=2.0)


__all__ = ["ServerProcess", "free_port"]
