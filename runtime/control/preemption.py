"""Stopping cleanly: on a cluster's warning signal — SIGTERM (Slurm's default before a kill), SIGUSR1
(``sbatch --signal=USR1@120``), SIGHUP (a closed terminal or ssh session) — on Ctrl-C (SIGINT), and when
the launcher is gone.

A training process installs its handlers first thing (``runtime/train.py``), so every moment of its life
has one answer:

* during start-up (imports, checks, building the engine, loading weights, tokenizing a stage) nothing has
  been trained: a signal ends the process at once with one line (see ``StopRequested``);
* while training, the handler only sets a flag. A signal can reach the ranks at different steps (or only
  some of them), so in every step the ranks take the MAX of their signal numbers over the world group —
  one part of the step's one reduction, made at the end of its backward — and all stop after the same step
  (the step in progress; a signal that comes after its reduction — its update, its metrics line — stops the
  run after the next one, except during the update in a world of one process, which has no one to ask), save one
  checkpoint together and exit with 128 + that signal (130 after Ctrl-C, 143 after SIGTERM), what a shell
  reports for a process the signal ended: a stopped run has not finished, so ``nanoset train ... && next``
  does not go on and ``sbatch --dependency=afternotok:JOB`` can resubmit it;
* a Ctrl-C while a stop is under way exits at once, without a checkpoint of the step.

torchrun starts each worker in its own session, so a worker whose launcher was killed (``kill -9``) would go
on unsupervised: a worker compares its parent with the launcher's pid, taken at its start (and given by
``nanoset train`` in ``NANOSET_LAUNCHER_PID``, in case it died even before). While training it stops after
the step, as on a signal; during start-up a watcher thread ends it, since the main thread may be waiting on
the launcher's store, which no longer answers.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGINT)
LAUNCHED_BY_TORCHRUN = "TORCHELASTIC_RUN_ID"  # set in every worker that torchrun's elastic agent starts
LAUNCHER_PID = "NANOSET_LAUNCHER_PID"  # set by nanoset train for its workers: the process they must outlive never
LAUNCHER_LOST = 64  # the "signal number" a rank contributes to the agreement when its launcher is gone
LAUNCHER_LOST_STATUS = 1
WATCH_INTERVAL_S = 0.2
INTERRUPTED_TWICE = ("interrupted twice: stopped at once, without saving what was in progress; rerun the same "
                     "command to resume from the latest checkpoint")  # said by the launcher, or by a worker alone
STORE_GRACE_S = 2.0  # how long after a broken store connection a worker looks for its launcher's end
# the codes a rank can contribute, in the step's reduction one count each (its MAX is the highest with a count)
AGREED_CODES = (*sorted(int(s) for s in STOP_SIGNALS), LAUNCHER_LOST)


def from_the_store(error: BaseException) -> bool:
    """Whether ``error`` is torch.distributed's own (a store or rendezvous connection): what a launcher that died
    breaks under a worker still starting up."""
    dist = sys.modules.get("torch.distributed")
    dist_error = getattr(dist, "DistError", None) if dist is not None else None
    return dist_error is not None and isinstance(error, dist_error)


def stop_status(signum: int) -> int:
    """The exit status of a run stopped by ``signum`` (after its checkpoint): 128 + the signal, as a shell
    reports a process that signal ended."""
    return 128 + signum


def is_stop_status(status: int) -> bool:
    return status - 128 in {int(s) for s in STOP_SIGNALS}


def ignore_stop_signals() -> None:
    """Once a run has returned (its checkpoints saved, its exit status known), a stop signal has nothing left to
    stop: ignored through the process's teardown, where Python's default handlers would return and turn a
    finished run into one 'killed by SIGTERM'."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def stopped_in_startup(name: str) -> str:
    """The one line of a stop before the first step (said by the launcher, or by each node's first worker)."""
    return (f"stopped by {name} during start-up, before any step: nothing to save; rerun the same command to "
            f"start again")


def leave_a_closed_terminal() -> None:
    """On SIGHUP (a closed terminal or ssh session): a terminal that hung up fails every write (EIO), and the first
    log line would end the run before its checkpoint, so a terminal stdout or stderr now writes to /dev/null
    (metrics.jsonl and the checkpoint keep the run's record); pipes and files keep their output."""
    devnull = None
    for fd in (1, 2):
        try:
            if not os.isatty(fd):
                continue
        except OSError:
            continue
        if devnull is None:
            devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
    if devnull is not None:
        os.close(devnull)


