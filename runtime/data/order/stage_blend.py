"""The one interface of a stage part's blend, whatever decides its weights: constant weights (``blend``), a weight
schedule (``scheduled_blend``) or weights decided during the run (``adaptive_blend``).

The plan, the loaders and the reports ask a part's blend, never its kind: where a sample is drawn from
(``locate``, ``position``), what the first samples draw (``draws``), the weights at a step and as shown, how many
of the part's samples are decided, and what a checkpoint records of it. ``part_blend`` builds the blend of a part.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from nanoset.errors import ConfigError
from runtime.data.order.adaptive_blend import AdaptiveBlend
from runtime.data.order.blend import BlendSchedule
from runtime.data.order.scheduled_blend import ScheduledBlend, WeightSchedule

MAX_TABLE_BYTES = 16 << 30  # a weight schedule's per-step counts (int64, steps × datasets) held in memory at most


class Blend(Protocol):
    """Maps a part's samples to (dataset of the part, draw within the part) and answers what the part shows and
    records of its weights."""

    kind: str  # periodic | scheduled | adaptive, as recorded
    weights: list[float]  # constant: as given; a schedule: its normalised weights at the part's first step;
    #                       adaptive: the initial weights
    schedule: WeightSchedule | None  # the weight schedule of a scheduled blend
    options: dict | None  # adaptive mixing's options (``record.adaptive_options``) of an adaptive blend

    def locate(self, j: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]: ...

    def position(self, dataset: np.ndarray, draw: np.ndarray) -> np.ndarray: ...

    def draws(self, num_samples: int) -> np.ndarray: ...

    def weights_at(self, step: int) -> list[float]:
        """The normalised weights the blend draws with at global ``step``."""

    def weights_shown(self) -> list[str]:
        """Each dataset's weight as the plan and the log show it."""

    def decided_samples(self, num_samples: int) -> int:
        """How many of the part's first ``num_samples`` samples are decided (all but an adaptive part's future)."""

    def record(self, last_step: int) -> dict:
        """The blend's fields of a checkpoint's ``PartRecord`` once global steps ``1..last_step`` are done."""


def part_blend(weights: list[float] | None, schedule: WeightSchedule | None, adaptive: dict | None, start: int,
               num_steps: int, global_batch: int, deviation: np.ndarray | None = None,
               decided: list[list[float]] = (), cache_dir: str | Path | None = None, where: str = "") -> Blend:
    """The blend of a part of ``num_steps`` steps from global step ``start``: adaptive (``adaptive``: its options,
    ``decided``: the weights of its blocks 3, 4, ... known so far), scheduled (``deviation``: what the previous
    part over the same datasets left) or constant. ``where``: the config key of its weights, for a refusal."""
    if schedule is not None and (num_steps + 2) * schedule.num_datasets * 8 > MAX_TABLE_BYTES:
        size = (num_steps + 2) * schedule.num_datasets * 8 / 2**30
        raise ConfigError(f"{where}: a weight schedule over {num_steps:,} steps needs {size:,.0f} GiB of per-step "
                          f"counts, more than {MAX_TABLE_BYTES >> 30} GiB; end the stage earlier and go on with "
                          f"constant weights in a later stage")
    if adaptive is not None:
        blend = AdaptiveBlend(adaptive["initial"], adaptive["every"], start, num_steps, global_batch, adaptive)
        for w in decided:
            blend.add_block(w)
        return blend
    if schedule is not None:
        return ScheduledBlend(schedule, start, num_steps, global_batch, deviation, cache_dir)
    return BlendSchedule(weights)
