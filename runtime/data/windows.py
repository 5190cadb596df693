"""Fixed-length training windows over one dataset folder seen as a single token stream.

Sample ``i`` for sequence length ``L`` is tokens ``[i·L, i·L + L + 1)``: consecutive windows
overlap by one token, so every transition of the stream is trained on. Windows may cross
document and shard boundaries; position ids restart at every document start read from the index.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nanoset import NanosetReader, open_dataset


class TokenWindows:
    """The ``(num_tokens - 1) // L`` windows of ``L + 1`` tokens of a dataset folder."""

    def __init__(self, folder: str | Path, sequence_length: int, reader: NanosetReader | None = None) -> None:
        if sequence_length < 1:
            raise ValueError(f"sequence_length must be ≥ 1, got {sequence_length}")
        self.folder = str(folder)
        self.reader = reader if reader is not None else open_dataset(folder)
        self.sequence_length = sequence_length
        self.num_samples = max(0, (self.reader.num_tokens - 1) // sequence_length)

    def __len__(self) -> int:
        return self.num_samples

    def token_range(self, i: int | np.ndarray) -> tuple[int, int] | tuple[np.ndarray, np.ndarray]:
        """``[start, stop)`` in the token stream of window ``i`` (ints), or of windows ``i`` (arrays)."""
        if np.ndim(i) == 0:
            start = int(i) * self.sequence_length
            return start, start + self.sequence_length + 1
        start = np.asarray(i, dtype=np.int64) * self.sequence_length
        return start, start + self.sequence_length + 1

    def _check(self, indices: np.ndarray | int) -> np.ndarray:
        """Window indices as a flat int64 array (a scalar counts as one), each checked in range."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.num_samples):
            bad = idx[(idx < 0) | (idx >= self.num_samples)][0]
            raise IndexError(f"window {bad} outside [0, {self.num_samples}) of {self.folder}")
        return idx

    def _by_shard(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shard of each window, and whether the whole window lies inside it."""
        offsets = self.reader.token_offsets
        first = np.searchsorted(offsets, starts, side="right") - 1
        last = np.searchsorted(offsets, starts + self.sequence_length, side="right") - 1
        return first, first == last

    def tokens(self, indices: np.ndarray | int) -> np.ndarray:
        """Windows ``indices`` stacked: shape ``[*indices.shape, L + 1]`` (``[L + 1]`` for one index), int64."""
        idx = self._check(indices)
        out = np.empty((len(idx), self.sequence_length + 1), dtype=np.int64)
        starts = idx * self.sequence_length
        shard, inside = self._by_shard(starts)
        width = self.sequence_length + 1
        for row, (start, s, ok) in enumerate(zip(starts.tolist(), shard.tolist(), inside.tolist())):
            if ok:
                local = start - int(self.reader.token_offsets[s])
                out[row] = self.reader.shards[s].tokens[local : local + width]
            else:
                out[row] = self.reader.tokens(start, start + width)
        return out.reshape(np.shape(indices) + (width,))

    def position_ids(self, indices: np.ndarray | int) -> np.ndarray:
        """Position of each token within its document, restarting at 0 at every document start.

        The first token of a window counts as position 0 when its document began earlier.
        Vectorised per shard: two ``searchsorted`` calls find every document boundary of the batch.
        """
        idx = self._check(indices)
        width = self.sequence_length + 1
        starts = idx * self.sequence_length
        shard, inside = self._by_shard(starts)
        base = np.zeros((len(idx), width), dtype=np.int64)
        for s in np.unique(shard[inside]).tolist():
            rows = np.flatnonzero(inside & (shard == s))
            local = starts[rows] - int(self.reader.token_offsets[s])
            ends = self.reader.shards[s].ends
            lo = np.searchsorted(ends, local, side="right")
            counts = np.searchsorted(ends, local + width, side="left") - lo
            first = np.repeat(np.cumsum(counts) - counts, counts)
            which = np.arange(int(counts.sum())) - first + np.repeat(lo, counts)
            rel = ends[which].astype(np.int64) - np.repeat(local, counts)
            base[np.repeat(rows, counts), rel] = rel
        for row in np.flatnonzero(~inside).tolist():
            rel = self.reader.document_starts(int(starts[row]), int(starts[row]) + width) - int(starts[row])
            base[row, rel] = rel
        positions = np.arange(width, dtype=np.int64) - np.maximum.accumulate(base, axis=1)
        return positions.reshape(np.shape(indices) + (width,))
