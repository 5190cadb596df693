"""One part of a data stage: its global steps, batch, datasets and blend; what it reads of each dataset; where
its samples come from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from runtime.data.order.scheduled_blend import WeightSchedule
from runtime.data.order.stage_blend import Blend


@dataclass
class StagePlan:
    """Global steps ``[start_step, end_step)`` of one data stage and how their samples are drawn.

    Normally one per config stage; a stage whose data or global batch size a resume changed has
    two (same ``index`` and ``name``): the recorded part and the part from the resume step on.
    """

    index: int
    name: str
    start_step: int
    end_step: int
    sequence_length: int
    global_batch_size: int
    seed: int
    use_position_ids: bool
    num_loading_workers: int
    prefetch: int
    dataset_ids: list[int]  # indices into DataPlan.datasets, in the stage's folder order
    folders: list[str]  # the resolved folder the stage names for each (recorded; a copy is read as its dataset)
    blend: Blend
    draw_offsets: np.ndarray = field(repr=False)  # draws taken by earlier stages, per stage dataset

    @property
    def num_steps(self) -> int:
        return self.end_step - self.start_step

    @property
    def num_samples(self) -> int:
        return self.num_steps * self.global_batch_size

    @property
    def weights(self) -> list[float]:
        """Constant weights as given; with a schedule, its normalised weights at ``start_step``; adaptive: the
        initial weights."""
        return self.blend.weights

    @property
    def schedule(self) -> WeightSchedule | None:
        """The weight schedule of a scheduled blend."""
        return self.blend.schedule

    @property
    def adaptive(self) -> dict | None:
        """Adaptive mixing's options (``record.adaptive_options``) of an adaptive blend."""
        return self.blend.options

    def consumed_samples(self, last_step: int) -> int:
        """Stage samples used once global steps ``1..last_step`` are done."""
        done = min(max(last_step - self.start_step + 1, 0), self.num_steps)
        return done * self.global_batch_size

    def decided_samples(self) -> int:
        """The part's samples whose weights are decided (all but an adaptive part's future)."""
        return self.blend.decided_samples(self.num_samples)

    def weights_at(self, step: int) -> list[float]:
        """The normalised weights the blend draws with at global ``step`` (constant, scheduled or decided)."""
        return self.blend.weights_at(step)

    def weights_shown(self) -> list[str]:
        """Each dataset's weight as the plan and the log show it; with a schedule, its weights at the part's first
        and last steps (``0.9 → 0.2 by schedule``)."""
        return self.blend.weights_shown()

    def add_draws(self, totals: dict[int, int], samples: int | None = None) -> None:
        """Set ``totals`` to the draws of each dataset of the part after its first ``samples`` samples (default all;
        at most its decided samples: a later stage's offsets follow once an adaptive stage is decided)."""
        samples = self.decided_samples() if samples is None else min(samples, self.decided_samples())
        for d, offset, n in zip(self.dataset_ids, self.draw_offsets.tolist(), self.blend.draws(samples).tolist()):
            totals[d] = offset + n


@dataclass(frozen=True)
class DatasetReads:
    """What one stage part draws from one of its datasets: ``samples`` after the ``offset`` earlier parts drew."""

    dataset: int  # index into DataPlan.datasets
    offset: int
    samples: int
    dataset_samples: int  # the dataset's own samples (one epoch)

    @property
    def epochs(self) -> float:
        return self.samples / self.dataset_samples

    @property
    def end_epoch(self) -> float:
        """How far into the dataset (in epochs) the part's last draw is."""
        return (self.offset + self.samples) / self.dataset_samples

    @property
    def repeats(self) -> bool:
        """Whether the part reads past the dataset's first epoch: some of its samples come a second time."""
        return self.offset + self.samples > self.dataset_samples


@dataclass
class SampleLocation:
    """Where samples come from: per sample, the dataset index, window index and epoch, and ``source``: the
    index of its dataset among the stage's (``StagePlan.dataset_ids``), what per-source metrics count by."""

    dataset: np.ndarray
    sample: np.ndarray
    epoch: np.ndarray
    source: np.ndarray
