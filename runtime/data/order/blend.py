"""Weighted blending of datasets by a periodic, greedy, error-minimising schedule.

Weights are rounded to integer counts over a period P (largest remainder, every dataset at
least once). One period is interleaved greedily - at each slot the dataset furthest behind its
target share goes next (Megatron's rule) - so every prefix of the stream is within one sample of
its target. Sample j of the blended stream is then (dataset, draw number) in O(1).

P is 1000 up to 100 datasets and grows with their number beyond (10 slots per dataset on
average), so any number of folders can be blended and weights keep their meaning; memory stays
O(P), not O(P · datasets).
"""

from __future__ import annotations

import numpy as np

DEFAULT_PERIOD = 1000
SLOTS_PER_DATASET = 10


def default_period(num_datasets: int) -> int:
    """The blend period for ``num_datasets`` datasets: 1000, or 10 slots per dataset when more."""
    return max(DEFAULT_PERIOD, SLOTS_PER_DATASET * num_datasets)


def round_weights(weights: list[float], period: int) -> np.ndarray:
    """Integer counts per period, proportional to ``weights``, summing to ``period``, each ≥ 1."""
    w = np.asarray(weights, dtype=np.float64)
    if len(w) == 0 or (w <= 0).any() or not np.isfinite(w).all():
        raise ValueError(f"blend weights must be positive finite numbers, got {list(weights)}")
    if period < len(w):
        raise ValueError(f"blend period {period} is shorter than the number of datasets {len(w)}")
    share = w / w.sum() * period
    counts = np.maximum(np.floor(share).astype(np.int64), 1)
    while counts.sum() < period:  # largest remainder first
        counts[int(np.argmax(share - counts))] += 1
    while counts.sum() > period:
        counts[int(np.argmax(np.where(counts > 1, counts - share, -np.inf)))] -= 1
    return counts


class BlendSchedule:
    """Maps blended sample ``j`` to (dataset index, draw number of that dataset) in O(1), and back."""

    kind = "periodic"
    schedule = None
    options = None

    def __init__(self, weights: list[float], period: int | None = None) -> None:
        self.weights = list(weights)
        if len(weights) == 1:
            period = 1
        self.counts = round_weights(weights, period if period is not None else default_period(len(weights)))
        self.period = int(self.counts.sum())
        d = len(self.counts)
        slots = np.empty(self.period, dtype=np.int64)
        taken = np.zeros(d, dtype=np.int64)
        for i in range(self.period):
            behind = self.counts * (i + 1) / self.period - taken
            k = int(np.argmax(behind))
            slots[i] = k
            taken[k] += 1
        self.slots = slots
        # rank_in_period[i] = how many earlier slots of this period go to dataset slots[i]
        order = np.argsort(slots, kind="stable")
        first = np.concatenate(([0], np.cumsum(self.counts)[:-1]))
        self.rank_in_period = np.empty(self.period, dtype=np.int64)
        self.rank_in_period[order] = np.arange(self.period) - first[slots[order]]
        self._slots_by_dataset, self._first = order, first  # slot of dataset d's r-th sample: [first[d] + r]

    def locate(self, j: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """(dataset index, draw number within that dataset) of blended samples ``j`` (scalar or array)."""
        j = np.asarray(j, dtype=np.int64)
        if j.size and int(j.min()) < 0:
            raise IndexError(f"blended sample {int(j.min())} is negative")
        q, r = np.divmod(j, self.period)
        d = self.slots[r]
        return d, q * self.counts[d] + self.rank_in_period[r]

    def position(self, dataset: np.ndarray | int, draw: np.ndarray | int) -> np.ndarray:
        """Blended sample ``j`` of draw ``draw`` of dataset ``dataset`` (the inverse of ``locate``)."""
        dataset = np.asarray(dataset, dtype=np.int64)
        q, r = np.divmod(np.asarray(draw, dtype=np.int64), self.counts[dataset])
        return q * self.period + self._slots_by_dataset[self._first[dataset] + r]

    def draws(self, num_samples: int) -> np.ndarray:
        """How many samples of each dataset the first ``num_samples`` blended samples take."""
        q, r = divmod(int(num_samples), self.period)
        return q * self.counts + np.bincount(self.slots[:r], minlength=len(self.counts))

    def weights_at(self, step: int) -> list[float]:
        total = float(sum(self.weights))
        return [float(w) / total for w in self.weights]

    def weights_shown(self) -> list[str]:
        return [f"{w:g}" for w in self.weights]

    def decided_samples(self, num_samples: int) -> int:
        return num_samples

    def record(self, last_step: int) -> dict:
        return {"weights": list(self.weights), "blend": self.kind, "schedule": None, "adaptive": None,
                "decisions": None}
