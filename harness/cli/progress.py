"""Progress of a long command: a rich bar on a terminal, plain lines anywhere else.

Progress goes to stderr (stdout keeps the results a script reads). A CI log is not a
terminal, and rich draws nothing there, so a matrix whose first cell converts a checkpoint
or runs a slow oracle looked hung. Off a terminal this prints one line when the plan is
known, one per finished cell at most every ``interval`` seconds, and a heartbeat from a
background thread whenever ``interval`` seconds passed without a line, so the log never goes
that long silent. The count shows only once the total is known (never "0/?").
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time

from rich.console import Console
from rich.progress import (BarColumn, Progress, ProgressColumn, Task, TextColumn,
                           TimeElapsedColumn)
from rich.text import Text

INTERVAL = 10.0  # seconds between plain lines; well under the 30 s a CI log may stay silent


class CountColumn(ProgressColumn):
    """``done/total`` once the total is known; until then, how many are done so far."""

    def render(self, task: Task) -> Text:
        done = int(task.completed)
        return Text(f"{done}/{int(task.total)}" if task.total is not None else
                    ("planning" if not done else f"{done} done"), style="progress.download")


class CellProgress:
    """``plan(total)`` once the work is planned, ``advance(text)`` per finished unit,
    ``set_completed(n)`` where a count arrives from elsewhere (xdist workers)."""

    def __init__(self, label: str, unit: str = "cells", interval: float = INTERVAL,
                 plain: bool | None = None, console: Console | None = None):
        console = console or Console(stderr=True)
        self.console = console
        self.label = label
        self.unit = unit
        self.interval = interval
        self.plain = (not console.is_terminal) if plain is None else plain
        self.total: int | None = None
        self.done = 0
        self.last_text = ""
        self._started = self._last_line = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> "CellProgress":
        self._started = self._last_line = time.monotonic()
        if self.plain:
            self._line(f"{self.label}: planning")
            self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                            name="lockstep-progress")
            self._thread.start()
        else:
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                      CountColumn(), TimeElapsedColumn(),
                                      console=self.console, transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task(self.label, total=None)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._progress is not None:
            self._progress.__exit__(*exc)

    # -- events ---------------------------------------------------------------------------

    def plan(self, total: int) -> None:
        with self._lock:
            self.total = total
        if self._progress is not None:
            self._progress.update(self._task, total=total)
        else:
            self._line(f"{self.label}: {total} {self.unit} planned")

    def describe(self, text: str) -> None:
        self.last_text = text
        if self._progress is not None:
            self._progress.update(self._task, description=text)

    def advance(self, text: str, n: int = 1) -> None:
        with self._lock:
            self.done += n
        self._after(text)

    def set_completed(self, done: int) -> None:
        with self._lock:
            if done == self.done:
                return
            self.done = done
        self._after(self.last_text)

    # -- plain lines ----------------------------------------------------------------------

    def _after(self, text: str) -> None:
        self.last_text = text
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, description=text)
        elif time.monotonic() - self._last_line >= self.interval or self.done == self.total:
            self._line(self._status(f"last: {text}" if text else ""))

    def _status(self, tail: str) -> str:
        count = f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
        elapsed = time.monotonic() - self._started
        return (f"{self.label}: {count} {self.unit} done, {elapsed:.0f} s elapsed"
                + (f"; {tail}" if tail else ""))

    def _line(self, text: str) -> None:
        with self._lock:
            self._last_line = time.monotonic()
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self.console.file.flush()

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(1.0, self.interval / 4)):
            if time.monotonic() - self._last_line >= self.interval:
                last = f"last finished: {self.last_text}" if self.last_text else ""
                self._line(self._status(("still running" + (f" ({last})" if last else ""))))


class StepProgress:
    """The steps of one long job (``lockstep convert``): a spinner naming the step on a
    terminal; off it, one line per step with the seconds since the start, and a heartbeat
    naming the step still running every ``interval`` seconds."""

    def __init__(self, label: str, interval: float = INTERVAL, plain: bool | None = None,
                 console: Console | None = None):
        console = console or Console(stderr=True)
        self.console = console
        self.label = label
        self.interval = interval
        self.plain = (not console.is_terminal) if plain is None else plain
        self.current = label
        self._started = self._last_line = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._status = None

    def __enter__(self) -> "StepProgress":
        self._started = self._last_line = time.monotonic()
        if self.plain:
            self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                            name="lockstep-steps")
            self._thread.start()
        else:
            self._status = self.console.status(self.label)
            self._status.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._status is not None:
            self._status.__exit__(*exc)

    def step(self, text: str) -> None:
        self.current = text
        if self._status is not None:
            self._status.update(f"{self.label}: {text}")
        else:
            self._line(text)

    def _line(self, text: str) -> None:
        with self._lock:
            self._last_line = time.monotonic()
            elapsed = self._last_line - self._started
            self.console.print(f"{self.label}: {text} ({elapsed:.0f} s)", markup=False,
                               highlight=False, soft_wrap=True)
            self.console.file.flush()

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(1.0, self.interval / 4)):
            if time.monotonic() - self._last_line >= self.interval:
                self._line(f"still {self.current}")


class LogSteps(logging.Handler):
    """Each INFO record of a logger becomes a step of a ``StepProgress``."""

    def __init__(self, progress: StepProgress):
        super().__init__(logging.INFO)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        self.progress.step(record.getMessage())


@contextlib.contextmanager
def converting_steps(label: str):
    """The converter's steps (its ``harness.convert`` log) shown as progress while it runs."""
    logger = logging.getLogger("harness.convert")
    with StepProgress(label) as progress:  # on stderr
        handler = LogSteps(progress)
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            yield progress
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
