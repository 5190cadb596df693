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

    def token_range(self, i: int) -> tuple[int, int]:
        start = int(i) * self.sequence_length
        return start, start + self.sequence_length + 1

    def tokens(self, indices: np.ndarray) -> np.ndarray:
        """Windows ``indices`` stacked: shape ``[len(indices), L + 1]``, int64."""
        out = np.empty((len(indices), self.sequence_length + 1), dtype=np.int64)
        for row, i in enumerate(np.asarray(indices).tolist()):
            if not 0 <= i < self.num_samples:
                raise IndexError(f"window {i} outside [0, {self.num_samples}) of {self.folder}")
            out[row] = self.reader.tokens(*self.token_range(i))
        return out

    def position_ids(self, indices: np.ndarray) -> np.ndarray:
        """Position of each token within its document, restarting at 0 at every document start.

        The first token of a window counts as position 0 when its document began earlier.
        """
        width = self.sequence_length + 1
        out = np.empty((len(indices), width), dtype=np.int64)
        ramp = np.arange(width, dtype=np.int64)
        for row, i in enumerate(np.asarray(indices).tolist()):
            start, stop = self.token_range(i)
            rel = self.reader.document_starts(start, stop) - start
            base = np.zeros(width, dtype=np.int64)
            base[rel] = rel
            out[row] = ramp - np.maximum.accumulate(base)
        return out
