"""A stage's blended, shuffled sample stream as a map-style dataset (index = stage sample)."""

from __future__ import annotations

import numpy as np

from runtime.data.plan import DataPlan, StagePlan


class StageDataset:
    """``dataset[j]`` is stage sample ``j``: ``{"input_ids": L+1 tokens[, "position_ids"]}``.

    ``__getitems__`` (used by ``torch.utils.data.DataLoader`` for a whole micro-batch) locates
    all indices in one vectorised call and reads each dataset's windows together.
    """

    def __init__(self, plan: DataPlan, stage: StagePlan) -> None:
        self.plan = plan
        self.stage = stage

    def __len__(self) -> int:
        return self.stage.num_samples

    def __getitem__(self, j: int) -> dict[str, np.ndarray]:
        return self.__getitems__([j])[0]

    def __getitems__(self, indices: list[int]) -> list[dict[str, np.ndarray]]:
        j = np.asarray(indices, dtype=np.int64)
        if len(j) and (j.min() < 0 or j.max() >= len(self)):
            raise IndexError(f"stage {self.stage.name!r} sample {int(j.max())} outside [0, {len(self)})")
        loc = self.plan.locate(self.stage, j)
        width = self.stage.sequence_length + 1
        tokens = np.empty((len(j), width), dtype=np.int64)
        positions = np.empty((len(j), width), dtype=np.int64) if self.stage.use_position_ids else None
        for d in np.unique(loc.dataset).tolist():
            rows = np.flatnonzero(loc.dataset == d)
            windows = self.plan.datasets[d]
            tokens[rows] = windows.tokens(loc.sample[rows])
            if positions is not None:
                positions[rows] = windows.position_ids(loc.sample[rows])
        if positions is None:
            return [{"input_ids": row} for row in tokens]
        return [{"input_ids": row, "position_ids": pos} for row, pos in zip(tokens, positions)]
