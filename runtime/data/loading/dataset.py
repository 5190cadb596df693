"""A stage's blended, shuffled sample stream as a map-style dataset (index = stage sample)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.data.order.plan import DataPlan, StagePlan


class StageDataset:
    """``dataset[j]`` is stage sample ``j``: ``{"input_ids": L+1 tokens[, "position_ids"][, "label_mask": L],
    "source_id": int}``.

    ``label_mask`` comes with datasets that have their own (loss masks, packed documents); the
    collator ANDs it with its document-boundary mask. ``source_id`` is the index of the sample's
    dataset among the stage's: the collator passes it on, so the loss is also counted per source.

    ``__getitems__`` (used by ``torch.utils.data.DataLoader`` for a whole micro-batch) locates
    all indices in one vectorised call and reads each dataset's windows together.
    """

    BLOCK = 4096  # stage samples located at once; samplers walk the stage in order

    def __init__(self, plan: DataPlan, stage: StagePlan, end: int | None = None) -> None:
        """``end``: the samples the stream stops at (an adaptive stage's decided ones; default: the whole stage)."""
        self.plan = plan
        self.stage = stage
        self.end = stage.num_samples if end is None else min(end, stage.num_samples)
        self._block: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._masked: bool | None = None
        self._remote: bool | None = None  # whether any of the stage's datasets is in object storage
        self._prefetched = 0  # the stage samples below this one have had their shards prefetched

    def _locate(self, j: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dataset, window, source) of stage samples ``j``, from a cached block when they fall in one."""
        b = int(j.min()) // self.BLOCK
        if int(j.max()) // self.BLOCK != b:
            loc = self.plan.locate(self.stage, j)
            return loc.dataset, loc.sample, loc.source
        if self._block is None or self._block[0] != b:
            first = b * self.BLOCK
            loc = self.plan.locate(self.stage, np.arange(first, min(first + self.BLOCK, len(self))))
            self._block = (b, loc.dataset, loc.sample, loc.source)
        _, dataset, sample, source = self._block
        return dataset[j - b * self.BLOCK], sample[j - b * self.BLOCK], source[j - b * self.BLOCK]

    def __len__(self) -> int:
        return self.end

    def __getitem__(self, j: int) -> dict[str, np.ndarray]:
        return self.__getitems__([j])[0]

    def __getitems__(self, indices: list[int]) -> Examples:
        j = np.asarray(indices, dtype=np.int64)
        if len(j) and (j.min() < 0 or j.max() >= len(self)):
            raise IndexError(f"stage {self.stage.name!r} sample {int(j.max())} outside [0, {len(self)})")
        dataset, sample, source = self._locate(j)
        width = self.stage.sequence_length + 1
        # tokens and positions in the collator's buffer layout: it takes them as they are (Examples.ids)
        ids = np.empty((1 + self.stage.use_position_ids, len(j), width), dtype=np.int64)
        tokens = ids[0]
        positions = ids[1] if self.stage.use_position_ids else None
        # every example of a stage has the same keys: a label mask for all when any dataset has one
        if self._masked is None:
            self._masked = any(self.plan.datasets[d].has_label_mask for d in self.stage.dataset_ids)
        masks = np.ones((len(j), width - 1), dtype=bool) if self._masked else None
        single_dataset = len(dataset) and dataset.min() == dataset.max()
        for d in [int(dataset[0])] if single_dataset else np.unique(dataset).tolist():
            rows = slice(None) if single_dataset else np.flatnonzero(dataset == d)
            windows = self.plan.datasets[d]
            if single_dataset:  # straight into the buffer
                windows.read(sample, tokens, positions)
            else:  # a blend: this dataset's rows together, then in place
                part = np.empty((len(ids), len(rows), width), dtype=np.int64)
                windows.read(sample[rows], part[0], part[1] if positions is not None else None)
                ids[:, rows] = part
            if masks is not None and windows.has_label_mask:
                masks[rows] = windows.label_mask(sample[rows], positions[rows] if positions is not None else None)
        self._prefetch(int(j.max()) + 1 if len(j) else 0)
        return Examples(ids, masks, np.asarray(source, dtype=np.int64).reshape(-1))

    def _prefetch(self, first: int) -> None:
        """Datasets in object storage: start fetching the shards that the next two global batches' samples (from
        stage sample ``first``, as the data order places them) lie in, so that a step waits only for what it reads.
        Local datasets: nothing."""
        if self._remote is None:
            self._remote = any(getattr(getattr(self.plan.datasets[d], "reader", None), "remote", False)
                               for d in self.stage.dataset_ids)
        if not self._remote or first >= len(self) or first < self._prefetched:
            return
        ahead = np.arange(first, min(first + 2 * self.plan.config.global_batch_size, len(self)))
        self._prefetched = int(ahead[-1]) + 1
        dataset, sample, _ = self._locate(ahead) if len(ahead) else (ahead, ahead, ahead)
        for d in np.unique(dataset).tolist():
            space = self.plan.datasets[d]
            starts, stops = space.token_range(sample[dataset == d])
            space.reader.prefetch(starts, stops)


class Examples(Sequence):
    """A micro-batch's examples: a sequence of dicts of row views, as any collator expects, made on
    access from the buffers it carries: ``ids`` ``[1 or 2, n, L + 1]`` int64 (tokens, positions),
    ``label_mask`` ``[n, L]`` bool or None and ``sources`` ``[n]`` int64 (each row's source) or None.
    The CLM collators take the buffers as they are, so the batch is neither split into rows nor
    stacked and copied again."""

    def __init__(self, ids: np.ndarray, label_mask: np.ndarray | None, sources: np.ndarray | None = None) -> None:
        self.ids = ids
        self.label_mask = label_mask
        self.sources = sources
        self._keys = ("input_ids", "position_ids")[: len(ids)]

    def __len__(self) -> int:
        return self.ids.shape[1]

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self[r] for r in range(*row.indices(len(self)))]
        if not -len(self) <= row < len(self):
            raise IndexError(f"example {row} of {len(self)}")
        ex = {k: self.ids[i, row] for i, k in enumerate(self._keys)}
        if self.label_mask is not None:
            ex["label_mask"] = self.label_mask[row]
        if self.sources is not None:
            ex["source_id"] = int(self.sources[row])
        return ex
