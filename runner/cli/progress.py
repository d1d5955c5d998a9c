"""Progress for long work (image build): a live spinner on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

from rich.console import Console


class StepReporter:
    """Shows each step with the elapsed time; stderr only, never stdout."""

    def __init__(self, title: str) -> None:
        self.console = Console(stderr=True, highlight=False)
        self.title = title
        self._t0 = time.monotonic()
        self._status: Any = None

    def __enter__(self) -> StepReporter:
        if self.console.is_terminal:
            self._status = self.console.status(self.title)
            self._status.__enter__()
        else:
            print(f"{self.title} ...", file=sys.stderr, flush=True)
        return self

    def step(self, message: str) -> None:
        line = f"[{time.monotonic() - self._t0:6.1f}s] {message}"
        if self._status is not None:
            self._status.update(f"{self.title}: {message}")
            self.console.log(line, markup=False)
        else:
            print(line, file=sys.stderr, flush=True)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._status is not None:
            self._status.__exit__(et, ev, tb)
