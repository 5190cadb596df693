"""Adaptive mixing in a run: the decisions of its adaptive stages, their log and what a checkpoint keeps of them.

Each step's per-source sums (``StepResult.sources``: reduced in the step's one all-reduce and read back on every
rank) go to the stage's ``StageMixer`` on every rank; at a block's last step each rank decides the same weights
and adds them to its plan, and global rank 0 appends the decision to ``mixing.jsonl``. A checkpoint keeps the
mixers' state under one key (``CHECKPOINT_KEY``); the decisions themselves are in the data record.

A rule that decides differently on some rank (it read ``RANK``, a clock, an unseeded generator) would train
batches that no log describes: the next step's reduction carries a hash of each rank's decision (``add_to``),
and every rank stops with one line when they differ (``agree_from``), before any step draws with the weights.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from pathlib import Path

from nanoset.errors import ConfigError
from runtime.data.order.mixer import StageMixer
from runtime.data.order.plan import DataPlan
from runtime.observe.mixing_log import append_decision, cut_after, log_path
from runtime.observe.observer import StepObserver, TrainedStep

CHECKPOINT_KEY = "mixing"
AGREEMENT = "mixing_agreement"  # the step reduction's part: a count of ranks, then per 16-bit hash chunk h: h, h²
_CHUNKS = 3  # 48 bits of the decision's hash; h² summed over ranks stays an exact float64 up to 2^21 ranks


def describe_decision(row: dict, path: Path) -> str:
    """The console line of a decision (every one is printed, and logged in full in ``path``)."""
    weights = ", ".join(f"{folder} {w:.4f}" for folder, w in zip(row["datasets"], row["weights"]))
    first, last = row["steps"]
    return (f"mixing: stage {row['stage']!r} block {row['decides_block']} (steps {first}-{last}): {weights}; decided "
            f"at step {row['step']} by {row['rule']} (inputs and state: {path})")


def decision_hash(row: dict) -> list[int]:
    """The decided weights (their float64 bits) as ``_CHUNKS`` 16-bit numbers."""
    digest = hashlib.blake2b(struct.pack(f"<{len(row['weights'])}d", *row["weights"]), digest_size=2 * _CHUNKS)
    return list(struct.unpack(f"<{_CHUNKS}H", digest.digest()))


class RunMixing(StepObserver):
    """The adaptive stages of a run, a step observer (a step surgery skips counts no statistics, but a block's
    decision is still due at its end)."""

    checkpoint_key = CHECKPOINT_KEY

    def __init__(self, plan: DataPlan, run_dir: Path, is_main: bool, info: Callable[[str], None] = print) -> None:
        self.plan, self.is_main, self.info = plan, is_main, info
        self.path = log_path(run_dir)
        self.saved: dict = {}  # what the checkpoint it resumes from kept, per adaptive stage not begun again yet
        self.mixers: dict[str, StageMixer] = {}
        self.unchecked: dict | None = None  # the last decision's row, until the next step's reduction compares it

    def start(self, resumed_step: int) -> None:
        """On every start: the log keeps the decisions made by ``resumed_step`` (0 when fresh); later ones are
        decided again."""
        if self.is_main:
            cut_after(self.path, resumed_step)

    def after_step(self, step: TrainedStep) -> None:
        """Count the step's statistics; at a block's end decide (every rank) and log the decision (rank 0)."""
        stage = step.stage
        if stage.adaptive is None:
            return
        mixer = self.mixers.get(stage.name)
        if mixer is None or mixer.stage is not stage:
            mixer = self.mixers[stage.name] = StageMixer(self.plan, stage, self.saved.pop(stage.name, None))
        row = mixer.observe(step.step, step.result.sources if step.result is not None else None)
        if row is not None:
            self.unchecked = row
            if self.is_main:
                append_decision(self.path, row)
                self.info(describe_decision(row, self.path))

    def add_to(self, reduction) -> None:
        """This rank's part of the step's reduction: its last decision's hash (zeros when none is to be checked:
        every rank decides at the same steps)."""
        hashed = decision_hash(self.unchecked) if self.unchecked is not None else [0] * _CHUNKS
        reduction.add(AGREEMENT, [1.0, *(float(v) for h in hashed for v in (h, h * h))])

    def agree_from(self, reduction) -> None:
        """Raise on every rank (the reduced sums are the same everywhere) when the ranks decided different weights:
        with ``n`` ranks, ``(Σh)² = n·Σh²`` holds exactly when every rank's ``h`` is the same."""
        row, self.unchecked = self.unchecked, None
        if row is None:
            return
        n, *sums = (int(v) for v in reduction.values(AGREEMENT))
        if any(total * total != n * squares for total, squares in zip(sums[::2], sums[1::2])):
            raise ConfigError(f"stage {row['stage']!r}: the rule {row['rule']!r} decided different weights on "
                              f"different ranks at step {row['step']} (block {row['decides_block']}; this rank: "
                              f"{row['weights']}); a rule must decide from its history alone (not RANK, a clock or "
                              f"an unseeded random generator)")

    def state_dict(self) -> dict:
        """What a checkpoint keeps: per adaptive stage begun, its rule state, block in progress and history."""
        return {**self.saved, **{name: m.saved() for name, m in self.mixers.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.saved = dict(state)
