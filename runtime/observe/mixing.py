"""Adaptive mixing in a run: the decisions of its adaptive stages, their log and what a checkpoint keeps of them.

Each step's per-source sums (``StepResult.sources``: reduced in the step's one all-reduce and read back on every
rank) go to the stage's ``StageMixer`` on every rank; at a block's last step each rank decides the same weights
and adds them to its plan, and global rank 0 appends the decision to ``mixing.jsonl``. A checkpoint keeps the
mixers' state under one key (``CHECKPOINT_KEY``); the decisions themselves are in the data record.
"""

from __future__ import annotations

from pathlib import Path

from runtime.data.order.mixer import StageMixer
from runtime.data.order.plan import DataPlan
from runtime.observe.mixing_log import append_decision, cut_after, log_path
from runtime.observe.observer import StepObserver, TrainedStep

CHECKPOINT_KEY = "mixing"


class RunMixing(StepObserver):
    """The adaptive stages of a run, a step observer (a step surgery skips counts no statistics, but a block's
    decision is still due at its end)."""

    checkpoint_key = CHECKPOINT_KEY

    def __init__(self, plan: DataPlan, run_dir: Path, is_main: bool) -> None:
        self.plan, self.is_main = plan, is_main
        self.path = log_path(run_dir)
        self.saved: dict = {}  # what the checkpoint it resumes from kept, per adaptive stage not begun again yet
        self.mixers: dict[str, StageMixer] = {}

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
        if row is not None and self.is_main:
            append_decision(self.path, row)

    def state_dict(self) -> dict:
        """What a checkpoint keeps: per adaptive stage begun, its rule state, block in progress and history."""
        return {**self.saved, **{name: m.saved() for name, m in self.mixers.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.saved = dict(state)
