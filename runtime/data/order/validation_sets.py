"""Validation sets: per named dataset of ``validation.datasets``, a fixed list of windows.

A set's folders are one index space (the windows of the first folder, then of the next, ...).
Its samples are the first ``samples`` of a seeded permutation of that space - keyed by the seed,
the folders' content and the sequence length, never by the training data order or stages - so
every validation of a run, and ``runtime.evaluate`` on any of its checkpoints, reads the same
windows. The feed gives them in steps shaped like training steps (``ValidationSource``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nanoset import NanosetError, NanosetReader, open_dataset
from runtime.config import Config, ConfigError
from runtime.data.order.holdout import HOLDOUT_SUFFIX, HeldOutWindows
from runtime.data.order.permutation import FeistelPermutation
from runtime.data.order.vocab import SeenTokenizer, check_same_tokenizer, check_unknown_beside_known, check_vocab
from runtime.data.order.windows import TokenWindows


@dataclass
class ValidationSet:
    """One named validation dataset over its opened folders."""

    name: str
    folders: list[str]
    readers: list[NanosetReader]
    samples: int  # the configured number; fewer when the set has fewer windows
    seed: int
    documents: np.ndarray | None = None  # a holdout set: only these documents of its one folder (``holdout``)
    _windows: dict[int, list[TokenWindows]] = field(default_factory=dict, repr=False)

    def windows(self, sequence_length: int) -> list[TokenWindows]:
        if sequence_length not in self._windows:
            if self.documents is not None:
                self._windows[sequence_length] = [HeldOutWindows(self.folders[0], sequence_length, self.readers[0],
                                                                 self.documents)]
            else:
                self._windows[sequence_length] = [TokenWindows(f, sequence_length, r)
                                                  for f, r in zip(self.folders, self.readers)]
        return self._windows[sequence_length]

    def num_windows(self, sequence_length: int) -> int:
        return sum(w.num_samples for w in self.windows(sequence_length))

    def sample_ids(self, sequence_length: int) -> np.ndarray:
        """The set's windows, in validation order: the first ``samples`` of its seeded permutation."""
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


def open_validation_sets(config: Config, training: list[tuple[NanosetReader, str]] | None = None
                         ) -> list[ValidationSet]:
    """Open and check ``validation.datasets`` (before any process group): folders exist, one tokenizer -
    the training data's when its ``training`` (reader, folder) pairs are given - ids within
    ``model.vocab_size``, and at least one window at the validation sequence length."""
    v = config.validation
    if not v.datasets:
        return []
    seed = v.seed if v.seed is not None else config.general.seed
    length = config.validation_sequence_length
    seen: list[SeenTokenizer] = []
    training = list(training or [])
    for reader, folder in training:
        seen = check_same_tokenizer(reader, folder, seen)
    sets = []
    for name in v.datasets:
        where = f"validation.datasets.{name}"
        readers = []
        for folder in v.folders(name):
            try:
                readers.append(open_dataset(folder))
            except NanosetError as e:
                raise ConfigError(f"{where}: {e}") from None
            seen = check_same_tokenizer(readers[-1], folder, seen, validation=where)
            check_vocab(readers[-1], folder, config.model.vocab_size, validation=where)
        check_unknown_beside_known(list(zip(readers, v.folders(name))) + training, seen, where)
        vset = ValidationSet(name, v.folders(name), readers, v.samples, seed)
        if vset.num_windows(length) == 0:
            tokens = sum(r.num_tokens for r in readers)
            raise ConfigError(f"{where}: {tokens} tokens, too few for one window of {length + 1} (the validation "
                              f"sequence length + 1); add data or lower validation.sequence_length")
        sets.append(vset)
    return sets


def training_readers(plan: Any) -> list[tuple[NanosetReader, str]]:
    """(reader, folder) of each training dataset of a ``DataPlan``: what validation data must match."""
    return [(w.reader, w.folder) for w in plan.datasets]


def holdout_sets(config: Config, documents: dict[str, np.ndarray], readers: dict[str, NanosetReader],
                 names: dict[str, str]) -> list[ValidationSet]:
    """The validation set ``<source>-holdout`` of each training folder's held-out documents (``names``: folder →
    source name, ``source_names``)."""
    v = config.validation
    seed = v.seed if v.seed is not None else config.general.seed
    return [ValidationSet(f"{names[folder]}{HOLDOUT_SUFFIX}", [folder], [readers[folder]], v.samples, seed,
                          documents=docs) for folder, docs in documents.items()]
