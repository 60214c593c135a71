"""Named background tasks whose death is never silent: the first one to fail sets `failed` and keeps its
error, so the owner stops with it instead of hanging."""

from __future__ import annotations

import asyncio


class TaskSet:
    def __init__(self, prefix: str):
        self.prefix = prefix
        self.error: BaseException | None = None
        self.failed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=f"{self.prefix}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self.error is None:
            self.error = RuntimeError(f"task {task.get_name()} died: {task.exception()!r}")
            self.error.__cause__ = task.exception()
            self.failed.set()

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
