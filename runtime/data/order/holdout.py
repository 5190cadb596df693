"""Held-out documents (``validation.holdout: FRACTION``): that fraction of each training dataset's documents, drawn
with the data seed, never trains - they are excised from step 1 by the data order's excision rule, as a surgery
exclusion - and forms the validation set ``<source>-holdout``, read as the stream of those documents alone.

Also here: a validation folder that is also a training folder, which makes the validation loss a training loss
(``overlap_warnings``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from nanoset import NanosetReader, open_dataset
from nanoset.atomic import atomic_write_text
from runtime.config import Config, ConfigError
from runtime.data.order.permutation import FeistelPermutation
from runtime.data.order.surgery import Surgery, surgery_of

HOLDOUT_FILE = "holdout-documents.txt"  # in the run folder: FOLDER:DOC lines, what explain --documents reads
HOLDOUT_SUFFIX = "-holdout"


def training_folders(plan) -> dict[str, NanosetReader]:
    """Each training dataset folder of a ``DataPlan`` once (as the config names it) → its reader."""
    out: dict[str, NanosetReader] = {}
    seen: set[str] = set()
    for space in plan.datasets:
        key = os.path.realpath(space.folder)
        if key not in seen:
            seen.add(key)
            out[space.folder] = space.reader
    return out


def holdout_documents(config: Config, plan) -> dict[str, np.ndarray]:
    """Folder → the sorted indices of its held-out documents: the first ``round(FRACTION · N)`` (at least one) of a
    permutation of its ``N`` documents keyed by the first stage's data seed and the folder's content."""
    fraction = config.validation.holdout
    if not fraction:
        return {}
    seed = config.stage_seed(config.data_stages[0])
    out = {}
    for folder, reader in training_folders(plan).items():
        n = reader.num_documents
        k = max(1, round(fraction * n))
        if k >= n:
            raise ConfigError(f"validation.holdout {fraction}: {folder} has {n} document(s), and holding out {k} "
                              f"leaves none to train on; lower validation.holdout or add documents")
        perm = FeistelPermutation(n, "holdout", seed, reader.fingerprint)
        out[folder] = np.sort(perm(np.arange(k, dtype=np.int64)))
    return out


def holdout_surgery(documents: dict[str, np.ndarray]) -> Surgery:
    """The held-out documents as an exclusion from step 1 (the excision rule: no trained sample holds a token of
    them)."""
    return surgery_of([], documents, 1, "validation.holdout") if documents else Surgery()


def holdout_lines(documents: dict[str, np.ndarray]) -> str:
    """``<run_dir>/holdout-documents.txt``: one ``FOLDER:DOC`` line per held-out document."""
    return "".join(f"{folder}:{d}\n" for folder, docs in documents.items() for d in docs.tolist())


def write_holdout_file(run_dir: Path, documents: dict[str, np.ndarray]) -> None:
    atomic_write_text(Path(run_dir) / HOLDOUT_FILE, holdout_lines(documents))


class HeldOutWindows:
    """The windows of ``L + 1`` tokens of the stream of ``documents`` of one folder (one after the other), read as
    ``TokenWindows`` reads a folder: position ids restart at each document start (a window's first token is position
    0), and the label mask is the folder's loss mask where it has one."""

    def __init__(self, folder: str, sequence_length: int, reader: NanosetReader, documents: np.ndarray) -> None:
        self.folder, self.sequence_length, self.reader = folder, sequence_length, reader
        ends = reader.document_ends
        self._starts = np.where(documents > 0, ends[np.maximum(documents - 1, 0)], 0).astype(np.int64)
        lengths = ends[documents] - self._starts
        self._offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # each document in the stream
        self.num_samples = max(0, (int(self._offsets[-1]) - 1) // sequence_length)

    @property
    def has_label_mask(self) -> bool:
        return self.reader.has_loss_masks

    def _pieces(self, window: int) -> list[tuple[int, int]]:
        """The folder's token ranges ``[a, b)`` of ``window``: the pieces of the documents it spans, in order."""
        start = window * self.sequence_length
        stop = start + self.sequence_length + 1
        pieces = []
        d = int(np.searchsorted(self._offsets, start, side="right")) - 1
        while start < stop:
            first = int(self._starts[d]) + start - int(self._offsets[d])
            take = min(stop, int(self._offsets[d + 1])) - start
            pieces.append((first, first + take))
            start += take
            d += 1
        return pieces

    def _rows(self, indices: np.ndarray, read) -> np.ndarray:
        return np.stack([np.concatenate([read(a, b) for a, b in self._pieces(int(w))])
                         for w in np.asarray(indices).reshape(-1)])

    def tokens(self, indices: np.ndarray) -> np.ndarray:
        return self._rows(indices, self.reader.tokens).astype(np.int64)

    def position_ids(self, indices: np.ndarray) -> np.ndarray:
        """Each token's offset from the later of its document's start and the window's start."""
        return self._rows(indices, lambda a, b: np.arange(b - a, dtype=np.int64))

    def label_mask(self, indices: np.ndarray) -> np.ndarray | None:
        """``loss[1:]`` of each window (the loss mask of each label's target token); None without loss masks."""
        if not self.has_label_mask:
            return None
        return self._rows(indices, self.reader.loss_mask)[:, 1:]


def overlap_warnings(config: Config, plan) -> list[str]:
    """One line per validation folder that is also a training folder (the same folder, or the same content)."""
    training = {os.path.realpath(s.folder): s.folder for s in plan.datasets}
    content = {s.reader.fingerprint: s.folder for s in plan.datasets}
    out = []
    for name in config.validation.datasets:
        for folder in config.validation.folders(name):
            same = training.get(os.path.realpath(folder))
            if same is None:
                same = content.get(open_dataset(folder).fingerprint)
            if same is not None:
                out.append(f"validation.datasets.{name}: {folder} is also training data ({same}): its loss is not a "
                           f"held-out loss; validate on other data, or set validation.holdout: FRACTION to hold "
                           f"documents of the training data out")
    return out
