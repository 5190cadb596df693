"""Blending with weights decided during the run: constant per block of ``every`` steps, block by block.

Blocks 1 and 2 of the stage use the initial weights; the weights of every later block ``b + 2`` are
decided at the end of block ``b`` (see ``mixing_rules``) and added here in order. Each block is the
scheduled blend's rule (``scheduled_blend.allocate``) with that block's weights, its state (the
deviation from the targets, or for two datasets the running cumulative target) carried from block to
block, so the realised counts keep the scheduled blend's bound against the decided weights.

Only decided steps can be located: a sample beyond them raises ``NotDecided``, never a guess. The counts are kept
for the decided steps only, so memory follows the steps trained, not the stage's length.
"""

from __future__ import annotations

import numpy as np

from nanoset.errors import NanosetError
from runtime.data.order.scheduled_blend import MAX_GLOBAL_BATCH, ScheduledBlend, allocate


class NotDecided(NanosetError):
    """A step of an adaptive stage whose weights are not decided (yet, or in the log at hand)."""


class AdaptiveBlend(ScheduledBlend):
    """Maps part sample ``j`` to (dataset, draw within the part) and back, for the decided blocks of an adaptive
    stage starting at ``start_step`` (block 1 begins there)."""

    kind = "adaptive"
    schedule = None

    def __init__(self, initial: list[float], every: int, start_step: int, num_steps: int, global_batch: int,
                 options: dict | None = None) -> None:
        """``options``: adaptive mixing's options as recorded (``record.adaptive_options``)."""
        if not 0 < global_batch < MAX_GLOBAL_BATCH:
            raise ValueError(f"an adaptive blend needs a global batch in [1, {MAX_GLOBAL_BATCH}), got {global_batch}")
        self.every = int(every)
        self.options = options
        self.weights = [float(w) for w in initial]
        self.start_step, self.num_steps, self.global_batch = start_step, num_steps, global_batch
        self.k = len(initial)
        self.initial_deviation = np.zeros(self.k)
        self.deviation = self.initial_deviation
        self._running: object = None
        self.cumulative = np.zeros((1, self.k), dtype=np.int64)  # rows 0..decided_steps (and room to grow)
        self.decided_steps = 0
        self.block_weights: list[list[float]] = []  # the weights of blocks 1, 2, ... decided so far
        total = float(sum(initial))
        first = [float(w) / total for w in initial]
        for _ in range(2):
            self.add_block(first)

    @property
    def num_datasets(self) -> int:
        return self.k

    @property
    def num_blocks(self) -> int:
        """Blocks of the part (the last one may be shorter)."""
        return -(-self.num_steps // self.every)

    def block_of(self, step: int) -> int:
        """The 1-based block of global ``step``."""
        return (step - self.start_step) // self.every + 1

    def block_steps(self, block: int) -> tuple[int, int]:
        """The first and last global step of ``block``."""
        first = self.start_step + (block - 1) * self.every
        return first, min(first + self.every, self.start_step + self.num_steps) - 1

    def add_block(self, weights: list[float]) -> None:
        """The weights of the next block (normalised already); beyond the part's last block they are kept, unused."""
        b = len(self.block_weights)
        self.block_weights.append([float(w) for w in weights])
        lo, hi = b * self.every, min(self.num_steps, (b + 1) * self.every)
        if lo >= self.num_steps:
            return
        if hi >= len(self.cumulative):  # grow with the decisions, never to the part's length at once
            grown = np.zeros((min(self.num_steps, max(hi, 2 * len(self.cumulative))) + 1, self.k), dtype=np.int64)
            grown[: len(self.cumulative)] = self.cumulative
            self.cumulative = grown
        shares = np.tile(np.asarray(weights, dtype=np.float64), (hi - lo, 1))
        counts, self.deviation, self._running = allocate(shares, self.global_batch, self.initial_deviation,
                                                         self._running)
        np.cumsum(counts, axis=0, out=self.cumulative[lo + 1 : hi + 1])
        self.cumulative[lo + 1 : hi + 1] += self.cumulative[lo]
        self.decided_steps = hi

    def _undecided(self, step: int) -> NotDecided:
        last = self.start_step + self.decided_steps - 1
        return NotDecided(f"step {step} of an adaptive stage is not decided: the weights are known for "
                          f"blocks 1-{len(self.block_weights)} (steps up to {last})")

    def _check(self, j: np.ndarray) -> None:
        super()._check(j)
        if j.size and int(j.max()) >= self.decided_steps * self.global_batch:
            raise self._undecided(self.start_step + int(j.max()) // self.global_batch)

    def draws(self, num_samples: int) -> np.ndarray:
        if num_samples > self.decided_steps * self.global_batch:
            raise self._undecided(self.start_step + (num_samples - 1) // self.global_batch)
        return super().draws(num_samples)

    def decided_samples(self, num_samples: int) -> int:
        return min(num_samples, self.decided_steps * self.global_batch)

    def weights_at(self, step: int) -> list[float]:
        return list(self.block_weights[self.block_of(step) - 1])

    def weights_shown(self) -> list[str]:
        return [f"{w:g} then adaptive" for w in self.weights]

    def record(self, last_step: int) -> dict:
        """With the decisions made by the end of ``last_step`` (block b's, at its last step, for block b + 2)."""
        finished = max(0, min(last_step - self.start_step + 1, self.num_steps)) // self.every
        return {"weights": None, "blend": self.kind, "schedule": None, "adaptive": self.options,
                "decisions": [list(w) for w in self.block_weights[2 : 2 + finished]]}

    def position(self, dataset: np.ndarray, draw: np.ndarray) -> np.ndarray:
        """As the scheduled blend's, over the decided steps (a draw past them is outside the part's known range)."""
        full, steps = self.cumulative, self.num_steps
        self.cumulative, self.num_steps = full[: self.decided_steps + 1], self.decided_steps
        try:
            return super().position(dataset, draw)
        finally:
            self.cumulative, self.num_steps = full, steps
