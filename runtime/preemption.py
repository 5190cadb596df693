"""Stopping on a cluster's warning signal: SIGTERM (Slurm's default before a kill) or SIGUSR1
(``sbatch --signal=USR1@120``).

The handler only sets a flag. A signal can reach the ranks at different steps (or only some of
them), so after every step the ranks take the MAX of their flags over the world group — one
scalar all-reduce — and all stop after the same step, save one checkpoint together and exit 0.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopOnSignal:
    """A context installed around the training loop; ``agreed()`` is called once per step on every rank."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.received: str | None = None  # the signal this rank got, for the message
        self._previous: dict = {}

    def __enter__(self) -> StopOnSignal:
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame) -> None:
        self.received = signal.Signals(signum).name

    def agreed(self) -> bool:
        """True on every rank as soon as any rank has received a signal."""
        flag = torch.tensor([int(self.received is not None)], device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
