"""The elastic agent that ``nanoset train`` runs in its own process: torchrun's ``LocalElasticAgent``, with the
launcher's own answer to signals and to restarts.

torch's agent turns a signal into an exception that shuts the workers down with that signal and then, from a
``finally``, with SIGTERM: a second Ctrl-C reached the workers as a SIGTERM they took for the same stop, and a
third left the launcher gone and its workers still running. Here the launcher keeps its own handlers:

* before any worker runs (checks, rendezvous) a stop signal ends the launcher at once (``StopRequested``);
* while the workers run, the first SIGINT, SIGTERM, SIGHUP or SIGUSR1 is forwarded to every worker, which
  stops after its step with one checkpoint and exits 128 + the signal (the launcher exits with it);
* a Ctrl-C while they stop kills them at once: SIGKILL to each worker's session (torch starts each worker in
  its own), which holds its loader processes too.

Restarts (``--max-restarts``) are for failures a rerun may cure (a crash, a killed worker): a worker that stopped
on a signal is not restarted, nor one that said a user error (a config, data or checkpoint mistake, a diverged
run), which a restart would only repeat. A worker exits 1 for such an error, as for a crash, so it also writes it
into the file torchrun gives each worker for its failure (``TORCHELASTIC_ERROR_FILE``, in torch's own format)
with a category this agent reads: ``mark_user_error``, called by ``runtime/train.py``. A worker whose collective
broke because another ended marks that too (``mark_broken_collective``): the launcher reports the other
(``root_failure``), and the group may be restarted.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.control.preemption import STOP_SIGNALS, StopRequested, is_stop_status, leave_a_closed_terminal

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
USER_ERROR = "nanoset-user-error"
BROKEN_COLLECTIVE = "nanoset-broken-collective"  # a worker whose collective broke because another worker ended


def mark_user_error(message: str) -> None:
    """Record ``message`` as this worker's failure, a user error (nothing when no launcher asked for it)."""
    _mark_failure(message, USER_ERROR)


def mark_broken_collective(message: str) -> bool:
    """Record ``message`` as this worker's failure, the consequence of another worker's end; whether it was."""
    return _mark_failure(message, BROKEN_COLLECTIVE)


def _mark_failure(message: str, category: str) -> bool:
    path = os.environ.get(ERROR_FILE)
    if not path:
        return False
    # torch's format, without the traceback (py_callstack), so that torchrun's report shows the message instead
    data = {"message": {"message": message, "extraInfo": {"timestamp": str(int(time.time()))}},
            "errorTraits": {"category": category, "retryability": "False"}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:  # the mark only informs the launcher; the error itself is said or kept
        return False
    return True


def _category(error_file_data: dict) -> str | None:
    traits = error_file_data.get("errorTraits") if isinstance(error_file_data, dict) else None
    return traits.get("category") if isinstance(traits, dict) else None


def is_user_error(error_file_data: dict) -> bool:
    """Whether a failure torchrun read from a worker's error file is a marked user error."""
    return _category(error_file_data) == USER_ERROR


def is_broken_collective(error_file_data: dict) -> bool:
    """Whether a failure torchrun read from a worker's error file is a collective that another worker's end broke."""
    return _category(error_file_data) == BROKEN_COLLECTIVE


def failure_message(error_file_data: dict) -> str:
    """The message a worker marked in its error file ('' where it marked none)."""
    message = error_file_data.get("message") if isinstance(error_file_data, dict) else None
    return str(message.get("message", "")) if isinstance(message, dict) else str(message or "")


def root_failure(failures: dict) -> tuple[int, object]:
    """The failure that ended the run, from torchrun's ``{global rank: ProcessFailure}``: the first in time (ties in
    the agent's order, the order it saw them) that is no consequence of another. Consequences: a broken collective
    (a worker whose peer died fails too, and may exit before the agent sees the death) and a death by SIGTERM, the
    signal the agent tears the other workers down with (a worker handles it, but not while it waits to be ended
    after a user error another rank says). With nothing else: the first of them (a peer that hung, a network that
    broke)."""
    ranked = sorted(failures.items(), key=lambda item: item[1].timestamp)
    causes = [(rank, failure) for rank, failure in ranked
              if not is_broken_collective(failure.error_file_data) and failure.exitcode != -signal.SIGTERM]
    return (causes or ranked)[0]


def _alive(pid: int) -> bool:
    """Whether a worker still runs: not gone, and not a zombie (exited, its status not yet read by the agent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):  # gone, or no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state != "Z"


def kill_at_once(pid: int) -> None:
    """SIGKILL a worker and what it started: its session's process group (torch makes each worker a session
    leader), or the worker alone where it leads none."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
            return
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class LauncherSignals:
    """The launcher's stop signals: what it received, and whether it killed its workers (a second Ctrl-C)."""

    def __init__(self) -> None:
        self.first: int | None = None  # the first stop signal forwarded to the workers
        self.killed = False
        self.started = False  # workers are being started (or were: they may all have ended since)
        self._workers: Callable[[], list[int]] = list

    def install(self) -> LauncherSignals:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        return self

    def watch(self, workers: Callable[[], list[int]]) -> None:
        """``workers``: the pids of the workers running now."""
        self._workers = workers

    def _on_signal(self, signum: int, frame) -> None:
        if signum == signal.SIGHUP:
            leave_a_closed_terminal()
        workers = [pid for pid in self._workers() if _alive(pid)]
        if not workers:
            if self.first is not None or self.started:  # they ended (or restart): the agent reports how
                self.first = self.first or signum  # a restart is forwarded it, and none follows a failure
                return
            raise StopRequested(signum)  # none started yet: nothing to stop cleanly, the launcher ends now
        if self.first is not None and signum == signal.SIGINT:  # Ctrl-C while they stop: now
            self.killed = True
            for pid in workers:
                kill_at_once(pid)
            return
        if self.first is None:
            self.first = signum
        self.forward(signum, workers)

    @staticmethod
    def forward(signum: int, workers: list[int]) -> None:
        """Send ``signum`` to each worker once it answers the stop signals: a worker still starting (importing,
        before runtime/train.py installs its handlers) would die of it, or of Python's KeyboardInterrupt, with a
        traceback; it gets the signal as soon as it is ready, from a thread (the handler returns at once)."""
        for pid in workers:
            if handles_stop_signals(pid) is False:
                threading.Thread(target=_forward_when_ready, args=(signum, pid), daemon=True).start()
            else:
                _kill(pid, signum)


