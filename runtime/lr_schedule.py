"""Learning-rate schedules as pure functions of the step: exact after any resume.

Linear warm-up from 0 to the peak over ``warmup_steps``, then ``cosine``, ``linear`` or
``constant`` decay to ``min_lr`` at the last step, or ``wsd``: warm-up, stable at the peak,
then a linear decay to ``min_lr`` over the last ``wsd_decay_fraction`` of the steps after warm-up.
The run's schedule spans steps 1 to ``tokens.train_steps``; a stage's own schedule spans the stage's steps.
"""

from __future__ import annotations

import math

from runtime.config import LRSchedulerArgs


class LRSchedule:
    def __init__(self, args: LRSchedulerArgs, peak_lr: float, train_steps: int, first_step: int = 1) -> None:
        """``train_steps``: the schedule's last global step; ``first_step``: its first (its warm-up's step 1)."""
        self.args = args
        self.peak = peak_lr
        self.last = train_steps
        self.first = first_step
        self.total = train_steps - first_step + 1  # the steps it spans

    def lr_at(self, step: int) -> float:
        """Learning rate used by global step ``step`` (1-based)."""
        a = self.args
        step = step - self.first + 1  # counted from the schedule's first step
        if a.warmup_steps and step <= a.warmup_steps:
            return self.peak * step / a.warmup_steps
        span = max(self.total - a.warmup_steps, 1)
        progress = min(max((step - a.warmup_steps) / span, 0.0), 1.0)
        if a.decay_style == "constant":
            return self.peak
        if a.decay_style == "linear":
            factor = 1.0 - progress
        elif a.decay_style == "cosine":
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:  # wsd
            stable = 1.0 - a.wsd_decay_fraction
            factor = 1.0 if progress <= stable else 1.0 - (progress - stable) / a.wsd_decay_fraction
        return a.min_lr + (self.peak - a.min_lr) * factor

    def apply(self, optimizer, step: int) -> float:
        lr = self.lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    def state_dict(self) -> dict:
        first = {"first_step": self.first} if self.first != 1 else {}
        return {"peak_lr": self.peak, "train_steps": self.last, **first, **self.args.__dict__}

    def describe(self) -> str:
        """The schedule in words, for ``--check``: ``lr 1e-05 (warm-up 2, cosine to 0)``."""
        a = self.args
        warmup = f"warm-up {a.warmup_steps}, " if a.warmup_steps else ""
        decay = "constant" if a.decay_style == "constant" else f"{a.decay_style} to {a.min_lr:g}"
        return f"lr {self.peak:g} ({warmup}{decay})"
