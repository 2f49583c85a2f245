"""Printing for the CLI: rich consoles whose output is masked, JSON documents, progress bars."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
from typing import IO, Any, Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..barrier.health import duration_text as duration  # noqa: F401 (the CLI's name for it)
from ..secrets import mask_url

T = TypeVar("T")

# Cell styles of the barrier states (the HTML report uses the same colours).
STATE_STYLE = {"SNAPSHOT": "bold white on blue", "COMMIT": "bold black on green", "PRECOMMIT": "black on yellow",
               "": "dim"}
STATE_LETTER = {"SNAPSHOT": "S", "COMMIT": "C", "PRECOMMIT": "P", "": "·"}
SEVERITY_STYLE = {"ok": "green", "info": "cyan", "warning": "yellow", "error": "bold red"}


class _Masked:
    """A text stream that masks passwords in everything written to it."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask_url(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, flush, encoding
        return getattr(self._stream, name)


def _console(stream: IO[str]) -> Console:
    masked = _Masked(stream)
    terminal = stream.isatty() or os.environ.get("TTY_COMPATIBLE") == "1"
    width = None if terminal else int(os.environ.get("COLUMNS") or 200)
    return Console(file=masked, highlight=False, soft_wrap=False, width=width)  # type: ignore[arg-type]


class Output:
    """What a command prints: rich renderables on stdout, or one JSON document."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json
        self.out = _console(sys.stdout)
        self.err = _console(sys.stderr)

    def print(self, *things: Any, **kwargs: Any) -> None:
        if not self.json:
            self.out.print(*things, **kwargs)

    def note(self, text: str) -> None:
        """A line on stderr (both modes): what a command did, beside its output."""
        self.err.print(text)

    def emit(self, doc: Any) -> None:
        """The JSON document of a ``--json`` run (masked, one document on stdout)."""
        if self.json:
            sys.stdout.write(mask_url(json.dumps(doc, indent=2, default=_default, sort_keys=False)) + "\n")
            sys.stdout.flush()

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None) -> Iterator["Step"]:
        """A progress bar on stderr while long work runs (only on a terminal)."""
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=self.err, transient=True, disable=not self.err.is_terminal)
        with bar:
            task = bar.add_task(description, total=total)
            yield Step(bar, task)

    def each(self, description: str, items: Iterable[T]) -> Iterator[T]:
        """``items``, one at a time, with a progress bar."""
        items = list(items)
        with self.progress(description, len(items)) as step:
            for item in items:
                step.label(f"{description} {item}")
                yield item
                step.advance()


class Step:
    def __init__(self, bar: Progress, task: Any) -> None:
        self.bar, self.task = bar, task

    def advance(self, n: int = 1) -> None:
        self.bar.advance(self.task, n)

    def label(self, text: str) -> None:
        self.bar.update(self.task, description=text)


def _default(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return sorted(o) if isinstance(o, (set, frozenset)) else list(o)
    if isinstance(o, range):
        return list(o)
    if isinstance(o, dt.datetime):
        return o.isoformat()
    return str(o)


def when(ts: float | None) -> str:
    """A timestamp for people: UTC, to the second."""
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)
