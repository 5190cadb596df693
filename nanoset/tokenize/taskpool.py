"""Worker processes that run one task at a time and notice when one of them dies.

``multiprocessing.Pool`` waits forever for the result of a worker killed by a signal (the OOM killer's
SIGKILL): it silently starts a replacement and the lost task never completes. Here every worker has its
own pipe, and the driver watches each worker's pipe and process sentinel together, so it knows which
task a dead worker was running and can stop at once with that task in the error.
"""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar

from nanoset.errors import killed_by

T = TypeVar("T")


class WorkerDied(Exception):
    """A worker process ended (killed by a signal, or exited) while it was running ``task``."""

    def __init__(self, task: Any, exitcode: int | None) -> None:
        super().__init__(task, exitcode)
        self.task = task
        self.exitcode = exitcode

    def cause(self) -> str:
        if self.exitcode is not None and self.exitcode < 0:
            return f"was {killed_by(-self.exitcode)}"
        return f"exited with status {self.exitcode}"


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, attached as the ``__cause__`` of the re-raise."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _worker_main(conn: Connection, initializer: Callable, initargs: tuple, fn: Callable) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it stops the workers
    failed = None
    try:
        initializer(*initargs)
    except BaseException as e:  # noqa: BLE001 - reported as the result of the first task
        failed = (e, traceback.format_exc())
    try:
        while (args := conn.recv()) is not None:
            if failed is not None:
                _send_error(conn, *failed)
                continue
            try:
                result = fn(*args)
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the driver
                _send_error(conn, e, traceback.format_exc())
                continue
            conn.send((True, result))
    except (EOFError, OSError):  # the driver is gone (killed): nobody to report to
        return
    # told to stop, with nothing open: leave without the interpreter's teardown (freeing a large tokenizer's
    # tables and every module took 0.3 s that the driver spent waiting in close())
    os._exit(0)


def _send_error(conn: Connection, error: BaseException, text: str) -> None:
    try:
        conn.send((False, (error, text)))
    except (EOFError, OSError):
        raise
    except Exception:  # an exception that does not pickle: send its text
        conn.send((False, (RuntimeError(f"{type(error).__name__}: {error}"), text)))


class TaskPool(Generic[T]):
    """``workers`` processes of ``ctx`` that each run ``initializer(*initargs)``, then ``fn(*args)`` per task."""

    def __init__(self, ctx, workers: int, initializer: Callable, initargs: tuple, fn: Callable) -> None:
        self.procs, self.conns = [], []
        self.running: dict[int, T] = {}  # worker -> the task it is running
        for _ in range(workers):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child_end, initializer, initargs, fn), daemon=True)
            proc.start()
            child_end.close()
            self.procs.append(proc)
            self.conns.append(parent_end)

    def run(self, tasks: list[T], args_of: Callable[[T], tuple], on_tick: Callable[[], None],
            tick: float = 0.25) -> Iterator[tuple[T, Any]]:
        """Yield ``(task, result)`` as tasks complete; raise a worker's exception, or ``WorkerDied``. A worker
        gets its next task before the caller sees the result of its last one: what the caller does with a
        result (write a marker, check it) does not leave the worker idle."""
        queue = list(reversed(tasks))
        running = self.running

        def dispatch(w: int) -> None:
            running[w] = queue.pop()
            try:
                self.conns[w].send(args_of(running[w]))
            except OSError:  # it died while idle
                self.procs[w].join()
                raise WorkerDied(running[w], self.procs[w].exitcode) from None

        while queue or running:
            for w in range(len(self.procs)):
                if w not in running and queue:
                    dispatch(w)
            watched = {self.conns[w]: w for w in running} | {self.procs[w].sentinel: w for w in running}
            ready = wait(list(watched), timeout=tick)
            on_tick()
            for w in sorted({watched[r] for r in ready}):
                if w not in running:
                    continue
                if not self.conns[w].poll():  # the sentinel fired with no message: the process is gone
                    self.procs[w].join()
                    raise WorkerDied(running[w], self.procs[w].exitcode)
                try:
                    ok, value = self.conns[w].recv()
                except EOFError:
                    self.procs[w].join()
                    raise WorkerDied(running[w], self.procs[w].exitcode) from None
                task = running.pop(w)
                if not ok:
                    error, text = value
                    raise error from RemoteTraceback(text)
                if queue:
                    dispatch(w)
                yield task, value

    def close(self) -> None:
        """Stop every worker: one still running a task is terminated (a task writes temporary files only)."""
        for w, (conn, proc) in enumerate(zip(self.conns, self.procs)):
            if w in self.running:
                proc.terminate()
            elif proc.is_alive():
                try:
                    conn.send(None)
                except OSError:
                    proc.terminate()
        for proc in self.procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
