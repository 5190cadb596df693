"""The batch contract (docs/parallelism.md): what a micro-batch holds on each pipeline rank.

A micro-batch is a dict of ``input_ids``, ``input_mask`` (and ``position_ids`` when used) on the
pipeline rank that owns the inputs, ``label_ids``, ``label_mask`` on the rank that owns the loss,
and a ``TensorPointer`` to the owner everywhere else. Ids are int64, masks bool, shapes
``[micro_batch_size, sequence_length]``. ``source_ids`` (int64 ``[micro_batch_size]``, each row's
dataset as its index in the stage) is optional and goes with the label keys: the loss is then also
counted per source. Collators make such batches, the feed checks and moves them, the engine reads
them: each takes the keys from here.
"""

from __future__ import annotations

from typing import Any

import torch

from nanoset.errors import ConfigError
from runtime.parallel.tensor_pointer import TensorPointer

INPUT_KEYS = ("input_ids", "input_mask")
LABEL_KEYS = ("label_ids", "label_mask")
SOURCE_KEY = "source_ids"  # optional, with the label keys: each row's source (dataset of the stage)


def pointer_batch(input_pp_rank: int, output_pp_rank: int, use_position_ids: bool) -> dict[str, TensorPointer]:
    """A batch of TensorPointers only: inputs on ``input_pp_rank``, labels on ``output_pp_rank``."""
    keys = INPUT_KEYS + (("position_ids",) if use_position_ids else ())
    batch = {k: TensorPointer(input_pp_rank) for k in keys}
    batch.update({k: TensorPointer(output_pp_rank) for k in LABEL_KEYS})
    return batch


def owned_keys(pp_rank: int, pp_size: int, use_position_ids: bool) -> list[str]:
    """The keys pipeline rank ``pp_rank`` holds as tensors: the inputs on the first, the labels on the last."""
    keys = []
    if pp_rank == 0:
        keys += list(INPUT_KEYS) + (["position_ids"] if use_position_ids else [])
    if pp_rank == pp_size - 1:
        keys += list(LABEL_KEYS)
    return keys


def check_micro_batch(batch: Any, owns_inputs: bool, owns_labels: bool, rows: int, length: int, where: str) -> None:
    """Refuse a micro-batch that breaks the contract for this pipeline rank: a missing key, another shape than
    ``[rows, length]`` (``[micro_batch_size, sequence_length]``) or dtype. A loader's batch of another size would
    train silently on other rows and record other consumed samples, so a resume would replay or skip data."""
    if not isinstance(batch, dict):
        raise ConfigError(f"{where}: the data loader yielded a {type(batch).__name__}, not a batch dict of "
                          f"{', '.join(INPUT_KEYS + LABEL_KEYS)} (see docs/parallelism.md)")
    expected = {"input_ids": torch.int64, "position_ids": torch.int64} if owns_inputs else {}
    if owns_labels:
        expected.update(label_ids=torch.int64, label_mask=torch.bool)
    for key_name, dtype in expected.items():
        value = batch.get(key_name)
        if value is None and key_name == "position_ids":
            continue  # optional: positions count from 0 in every row without it
        if not isinstance(value, torch.Tensor):
            got = "no such key" if value is None else type(value).__name__
            raise ConfigError(f"{where}: the data loader's batch has no tensor {key_name!r} ({got}); the batches of "
                              f"this pipeline rank hold {', '.join(sorted(expected))} (see docs/parallelism.md)")
        if tuple(value.shape) != (rows, length):
            raise ConfigError(f"{where}: the data loader's {key_name} has shape {list(value.shape)}, expected "
                              f"[micro_batch_size, sequence_length] = [{rows}, {length}]")
        if value.dtype != dtype:
            raise ConfigError(f"{where}: the data loader's {key_name} is {value.dtype}, expected {dtype}")
