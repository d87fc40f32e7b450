"""Progress of long stages: a live bar on a terminal, one plain line per stage in a log or a pipe.

Why one helper: calibration, tracing, export, evaluation and fine-tuning run for minutes, and a user
reading a log (``dipdeploy export ... > log 2>&1``) must see which stage runs and how long each took,
while a terminal gets a live bar that does not fill a log with carriage returns. Progress goes to
stderr, so stdout keeps only the command's results (tables, generated text).

Log mode writes, per stage, ``what …`` when it starts (flushed, so a log shows the stage at work) and
its seconds on the same line when it ends; a stage started inside another first ends the open line, and
the outer stage then ends on a line of its own (``what: <seconds> s``). A counted stage (one with a
total) that runs long adds a line every ``LOG_EVERY_S`` seconds with its count and the time left, so a
log of a minutes-long calibration shows it moving and when it will end; the live bar shows both always.
A stage whose total is known only once it runs (how many passes the calibration needs depends on what it
finds cached) is given it then (``Stage.expect``). Floor 1: no torch.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, TextIO

from dipdeploy.terminal import shown


def quiet_libraries() -> None:
    """Silence transformers' and huggingface_hub's own bars, advisory warnings and deprecation notices
    (ours report the stages instead; their tqdm bars would interleave with ours). Sets the environment
    both libraries read at import, and, when transformers is imported already, its logging switches too.
    Called once, by the CLI's entry point: library users keep their own settings."""
    for library in ("transformers", "huggingface_hub", "peft"):  # deprecation notices are for their callers' authors
        warnings.filterwarnings("ignore", category=FutureWarning, module=library)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=library)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.set_verbosity_error()
        logging.disable_progress_bar()


def _is_terminal(*streams: TextIO) -> bool:
    return all(getattr(s, "isatty", lambda: False)() for s in streams)


#: log mode: the seconds between two lines of a counted stage's count and time left
LOG_EVERY_S = 30.0


def duration(seconds: float) -> str:
    """Seconds as a reader takes them in: tenths of a second under a minute, then minutes and seconds, then
    hours and minutes."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def time_left(done: int, total: int | None, elapsed: float) -> float | None:
    """Seconds left at the pace so far (None before the first item, or without a total)."""
    if not total or done <= 0:
        return None
    return elapsed * max(total - done, 0) / done


@dataclass
class Stage:
    """One running stage; ``advance`` counts its items (windows, steps, tokens), ``expect`` adds to its
    total. Both are what a long computation is handed to report through (calibration, validation)."""

    what: str
    total: int | None
    progress: "Progress"
    done: int = 0
    start: float = 0.0  # the progress's clock when the stage started
    _task: object = field(default=None, init=False, repr=False)  # its row in the live bar
    _logged: float = field(default=0.0, init=False, repr=False)  # log mode: when its last line was written

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._task is not None:
            self.progress._bar.update(self._task, advance=n)
        elif self.total and not self.progress.live and not self.progress.quiet:
            self.progress._log_count(self)

    def expect(self, n: int) -> None:
        """``n`` more items to come (a total known only once the stage runs)."""
        self.total = (self.total or 0) + n
        if self._task is not None:
            self.progress._bar.update(self._task, total=self.total)

    def finish(self) -> float:
        """End the stage; returns and records its seconds (``Progress.seconds[what]``)."""
        return self.progress._finish(self)


@dataclass
class Progress:
    """Reports stages on ``stream`` (default stderr); ``live`` None: a live bar only when both stdout and
    stderr are terminals (a pipe or a log on either side gets plain lines). ``quiet`` reports nothing
    (library callers and tests) but still times the stages. ``clock``: seconds, monotonic (a test's fake)."""

    stream: TextIO | None = None
    live: bool | None = None
    quiet: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = time.perf_counter
    _open: Stage | None = field(default=None, init=False, repr=False)  # log mode: the stage whose line is open
    _bar: object = field(default=None, init=False, repr=False)  # live mode: rich's Progress while stages run
    _running: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.live is None:
            self.live = not self.quiet and _is_terminal(sys.stdout, sys.stderr)

    @property
    def out(self) -> TextIO:
        return self.stream or sys.stderr

    def start(self, what: str, total: int | None = None) -> Stage:
        stage = Stage(what, total, self, start=self.clock())
        stage._logged = stage.start
        self._running += 1
        if self.quiet:
            return stage
        if self.live:
            if self._bar is None:
                from rich.console import Console
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar, SpinnerColumn,
                                           TextColumn, TimeElapsedColumn, TimeRemainingColumn)

                self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("left"),
                                TimeRemainingColumn(), console=Console(file=self.out), transient=True,
                                get_time=self.clock)
                self._bar.start()
            stage._task = self._bar.add_task(shown(what), total=total)  # its column renders markup
            return stage
        self._end_open_line()
        of = f" ({total})" if total else ""
        self.out.write(f"{shown(what, markup=False)}{of} …")
        self.out.flush()
        self._open = stage
        return stage

    def _end_open_line(self) -> None:
        if self._open is not None:
            self.out.write("\n")
            self._open = None

    def _log_count(self, stage: Stage) -> None:
        """Log mode: a line with the count and the time left, at most every ``LOG_EVERY_S`` seconds."""
        now = self.clock()
        if now - stage._logged < LOG_EVERY_S or stage.done >= stage.total:
            return
        stage._logged = now
        left = time_left(stage.done, stage.total, now - stage.start)
        self._end_open_line()
        self.out.write(f"{shown(stage.what, markup=False)}: {stage.done}/{stage.total}, {duration(now - stage.start)}"
                       + (f", about {duration(left)} left" if left is not None else "") + "\n")
        self.out.flush()

    def _finish(self, stage: Stage) -> float:
        secs = self.clock() - stage.start
        self.seconds[stage.what] = round(secs, 3)
        self._running -= 1
        if self.quiet:
            return secs
        count = f" {stage.done}/{stage.total}," if stage.total else ""
        if self.live:
            self._bar.remove_task(stage._task)
            self._bar.console.print(f"{shown(stage.what, markup=False)}:{count} {secs:.1f} s", markup=False,
                                    highlight=False)
            if self._running == 0:
                self._bar.stop()
                self._bar = None
        elif self._open is stage:
            self.out.write(f"{count} {secs:.1f} s\n")
            self._open = None
        else:
            self._end_open_line()
            self.out.write(f"{shown(stage.what, markup=False)}:{count} {secs:.1f} s\n")
        self.out.flush()
        return secs

    @contextmanager
    def stage(self, what: str, total: int | None = None) -> Iterator[Stage]:
        """A stage around a block; it ends (and is timed) however the block ends."""
        s = self.start(what, total)
        try:
            yield s
        finally:
            s.finish()

    def steps(self) -> "Steps":
        """Consecutive stages announced by name (each announcement ends the previous stage)."""
        return Steps(self)


@dataclass
class Steps:
    """``steps("load")``, ``steps("calibrate")``, …, ``steps()`` to end the last: for stage functions that
    announce each step's start through a callback (``dipdeploy.export.bundle.Progress``)."""

    progress: Progress
    current: Stage | None = None

    def __call__(self, name: str | None = None) -> Stage | None:
        """The new step's :class:`Stage`, for a step that counts its work (export's calibration and
        validation); None after the last."""
        if self.current is not None:
            self.current.finish()
            self.current = None
        if name:
            self.current = self.progress.start(name)
        return self.current
