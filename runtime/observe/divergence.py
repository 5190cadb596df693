"""The divergence guard: a run whose steps keep being non-finite (skipped) has diverged; it stops, naming where to
resume. The count of skipped steps in a row is kept in checkpoints, so that a resumed diverging run stops where
an uninterrupted one would; the steps surgery skips neither count nor end a run of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nanoset.errors import NanosetError
from runtime.data.order.surgery import Surgery
from runtime.observe.observer import StepObserver, TrainedStep


class DivergenceGuard(StepObserver):
    """``limit_at``: a step's ``optimizer.max_skipped_steps`` (its stage's); ``newest_finite``: the newest checkpoint
    of a finite step (where to resume); ``spikes_skip``: whether spikes are skipped too (``surgery.spike.action:
    skip``); ``release``: writes the metrics row held for the checkpoint a stopped run will not save."""

    def __init__(self, limit_at: Callable[[int], int], surgery: Surgery, newest_finite: Callable[[], Path | None],
                 spikes_skip: bool, release: Callable[[], None]) -> None:
        self.limit_at, self.surgery, self.newest_finite = limit_at, surgery, newest_finite
        self.spikes_skip, self.release = spikes_skip, release
        self.skipped_in_a_row = 0  # non-finite steps since the last finite one

    def after_step(self, step: TrainedStep) -> None:
        if step.result is None:  # a step surgery skips
            return
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if step.result.skipped else 0
        limit = self.limit_at(step.step)
        if self.skipped_in_a_row <= limit:
            return
        last = step.step
        first = self._streak_start(last)
        between = [f"{max(a, first)}-{min(b, last)}" for a, b in self.surgery.skip_steps if a <= last and b >= first]
        counted = f" (steps {', '.join(between)}, skipped by surgery, between them not counted)" if between else ""
        good = self.newest_finite()
        where = (f"the newest checkpoint of a finite step is {good}: resume from it (checkpoints.resume: {good})"
                 if good is not None else "no checkpoint of a finite step was saved: start over")
        spikes = " or were spikes (surgery.spike.action: skip)" if self.spikes_skip else ""
        self.release()
        raise NanosetError(f"steps {first}-{last}: {self.skipped_in_a_row} steps in a row had a non-finite loss "
                           f"or gradient norm{spikes} and were skipped{counted} "
                           f"(optimizer.max_skipped_steps {limit}); the run has diverged: {where} with a lower "
                           f"optimizer.learning_rate")

    def _streak_start(self, step: int) -> int:
        """The first step of the run of non-finite steps ending at ``step``: the steps surgery skips inside it
        neither count nor end it."""
        left = self.skipped_in_a_row
        while left > 1 or self.surgery.skips(step):
            left -= not self.surgery.skips(step)
            step -= 1
        return step
