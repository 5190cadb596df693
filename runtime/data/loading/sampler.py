"""Data-parallel sampling: every rank takes its rows of each global micro-batch, deterministically.

The global sample stream is the same whatever the number of ranks; global micro-batch ``b``
is stream positions ``[b·W, (b+1)·W)`` with ``W = ranks · micro_batch_size``, and rank ``r``
takes ``[b·W + r·mbs, b·W + (r+1)·mbs)``. Resuming from ``consumed_train_samples`` (counted
over all ranks) therefore continues exactly, with any number of ranks that divides the batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from runtime.data.order.permutation import FeistelPermutation


class DataParallelSampler(Sampler[int]):
    """Indices for rank ``dl_rank`` of ``dl_ranks_size``; one pass, or endless epochs with ``loop``."""

    def __init__(self, num_samples: int, dl_rank: int, dl_ranks_size: int, micro_batch_size: int, seed: int = 0,
                 shuffle: bool = False, drop_last: bool = True, consumed_train_samples: int = 0,
                 loop: bool = False) -> None:
        if not 0 <= dl_rank < dl_ranks_size:
            raise ValueError(f"dl_rank {dl_rank} outside [0, dl_ranks_size={dl_ranks_size})")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be ≥ 1, got {micro_batch_size}")
        width = dl_ranks_size * micro_batch_size
        if consumed_train_samples % width:
            raise ValueError(f"consumed_train_samples {consumed_train_samples} is not a multiple of "
                             f"dl_ranks_size · micro_batch_size = {width}; was the global batch size changed?")
        self.n = num_samples - num_samples % width if drop_last else num_samples
        if self.n <= 0:
            raise ValueError(f"dataset of {num_samples} samples is smaller than one global micro-batch of {width}")
        self.rank, self.width, self.mbs = dl_rank, width, micro_batch_size
        self.seed, self.shuffle, self.loop = seed, shuffle, loop
        self.consumed = consumed_train_samples

    def _order(self, epoch: int) -> FeistelPermutation | None:
        return FeistelPermutation(self.n, "sampler", self.seed, epoch) if self.shuffle else None

    def __iter__(self) -> Iterator[int]:
        k = self.consumed
        while self.loop or k < self.n:
            epoch, pos = divmod(k, self.n)
            perm = self._order(epoch)
            end = self.n
            while pos < end:
                rows = np.arange(pos + self.rank * self.mbs, min(pos + (self.rank + 1) * self.mbs, end))
                yield from (perm(rows) if perm else rows).tolist()
                pos += self.width
            k = (epoch + 1) * self.n

    def __len__(self) -> int:
        """Indices this rank yields in the current pass (``loop`` samplers are endless)."""
        remaining = max(self.n - self.consumed % self.n if self.loop else self.n - self.consumed, 0)
        batches = -(-remaining // self.width)
        return batches * self.mbs


def get_sampler(train_dataset, dl_rank: int, dl_ranks_size: int, seed: int = 0, drop_last: bool = True,
                shuffle: bool = False, micro_batch_size: int = 1, consumed_train_samples: int = 0,
                loop: bool = False) -> DataParallelSampler:
    """Nanotron's ``get_sampler``: this DP rank's share of ``train_dataset``, resumable from a sample count."""
    return DataParallelSampler(len(train_dataset), dl_rank, dl_ranks_size, micro_batch_size, seed=seed,
                               shuffle=shuffle, drop_last=drop_last, consumed_train_samples=consumed_train_samples,
                               loop=loop)