def handles_stop_signals(pid: int) -> bool | None:
    """Whether a worker has its stop handlers (``SigCgt`` of /proc/PID/status holds SIGTERM, which Python does not
    catch by itself; the worker installs all its stop handlers at once); None where that cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return None


def _forward_when_ready(signum: int, pid: int, poll_s: float = 0.01) -> None:
    while _alive(pid) and handles_stop_signals(pid) is False:
        time.sleep(poll_s)
    _kill(pid, signum)


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def final_failure(exitcode: int, error_file_data: dict) -> bool:
    """A worker's failure that a restart would only repeat: a user error it said, or a stop on a signal."""
    return is_user_error(error_file_data) or is_stop_status(exitcode)


def agent_class(signals: LauncherSignals) -> type:
    """torchrun's local agent, with ``signals`` answering the stop signals and no restart of a final failure."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class LauncherAgent(LocalElasticAgent):
        def _start_workers(self, worker_group):
            signals.watch(self._worker_pids)
            signals.started = True  # from here a stop is forwarded to them (below, if it comes while they start)
            pids = super()._start_workers(worker_group)
            signals.install()  # torch < 2.8 installs its own handlers with the workers
            if signals.first is not None:  # a stop asked for while (re)starting them
                signals.forward(signals.first, self._worker_pids())
            return pids

        def _worker_pids(self) -> list[int]:
            return list(self._pcontext.pids().values()) if self._pcontext is not None else []

        def _monitor_workers(self, worker_group):
            result = super()._monitor_workers(worker_group)
            if result.is_failed() and (signals.first is not None or any(
                    final_failure(f.exitcode, f.error_file_data) for f in result.failures.values())):
                self._remaining_restarts = 0
            return result

    return LauncherAgent


@contextmanager
def agent_of_launch(signals: LauncherSignals) -> Iterator[None]:
    """Make ``torch.distributed.run.run`` (through ``launcher.api.launch_agent``) build the launcher's agent."""
    import torch.distributed.launcher.api as launcher_api

    saved = launcher_api.LocalElasticAgent
    launcher_api.LocalElasticAgent = agent_class(signals)
    try:
        yield
    finally:
        launcher_api.LocalElasticAgent = saved
