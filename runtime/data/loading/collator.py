"""Collators: windows of ``L + 1`` tokens → the batch dict of the batch contract (docs/parallelism.md).

On the pipeline rank that owns the inputs the input keys are tensors; on the rank that owns the
loss the label keys are; every other value is a ``TensorPointer`` to its owner. Ids are int64,
masks bool, shapes ``[micro_batch_size, sequence_length]``. Examples that carry a ``source_id``
(``StageDataset``'s: the index of the row's dataset in the stage) add ``source_ids``, int64
``[micro_batch_size]``, a label key: the loss is then also counted per source.
"""

from __future__ import annotations

from typing import Any

import numpy as np
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


def _pp_rank(parallel_context: Any, pp_rank: int | None) -> int:
    if pp_rank is not None:
        return pp_rank
    if parallel_context is None:
        return 0
    return int(parallel_context.pp_rank)


class DataCollatorForCLM:
    """Causal-LM collator: inputs are tokens ``[:-1]``, labels tokens ``[1:]``."""

    input_keys: tuple[str, ...] = INPUT_KEYS

    def __init__(self, sequence_length: int, input_pp_rank: int = 0, output_pp_rank: int = 0,
                 parallel_context: Any = None, pp_rank: int | None = None) -> None:
        self.sequence_length = sequence_length
        self.input_pp_rank = input_pp_rank
        self.output_pp_rank = output_pp_rank
        self.pp_rank = _pp_rank(parallel_context, pp_rank)  # an int, so the collator pickles into workers

    def _positions(self, examples: list[dict[str, np.ndarray]], out: np.ndarray) -> None:
        pass

    def __call__(self, examples: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor | TensorPointer]:
        if getattr(self, "_pointers", None) is None:  # TensorPointers are immutable: one set, copied per batch
            self._pointers = pointer_batch(self.input_pp_rank, self.output_pp_rank, "position_ids" in self.input_keys)
        batch: dict[str, torch.Tensor | TensorPointer] = dict(self._pointers)
        if self.pp_rank not in (self.input_pp_rank, self.output_pp_rank):
            return batch
        width = len(examples[0]["input_ids"])
        if width != self.sequence_length + 1:
            raise ValueError(f"examples hold {width} tokens; the collator needs sequence_length + 1 = "
                             f"{self.sequence_length + 1} (one extra token for the shifted labels)")
        # one int64 buffer (tokens, positions) and one bool buffer (masks): few storages to pass
        # from loader workers, every key a view. StageDataset's examples come in that layout already.
        ids = getattr(examples, "ids", None)
        if ids is None or len(ids) != len(self.input_keys) - 1:
            ids = np.empty((len(self.input_keys) - 1, len(examples), width), dtype=np.int64)
            np.stack([np.asarray(ex["input_ids"]) for ex in examples], out=ids[0], casting="unsafe")
            self._positions(examples, ids[1:])
        t = torch.from_numpy(ids)
        mask_buffer = np.ones((2, len(examples), self.sequence_length), dtype=bool)  # numpy: cheaper on small arrays
        masks = torch.from_numpy(mask_buffer)
        if self.pp_rank == self.input_pp_rank:
            batch["input_ids"] = t[0, :, :-1]
            batch["input_mask"] = masks[0]
            if len(ids) > 1:
                batch["position_ids"] = t[1, :, :-1]
        if self.pp_rank == self.output_pp_rank:
            batch["label_ids"] = t[0, :, 1:]
            batch["label_mask"] = masks[1]
            if len(ids) > 1:  # the label that would predict a new document's first token
                np.copyto(mask_buffer[1], ids[1, :, 1:], casting="unsafe")  # position != 0 (a cast: 2x faster)
            if "label_mask" in examples[0]:  # the dataset's own: loss masks, padding of packed documents
                own = getattr(examples, "label_mask", None)
                if own is None:
                    own = np.stack([np.asarray(ex["label_mask"], dtype=bool) for ex in examples])
                mask_buffer[1] &= own
        sources = _sources(examples)
        if sources is not None:
            batch[SOURCE_KEY] = (torch.from_numpy(sources) if self.pp_rank == self.output_pp_rank
                                 else TensorPointer(self.output_pp_rank))
        return batch


def _sources(examples) -> np.ndarray | None:
    """Each example's ``source_id`` as int64 ``[n]``, or None when the examples carry none."""
    sources = getattr(examples, "sources", None)
    if sources is not None:
        return np.ascontiguousarray(sources, dtype=np.int64)
    if "source_id" not in examples[0]:
        return None
    return np.array([int(ex["source_id"]) for ex in examples], dtype=np.int64)


class DataCollatorForCLMWithPositionIds(DataCollatorForCLM):
    """Adds ``position_ids`` (restarting at each document start) and masks the label that would
    predict a new document's first token from the previous document's EOS."""

    input_keys = INPUT_KEYS + ("position_ids",)

    def _positions(self, examples: list[dict[str, np.ndarray]], out: np.ndarray) -> None:
        if "position_ids" not in examples[0]:
            raise ValueError("examples have no 'position_ids'; build the dataset with use_position_ids: true")
        np.stack([np.asarray(ex["position_ids"]) for ex in examples], out=out[0], casting="unsafe")


def collator_class(use_position_ids: bool) -> type[DataCollatorForCLM]:
    """The collator of a stage: with ``position_ids`` (documents restart their positions) or without."""
    return DataCollatorForCLMWithPositionIds if use_position_ids else DataCollatorForCLM


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
