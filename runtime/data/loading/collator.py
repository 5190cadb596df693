"""Collators: windows of ``L + 1`` tokens → the batch dict of the batch contract (``contract.py``).

Examples that carry a ``source_id`` (``StageDataset``'s: the index of the row's dataset in the
stage) add ``source_ids``, so the loss is also counted per source.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from runtime.data.loading.contract import INPUT_KEYS, SOURCE_KEY, pointer_batch
from runtime.parallel.tensor_pointer import TensorPointer


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
