"""A stage's blended, shuffled sample stream as a map-style dataset (index = stage sample)."""

from __future__ import annotations

import numpy as np

from runtime.data.plan import DataPlan, StagePlan


class StageDataset:
    """``dataset[j]`` is stage sample ``j``: ``{"input_ids": L+1 tokens[, "position_ids"]}``.

    ``__getitems__`` (used by ``torch.utils.data.DataLoader`` for a whole micro-batch) locates
    all indices in one vectorised call and reads each dataset's windows together.
    """

    BLOCK = 4096  # stage samples located at once; samplers walk the stage in order

    def __init__(self, plan: DataPlan, stage: StagePlan) -> None:
        self.plan = plan
        self.stage = stage
        self._block: tuple[int, np.ndarray, np.ndarray] | None = None

    def _locate(self, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dataset, window) of stage samples ``j``, from a cached block when they fall in one."""
        b = int(j.min()) // self.BLOCK
        if int(j.max()) // self.BLOCK != b:
            loc = self.plan.locate(self.stage, j)
            return loc.dataset, loc.sample
        if self._block is None or self._block[0] != b:
            first = b * self.BLOCK
            loc = self.plan.locate(self.stage, np.arange(first, min(first + self.BLOCK, len(self))))
            self._block = (b, loc.dataset, loc.sample)
        _, dataset, sample = self._block
        return dataset[j - b * self.BLOCK], sample[j - b * self.BLOCK]

    def __len__(self) -> int:
        return self.stage.num_samples

    def __getitem__(self, j: int) -> dict[str, np.ndarray]:
        return self.__getitems__([j])[0]

    def __getitems__(self, indices: list[int]) -> list[dict[str, np.ndarray]]:
        j = np.asarray(indices, dtype=np.int64)
        if len(j) and (j.min() < 0 or j.max() >= len(self)):
            raise IndexError(f"stage {self.stage.name!r} sample {int(j.max())} outside [0, {len(self)})")
        dataset, sample = self._locate(j)
        width = self.stage.sequence_length + 1
        tokens = np.empty((len(j), width), dtype=np.int64)
        positions = np.empty((len(j), width), dtype=np.int64) if self.stage.use_position_ids else None
        for d in np.unique(dataset).tolist():
            rows = np.flatnonzero(dataset == d)
            windows = self.plan.datasets[d]
            tokens[rows] = windows.tokens(sample[rows])
            if positions is not None:
                positions[rows] = windows.position_ids(sample[rows])
        if positions is None:
            return [{"input_ids": row} for row in tokens]
        return [{"input_ids": row, "position_ids": pos} for row, pos in zip(tokens, positions)]
