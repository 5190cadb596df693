"""In-process prefetch: a background thread keeps a few ready micro-batches in a bounded queue.

The training thread then finds its next micro-batch waiting instead of reading it, without a
loader process taking a core from the training threads: numpy and torch release the GIL for
their copies, so the reading overlaps the step. On CUDA the batches are pinned in the thread
(the DataLoader's ``pin_memory``), so the step's host-to-device copies are asynchronous.

An exception in the thread is raised again in the training thread: a user error as it is (so it
stays one line), anything else with the original (and its traceback) as ``__cause__``. ``close()``
(the trainer calls it at every stage switch and at the end) stops and joins the thread; the thread
is a daemon, so an interpreter exit never waits on it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from nanoset.errors import user_message

_END = object()  # the wrapped iterator is exhausted


class _Failure:
    """The thread's exception, carried to the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class PrefetchIterator:
    """Iterates ``source`` in a daemon thread, ``depth`` items ahead of the consumer."""

    def __init__(self, source: Any, depth: int, name: str = "nanoset-prefetch") -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be ≥ 1, got {depth}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        # the thread holds the queue and the event, not this object: dropping it (and so __del__) stops the thread
        self._thread = threading.Thread(target=_fill, args=(iter(source), self._queue, self._stop), name=name,
                                        daemon=True)
        self._thread.start()

    def __iter__(self) -> PrefetchIterator:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise RuntimeError("the data prefetch thread stopped without a result") from None
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            self._thread.join()
            if user_message(item.error) is not None:  # a user error (a shard removed mid-run) stays one line
                raise item.error
            raise RuntimeError(f"the data prefetch thread failed: {type(item.error).__name__}: {item.error}"
                               ) from item.error
        return item

    def close(self) -> None:
        """Stop the thread (it may be waiting for room or in the middle of a read) and join it."""
        self._stop.set()
        while self._thread.is_alive():
            _drain(self._queue)  # room for a thread blocked in put(): it sees the stop at once
            self._thread.join(timeout=0.1)
        _drain(self._queue)
        self._done = True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()


def _fill(it: Iterator, q: queue.Queue, stop: threading.Event) -> None:
    """The thread: items of ``it`` into ``q`` until the end, a failure, or ``stop``."""

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    try:
        while not stop.is_set():
            try:
                item = next(it)
            except StopIteration:
                put(_END)
                return
            if not put(item):
                return
    except BaseException as e:  # noqa: BLE001 - every failure goes to the consumer
        put(_Failure(e))
    finally:
        shutdown_workers(it)


def _drain(q: queue.Queue) -> None:
    try:
        while True:
            q.get_nowait()
    except queue.Empty:
        pass


def shutdown_workers(it: Iterator) -> None:
    """Release what the wrapped iterator holds (a DataLoader iterator's worker processes)."""
    if hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


class PrefetchLoader:
    """A loader whose iterators prefetch ``depth`` items of ``loader`` in a background thread."""

    def __init__(self, loader: Any, depth: int) -> None:
        self.loader = loader
        self.depth = depth

    def __iter__(self) -> PrefetchIterator:
        return PrefetchIterator(self.loader, self.depth)

    def __len__(self) -> int:
        return len(self.loader)
