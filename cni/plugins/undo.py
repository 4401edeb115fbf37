"""What a failing ADD must take back: steps pushed as the ADD makes changes, run newest first
when the block fails. Shared by every plugin that changes more than one thing."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from cni.skel import Request


class Undo:
    def __init__(self, req: Request) -> None:
        self.req = req
        self.steps: list[tuple[str, Callable[[], Any]]] = []

    def push(self, what: str, fn: Callable[[], Any]) -> None:
        self.steps.append((what, fn))

    def run(self) -> None:
        for what, fn in reversed(self.steps):
            try:
                fn()
            except Exception as e:  # keep undoing: the original error is what we report
                self.req.log(f"undo {what} failed: {e}")

    def __enter__(self) -> Undo:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is not None:  # any failure, a kill (KeyboardInterrupt, SystemExit) too
            self.run()
