"""Checkpoints written in the background (``checkpoints.async_save``): the loop blocks only while the state is
copied to host memory (DCP's ``async_save``; on CUDA into pinned buffers kept from one save to the next), and a
thread writes the copy under the checkpoint's temporary name.

The write runs DCP's collectives on a gloo group of its own, so that they never interleave with the training
step's on the default group. A checkpoint in the background is not yet a checkpoint: global rank 0 renames it
into place and points ``latest`` at it only once its write is complete (DCP's last step gathers every rank's
write to rank 0, so rank 0's write ending means every rank's has), so a kill during the write leaves the
previous checkpoint as ``latest``. Every rank waits for the write in flight before the next save and at the end
of training, and agrees there on whether it failed.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter


@dataclass
class BackgroundWrite:
    """One checkpoint being written: its DCP future, its temporary folder and final name."""

    step: int
    tmp: Path
    final: Path
    future: Future
    began: float = field(default_factory=time.perf_counter)
    outcome: str | None = None  # once rank 0 has put it in place: "" when it is, else what went wrong


class BackgroundWriter:
    """Starts DCP's asynchronous saves of one run, one at a time."""

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned  # CUDA: stage into pinned host buffers, kept for the next save
        self._group = None
        self._writer: FileSystemWriter | None = None

    def start(self, state: dict, tmp: Path) -> Future:
        """Copy ``state`` to host memory (the loop's only wait), then write it to ``tmp`` in a thread; the write's
        future. Every rank calls it together."""
        if self._group is None:  # collective: made at the first save, which every rank reaches together
            self._group = dist.new_group(backend="gloo")
        if self._writer is None or not self.pinned:
            self._writer = FileSystemWriter(str(tmp), cache_staged_state_dict=self.pinned)
        return dcp.async_save(state, checkpoint_id=str(tmp), storage_writer=self._writer, process_group=self._group)
