"""Held-out (validation) sets: per named dataset, a fixed list of windows and its batches.

A set's folders are one index space (the windows of the first folder, then of the next, ...).
Its samples are the first ``samples`` of a seeded permutation of that space - keyed by the seed,
the folders' content and the sequence length, never by the training data order or stages - so
every evaluation of a run, and ``runtime.evaluate`` on any of its checkpoints, reads the same
windows. Batches follow the training contract (global rows split by micro-batch, then dp rank);
rows past the end of the set are padding whose labels are all masked, so the loss and token
count are the same whatever the layout.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from nanoset import NanosetError, NanosetReader, open_dataset
from runtime.config import Config, ConfigError
from runtime.data.loading.collator import collator_class
from runtime.data.loading.contract import pointer_batch
from runtime.data.order.permutation import FeistelPermutation
from runtime.data.order.vocab import Known, check_tokenizer, check_unknown_beside_known, check_vocab
from runtime.data.order.windows import TokenWindows


@dataclass
class HeldOutSet:
    """One named validation dataset over its opened folders."""

    name: str
    folders: list[str]
    readers: list[NanosetReader]
    samples: int  # the configured number; fewer when the set has fewer windows
    seed: int
    _windows: dict[int, list[TokenWindows]] = field(default_factory=dict, repr=False)

    def windows(self, sequence_length: int) -> list[TokenWindows]:
        if sequence_length not in self._windows:
            self._windows[sequence_length] = [TokenWindows(f, sequence_length, r)
                                              for f, r in zip(self.folders, self.readers)]
        return self._windows[sequence_length]

    def num_windows(self, sequence_length: int) -> int:
        return sum(w.num_samples for w in self.windows(sequence_length))

    def sample_ids(self, sequence_length: int) -> np.ndarray:
        """The set's windows, in evaluation order: the first ``samples`` of its seeded permutation."""
        n = self.num_windows(sequence_length)
        perm = FeistelPermutation(n, "validation", self.seed, [r.fingerprint for r in self.readers], sequence_length)
        return perm(np.arange(min(self.samples, n), dtype=np.int64))

    def examples(self, sequence_length: int, ids: np.ndarray, use_position_ids: bool) -> list[dict[str, np.ndarray]]:
        """Windows ``ids`` (indices into the set's index space) as the examples a stage dataset yields:
        ``input_ids``, ``position_ids`` when used, and ``label_mask`` (loss masks) when a folder has one."""
        windows = self.windows(sequence_length)
        bounds = np.cumsum([0] + [w.num_samples for w in windows])
        which = np.searchsorted(bounds, ids, side="right") - 1
        tokens = np.empty((len(ids), sequence_length + 1), dtype=np.int64)
        positions = np.empty_like(tokens) if use_position_ids else None
        masks = np.ones((len(ids), sequence_length), dtype=bool) if any(w.has_label_mask for w in windows) else None
        for k in np.unique(which).tolist():
            rows = np.flatnonzero(which == k)
            local = ids[rows] - bounds[k]
            tokens[rows] = windows[k].tokens(local)
            if positions is not None:
                positions[rows] = windows[k].position_ids(local)
            if masks is not None and windows[k].has_label_mask:
                masks[rows] = windows[k].label_mask(local)
        out = [{"input_ids": row} for row in tokens]
        for key, values in (("position_ids", positions), ("label_mask", masks)):
            if values is not None:
                for ex, v in zip(out, values):
                    ex[key] = v
        return out

    def batches(self, sequence_length: int, use_position_ids: bool, ctx: Any, micro_batch_size: int,
                accumulation: int, reads: bool) -> Iterator[list[dict] | None]:
        """Per evaluation step, this rank's ``accumulation`` micro-batches of the set (padded at the end).

        ``ctx`` gives ``dp_rank``, ``dp_size``, ``pp_rank``, ``pp_size``. A rank that does not read
        (``reads`` False: a tp or cp rank that receives by broadcast) gets None per step; a middle
        pipeline rank gets TensorPointers only."""
        ids = self.sample_ids(sequence_length)
        rows_per_step = ctx.dp_size * micro_batch_size * accumulation
        steps = -(-len(ids) // rows_per_step)
        last = ctx.pp_size - 1
        owns_data = ctx.pp_rank in (0, last)
        collate = collator_class(use_position_ids)(sequence_length, 0, last, pp_rank=ctx.pp_rank)
        for s in range(steps):
            if not owns_data:
                yield [pointer_batch(0, last, use_position_ids) for _ in range(accumulation)]
                continue
            if not reads:
                yield None
                continue
            out = []
            for m in range(accumulation):
                first = s * rows_per_step + (m * ctx.dp_size + ctx.dp_rank) * micro_batch_size
                pos = np.arange(first, first + micro_batch_size)
                pad = pos >= len(ids)
                batch = collate(self.examples(sequence_length, ids[np.where(pad, 0, pos)], use_position_ids))
                if ctx.pp_rank == last and pad.any():
                    batch["label_mask"][torch.from_numpy(pad)] = False  # padding rows count no label
                out.append(batch)
            yield out


def open_heldout(config: Config, training: list[tuple[NanosetReader, str]] | None = None
                 ) -> list[HeldOutSet]:
    """Open and check ``validation.datasets`` (before any process group): folders exist, one tokenizer -
    the training data's when its ``training`` (reader, folder) pairs are given - ids within
    ``model.vocab_size``, and at least one window at every stage's sequence length."""
    v = config.validation
    if not v.datasets:
        return []
    seed = v.seed if v.seed is not None else config.general.seed
    longest = max(config.stage_sequence_length(s) for s in config.data_stages)
    known: list[Known] = []
    training = list(training or [])
    for reader, folder in training:
        known = check_tokenizer(reader, folder, known)
    sets = []
    for name in v.datasets:
        where = f"validation.datasets.{name}"
        readers = []
        for folder in v.folders(name):
            try:
                readers.append(open_dataset(folder))
            except NanosetError as e:
                raise ConfigError(f"{where}: {e}") from None
            known = check_tokenizer(readers[-1], folder, known, validation=where)
            check_vocab(readers[-1], folder, config.model.vocab_size, validation=where)
        check_unknown_beside_known(list(zip(readers, v.folders(name))) + training, known, where)
        held = HeldOutSet(name, v.folders(name), readers, v.samples, seed)
        if held.num_windows(longest) == 0:
            tokens = sum(r.num_tokens for r in readers)
            raise ConfigError(f"{where}: {tokens} tokens, too few for one window of {longest + 1} (the longest stage "
                              f"sequence length + 1); add data or shorten the stages' sequence_length")
        sets.append(held)
    return sets


def training_readers(plan: Any) -> list[tuple[NanosetReader, str]]:
    """(reader, folder) of each training dataset of a ``DataPlan``: what validation data must match."""
    return [(w.reader, w.folder) for w in plan.datasets]