class StopRequested(BaseException):
    """A stop signal during start-up. A BaseException, as KeyboardInterrupt is, so that no ``except Exception``
    of the start-up code swallows it; the entry point says it in one line and exits 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def _launcher_at_start() -> int | None:
    """The launcher this process must outlive: the one ``nanoset train`` names, or torchrun's agent (the parent
    now, at import); None for a process no launcher started."""
    given = os.environ.get(LAUNCHER_PID)
    if given and given.isdigit():
        return int(given)
    return os.getppid() if LAUNCHED_BY_TORCHRUN in os.environ else None


PARENT_AT_START = _launcher_at_start()  # taken at import: train.py imports this module before anything heavy

_installed: StopOnSignal | None = None


class StopOnSignal:
    """A process's stop state: ``install()`` once at its start; ``training()`` around the training loop,
    where every rank agrees once per step (``add_to`` and ``agree_from``, in the step's reduction)."""

    def __init__(self, launcher: int | None = None) -> None:
        self.launcher = launcher
        self.signum: int | None = None  # the first stop signal this process received
        self.launcher_lost = False
        self.agreed_code = 0  # the world's MAX: a signal number, LAUNCHER_LOST, or 0
        self.phase = "start-up"  # then "training"; then how the loop ended: "done", "stopped" or "failed"
        self._holding = 0
        self._previous: dict = {}
        self._watcher: threading.Thread | None = None
        self._lost = threading.Lock()

    # ---------------------------------------------------------------- the process's handlers --------

    def install(self) -> StopOnSignal:
        """Answer the stop signals from now on (and, under a launcher, watch it during start-up)."""
        global _installed
        # SIGTERM last: a launcher forwards a stop once it sees this process catch SIGTERM (agent.py), by then
        # every handler is in place
        self._previous = {sig: signal.signal(sig, self._on_signal)
                          for sig in sorted(STOP_SIGNALS, key=lambda s: s == signal.SIGTERM)}
        _installed = self
        if self.launcher is not None and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch_launcher, name="launcher-watch", daemon=True)
            self._watcher.start()
        return self

    def uninstall(self) -> None:
        global _installed
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        self.phase = "done"  # stops the watcher
        if _installed is self:
            _installed = None

    def _on_signal(self, signum: int, frame) -> None:
        if signum == signal.SIGHUP:
            leave_a_closed_terminal()
        if self.signum is not None:
            if signum == signal.SIGINT:  # Ctrl-C while a stop is under way: now
                print(f"error: {INTERRUPTED_TWICE}", file=sys.stderr, flush=True)
                os._exit(stop_status(signal.SIGINT))
            return  # the same stop again (Slurm signals every process of the step, and torchrun forwards it)
        self.signum = signum
        if self.phase == "start-up" and not self._holding:
            raise StopRequested(signum)
        if self.phase == "done" and os.environ.get("RANK", "0") == "0":  # past the loop: the run ends as it is
            print(f"note: {signal.Signals(signum).name} after the last step: the run finishes what follows it (the "
                  f"final checkpoint, the Hugging Face export) and ends", flush=True)

    @contextmanager
    def held(self) -> Iterator[None]:
        """A start-up step that must not be cut in the middle (moving a run aside): a stop waits for its end."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if self.phase == "start-up" and not self._holding and self.signum is not None:
            raise StopRequested(self.signum)

    def launcher_gone(self) -> bool:
        return self.launcher is not None and os.getppid() != self.launcher

    def end_if_launcher_lost(self, within_s: float = 0.0) -> None:
        """During start-up, under a launcher that is gone (or goes within ``within_s``): one line, then exit.
        The watcher thread calls it every ``WATCH_INTERVAL_S``; the main thread after an error of the launcher's
        store, whose connection breaks as the launcher dies, a moment before this process gets another parent."""
        deadline = time.monotonic() + within_s
        while self.launcher is not None:
            if self.launcher_gone():
                with self._lost:  # one line, whichever thread sees it first; the other waits for the exit
                    try:
                        print(f"error: the launcher (pid {self.launcher}) is gone; this worker stops before training",
                              file=sys.stderr, flush=True)
                    finally:
                        os._exit(LAUNCHER_LOST_STATUS)
            if time.monotonic() >= deadline:
                return
            time.sleep(WATCH_INTERVAL_S / 4)

    def _watch_launcher(self) -> None:
        while self.phase == "start-up":
            if not self._holding:
                self.end_if_launcher_lost()
            time.sleep(WATCH_INTERVAL_S)

    # ---------------------------------------------------------------- the training loop -----------

    @contextmanager
    def training(self) -> Iterator[StopOnSignal]:
        """From here a signal only sets the flag; the loop stops after the step the ranks agree on. How the loop
        ends decides what a later signal means: after its last step ("done") the run finishes what follows (the
        final checkpoint, the export) and says so; after the agreed stop ("stopped") it is the same stop again;
        after an error ("failed": a bug, or a collective broken by a rank that died) nothing follows but the
        process's end, which torchrun's agent hastens with SIGTERM: no note either."""
        self.phase = "training"
        try:
            yield self
        except BaseException:
            self.phase = "failed"
            raise
        self.phase = "stopped" if self.agreed_code else "done"

    def _own_code(self) -> int:
        """This rank's stop code: its signal, LAUNCHER_LOST once its launcher is gone, or 0."""
        if self.signum is None and not self.launcher_lost and self.launcher_gone():
            self.launcher_lost = True
        return self.signum or (LAUNCHER_LOST if self.launcher_lost else 0)

    def agreed(self, device) -> bool:
        """True on every rank as soon as any rank has received a stop signal (or lost its launcher): one
        all-reduce of its own (after a checkpoint's save; each step uses ``add_to`` and ``agree_from``)."""
        import torch
        import torch.distributed as dist

        code = torch.tensor([self._own_code()], device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(code, op=dist.ReduceOp.MAX)
        self.agreed_code = int(code.item())
        return self.agreed_code != 0

    def add_to(self, reduction) -> None:
        """This rank's stop code as a part of the step's reduction (``runtime.parallel.step_reduction``): one
        count per possible code, so that the world's sum says the highest code any rank has, as a MAX would.
        The code is taken when the reduction is made (the end of the step's backward), so a signal that comes
        during the step stops the run after it."""
        reduction.add("stop", lambda: [float(self._own_code() == c) for c in AGREED_CODES])

    def agree_from(self, reduction) -> bool:
        """``agreed`` from the step's reduced, read ``reduction`` (right after the step's update): no collective
        of its own. A process alone in its world has no one to agree with: a signal that came after the
        reduction (during the step's update) stops it after this step too."""
        counts = reduction.values("stop")
        self.agreed_code = max((c for c, n in zip(AGREED_CODES, counts) if n > 0), default=0)
        if not self.agreed_code and not _in_a_larger_world():
            self.agreed_code = self._own_code()
        return self.agreed_code != 0

    @property
    def reason(self) -> str | None:
        """What stopped the run, for its last line: the signal (every rank names the same one)."""
        if not self.agreed_code:
            return None
        if self.agreed_code == LAUNCHER_LOST:
            return (f"the loss of the launcher (pid {self.launcher})" if self.launcher_lost
                    else "the loss of another node's launcher")
        name = signal.Signals(self.agreed_code).name
        return name if self.agreed_code == self.signum else f"{name} (sent to another rank)"

    @property
    def exit_status(self) -> int:
        """128 + the agreed signal; 1 after the loss of a launcher; 0 when nothing stopped the run."""
        if not self.agreed_code:
            return 0
        return LAUNCHER_LOST_STATUS if self.agreed_code == LAUNCHER_LOST else stop_status(self.agreed_code)


def _in_a_larger_world() -> bool:
    """Whether this process trains with others (a process group of more than one rank)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_initialized() and dist.get_world_size() > 1


def installed() -> StopOnSignal | None:
    """The stop state ``runtime/train.py`` installed for this process, if any."""
    return _installed


@contextmanager
def stop_on_signal() -> Iterator[StopOnSignal]:
    """The training loop's stop state: the process's own, or (a trainer run from another script) one installed
    for the loop and removed after it."""
    stop = _installed
    owned = stop is None
    if owned:
        stop = StopOnSignal(PARENT_AT_START).install()
    try:
        with stop.training():
            yield stop
    finally:
        if owned:
            stop.uninstall()


def ignore_in_loader_worker() -> None:
    """In a loader worker process: Slurm signals every process of the job step, and a worker killed by
    it would crash the step the trainer finishes before it saves. SIGUSR1, SIGHUP and SIGINT are ignored;
    SIGTERM is too, unless it comes from the worker's parent (the loader ends a worker that would not stop
    with it)."""
    for sig in (signal.SIGUSR1, signal.SIGHUP, signal.SIGINT):  # Ctrl-C reaches the terminal's whole group
        signal.signal(sig, signal.SIG_IGN)
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken by the thread below, never delivered

    def wait() -> None:
        while True:
            if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=wait, name="sigterm-from-parent", daemon=True).start()
