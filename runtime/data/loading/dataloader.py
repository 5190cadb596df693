"""Loaders: a torch DataLoader over a dataset with the DP sampler and a collator, or - on pipeline
ranks that need no data - a loader of TensorPointers that never touches the disk."""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from nanoset.errors import NanosetError
from runtime.control.preemption import ignore_in_loader_worker
from runtime.data.loading.collator import collator_class
from runtime.data.loading.contract import pointer_batch
from runtime.data.loading.prefetch import PrefetchLoader
from runtime.data.loading.sampler import get_sampler
from runtime.parallel.tensor_pointer import TensorPointer


class TensorPointerLoader:
    """Yields ``num_batches`` batches (or endlessly) of TensorPointers only."""

    def __init__(self, input_pp_rank: int, output_pp_rank: int, use_position_ids: bool,
                 num_batches: int | None = None) -> None:
        self.batch = pointer_batch(input_pp_rank, output_pp_rank, use_position_ids)
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[dict[str, TensorPointer]]:
        i = 0
        while self.num_batches is None or i < self.num_batches:
            yield dict(self.batch)
            i += 1

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an endless TensorPointerLoader has no length")
        return self.num_batches


def seed_worker(worker_id: int) -> None:
    """Give each loader worker its own, reproducible numpy/random state."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def init_worker(worker_init_fn: Any, worker_id: int) -> None:
    """Loader workers outlive the preemption signals (see ``ignore_in_loader_worker``), then seed."""
    ignore_in_loader_worker()
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


def build_loader(dataset: Any, sequence_length: int, ctx: Any, micro_batch_size: int, consumed_samples: int = 0, *,
                 num_workers: int = 0, use_position_ids: bool = False, prefetch: int = 0,
                 pipeline_ends: tuple[int, int] | None = None, worker_init: Any = seed_worker, drop_last: bool = True,
                 pin_memory: bool = True, seed: int = 0, shuffle: bool = False) -> Any:
    """The runtime's loader of ``dataset``: DP-sharded sampler from ``consumed_samples`` on, CLM collator, workers,
    pinned memory on CUDA; with 0 workers and ``prefetch`` > 0, a thread keeps that many micro-batches ready
    (``loading.prefetch``).

    ``ctx`` needs ``dp_rank``, ``dp_size`` and ``pp_rank`` (and ``pp_size`` without ``pipeline_ends``, the pipeline
    ranks that hold the inputs and the labels: by default the first and the last). Pipeline ranks that hold
    neither get a ``TensorPointerLoader`` of the same length and read nothing. (Nanotron's name and arguments:
    ``runtime.compat.get_train_dataloader``.)
    """
    pp_rank = int(ctx.pp_rank)
    input_rank, label_rank = pipeline_ends if pipeline_ends is not None else (0, int(ctx.pp_size) - 1)
    sampler = get_sampler(dataset, dl_rank=ctx.dp_rank, dl_ranks_size=ctx.dp_size, seed=seed, drop_last=drop_last,
                          shuffle=shuffle, micro_batch_size=micro_batch_size, consumed_train_samples=consumed_samples)
    if pp_rank not in (input_rank, label_rank):
        return TensorPointerLoader(input_rank, label_rank, use_position_ids,
                                   num_batches=len(sampler) // micro_batch_size)
    collator = collator_class(use_position_ids)(sequence_length, input_rank, label_rank, pp_rank=pp_rank)
    loader = DataLoader(
        dataset, batch_size=micro_batch_size, sampler=sampler, collate_fn=collator,
        num_workers=num_workers, pin_memory=pin_memory and torch.cuda.is_available(),
        drop_last=drop_last, worker_init_fn=functools.partial(init_worker, worker_init),
        persistent_workers=False, prefetch_factor=4 if num_workers > 0 else None,
    )
    # worker processes read ahead already (prefetch_factor): the thread is for reading in-process
    return PrefetchLoader(loader, prefetch) if prefetch > 0 and num_workers == 0 else loader


def from_loader_worker(error: NanosetError) -> NanosetError:
    """A user error raised in a DataLoader worker process, as its one line: the DataLoader re-raises it in the
    training process with the worker's whole traceback in the message."""
    text = str(error)
    if "Original Traceback" not in text:
        return error
    last = text.rstrip().splitlines()[-1]
    name = f"{type(error).__module__}.{type(error).__qualname__}: "
    return type(error)(last.removeprefix(name)) if last.startswith(name) else error
