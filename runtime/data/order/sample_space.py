"""The sample space of a dataset: what the data order needs of "sample ``i`` of dataset ``d``".

Two classes give one: ``TokenWindows`` (overlapping windows of ``L + 1`` tokens of the stream) and
``PackedDocuments`` (whole documents packed into ``L + 1`` tokens). The permutation, blends,
stages, DP sharding, resume, ``explain`` and the loaders only call what is declared here, so either
takes the other's place; ``packing`` says which one it is where a record must tell them apart.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from nanoset import NanosetReader


@runtime_checkable
class SampleSpace(Protocol):
    """The ``num_samples`` samples of ``L + 1`` tokens (``L``: ``sequence_length``) of one dataset folder."""

    packing: str  # "window" (TokenWindows) or "documents" (PackedDocuments): the stage's data.packing
    folder: str
    reader: NanosetReader
    sequence_length: int
    num_samples: int

    def __len__(self) -> int: ...

    @property
    def sample_key(self) -> str:
        """What identifies this sample space in data hashes (content, sequence length, packing mode)."""
        ...

    @property
    def has_label_mask(self) -> bool:
        """Whether samples carry a label mask of their own (loss masks, padding of packed documents)."""
        ...

    def token_range(self, i: int | np.ndarray) -> tuple[int, int] | tuple[np.ndarray, np.ndarray]:
        """``[start, stop)`` in the dataset's token stream of sample ``i`` (ints), or of samples ``i`` (arrays)."""
        ...

    def tokens(self, indices: np.ndarray | int) -> np.ndarray:
        """Samples ``indices`` stacked: ``[*shape, L + 1]`` int64."""
        ...

    def position_ids(self, indices: np.ndarray | int) -> np.ndarray:
        """Each token's position within its document, ``[*shape, L + 1]`` int64."""
        ...

    def label_mask(self, indices: np.ndarray | int, positions: np.ndarray | None = None) -> np.ndarray | None:
        """The samples' own label mask, ``[*shape, L]`` bool (None without one); ``positions``: their position ids
        when the caller has them already."""
        ...

    def read(self, indices: np.ndarray, tokens: np.ndarray | None, positions: np.ndarray | None = None) -> None:
        """Write samples ``indices`` into ``tokens`` and/or their position ids into ``positions`` (each
        ``[len(indices), L + 1]`` int64, e.g. rows of a batch buffer): the batch path."""
        ...
