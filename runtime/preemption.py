"""Stopping cleanly: on a cluster's warning signal, SIGTERM (Slurm's default before a kill) or SIGUSR1
(``sbatch --signal=USR1@120``), on Ctrl-C (SIGINT), and when the launcher is gone.

The handler only sets a flag. A signal can reach the ranks at different steps (or only some of
them), so after every step the ranks take the MAX of their flags over the world group — one
scalar all-reduce — and all stop after the same step, save one checkpoint together and exit (0
after SIGTERM or SIGUSR1, 130 after Ctrl-C). A second Ctrl-C exits at once. torchrun starts each
worker in its own session, so a worker whose agent was killed (``kill -9``) would train on
unsupervised to the end: a worker notices that its parent changed and stops the same way.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
LAUNCHED_BY_TORCHRUN = "TORCHELASTIC_RUN_ID"  # set in every worker that torchrun's elastic agent starts


class StopOnSignal:
    """A context installed around the training loop; ``agreed()`` is called once per step on every rank."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.received: str | None = None  # what stops this rank (a signal's name), for the message
        self._previous: dict = {}
        self._parent = os.getppid() if LAUNCHED_BY_TORCHRUN in os.environ else None

    def __enter__(self) -> StopOnSignal:
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.received == "SIGINT":  # the second Ctrl-C: now
            print("interrupted twice: exiting without a checkpoint of this step", file=sys.stderr, flush=True)
            os._exit(128 + signal.SIGINT)
        self.received = signal.Signals(signum).name

    @property
    def exit_status(self) -> int:
        """The status a run stopped this way exits with: 130 after Ctrl-C, else 0 (a planned stop)."""
        return 128 + signal.SIGINT if self.received == "SIGINT" else 0

    def agreed(self) -> bool:
        """True on every rank as soon as any rank has received a signal (or lost its launcher)."""
        if self._parent is not None and self.received is None and os.getppid() != self._parent:
            self.received = f"the loss of the launcher (torchrun, pid {self._parent})"
        flag = torch.tensor([int(self.received is not None)], device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def ignore_in_loader_worker() -> None:
    """In a loader worker process: Slurm signals every process of the job step, and a worker killed by
    it would crash the step the trainer finishes before it saves. SIGUSR1 and SIGINT are ignored; SIGTERM is too,
    unless it comes from the worker's parent (the loader ends a worker that would not stop with it)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the terminal's whole process group
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken by the thread below, never delivered

    def wait() -> None:
        while True:
            if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=wait, name="sigterm-from-parent", daemon=True).start()
