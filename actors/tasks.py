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

    def fail(self, error: BaseException) -> None:
        """Stop the owner with `error` (unless one failed first)."""
        if self.error is None:
            self.error = error
            self.failed.set()

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


async def unless(stop: asyncio.Event, coro):
    """`await coro`, unless `stop` is set first: then it is cancelled and None returned."""
    work, stopped = asyncio.ensure_future(coro), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([work, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not work.done():
            work.cancel()
    return work.result() if work.done() and not work.cancelled() else None
