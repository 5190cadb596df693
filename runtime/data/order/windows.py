"""Fixed-length training windows over one dataset folder seen as a single token stream.

Sample ``i`` for sequence length ``L`` is tokens ``[i·L, i·L + L + 1)``: consecutive windows
overlap by one token, so every transition of the stream is trained on. Windows may cross
document and shard boundaries; position ids restart at every document start read from the index.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from nanoset import NanosetReader, open_dataset
from runtime.data.order.sample_space import SampleSpace


class TokenWindows:
    """The ``(num_tokens - 1) // L`` windows of ``L + 1`` tokens of a dataset folder (a ``SampleSpace``)."""

    packing = "window"

    def __init__(self, folder: str | Path, sequence_length: int, reader: NanosetReader | None = None) -> None:
        if sequence_length < 1:
            raise ValueError(f"sequence_length must be ≥ 1, got {sequence_length}")
        self.folder = str(folder)
        self.reader = reader if reader is not None else open_dataset(folder)
        self.sequence_length = sequence_length
        self.num_samples = max(0, (self.reader.num_tokens - 1) // sequence_length)

    def __len__(self) -> int:
        return self.num_samples

    @property
    def sample_key(self) -> str:
        """What identifies this sample space in data hashes: content and sequence length."""
        return f"{self.reader.fingerprint}/{self.sequence_length}"

    def token_range(self, i: int | np.ndarray) -> tuple[int, int] | tuple[np.ndarray, np.ndarray]:
        """``[start, stop)`` in the token stream of window ``i`` (ints), or of windows ``i`` (arrays)."""
        if np.ndim(i) == 0:
            start = int(i) * self.sequence_length
            return start, start + self.sequence_length + 1
        start = np.asarray(i, dtype=np.int64) * self.sequence_length
        return start, start + self.sequence_length + 1

    def _check(self, indices: np.ndarray | int) -> np.ndarray:
        return checked_indices(indices, self.num_samples, "window", self.folder)

    def _by_shard(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shard of each window, and whether the whole window lies inside it."""
        return _shard_of(self.reader, starts, self.sequence_length + 1)

    def tokens(self, indices: np.ndarray | int) -> np.ndarray:
        """Windows ``indices`` stacked: shape ``[*indices.shape, L + 1]`` (``[L + 1]`` for one index), int64."""
        out = np.empty((np.size(indices), self.sequence_length + 1), dtype=np.int64)
        self.read(indices, out)
        return out.reshape(np.shape(indices) + (self.sequence_length + 1,))

    def position_ids(self, indices: np.ndarray | int) -> np.ndarray:
        """Position of each token within its document, restarting at 0 at every document start.

        The first token of a window counts as position 0 when its document began earlier.
        """
        out = np.empty((np.size(indices), self.sequence_length + 1), dtype=np.int64)
        self.read(indices, None, out)
        return out.reshape(np.shape(indices) + (self.sequence_length + 1,))

    @property
    def has_label_mask(self) -> bool:
        """Whether samples carry a label mask of their own (the folder has loss masks)."""
        return self.reader.has_loss_masks

    def label_mask(self, indices: np.ndarray | int, positions: np.ndarray | None = None) -> np.ndarray | None:
        """``loss[1:]`` of each window (the loss mask of each label's target token), ``[*shape, L]`` bool;
        None for a folder without loss masks. (``positions`` is unused: SampleSpace's signature.)"""
        if not self.has_label_mask:
            return None
        idx = self._check(indices)
        out = np.empty((len(idx), self.sequence_length), dtype=bool)
        for row, start in enumerate((idx * self.sequence_length).tolist()):
            out[row] = self.reader.loss_mask(start + 1, start + self.sequence_length + 1)
        return out.reshape(np.shape(indices) + (self.sequence_length,))

    def read(self, indices: np.ndarray, tokens: np.ndarray | None, positions: np.ndarray | None = None) -> None:
        """Write windows ``indices`` into ``tokens`` and/or their position ids into ``positions``
        (each ``[len(indices), L + 1]`` int64, e.g. rows of a batch buffer): the batch path, which
        locates the windows once and makes no intermediate arrays."""
        idx = self._check(indices)
        starts = idx * self.sequence_length
        shard, inside = self._by_shard(starts)
        if tokens is not None:
            self._read_tokens(starts, shard, inside, tokens)
        if positions is not None:
            position_ids_at(self.reader, starts, self.sequence_length + 1, positions, (shard, inside))

    def _read_tokens(self, starts: np.ndarray, shard: np.ndarray, inside: np.ndarray, out: np.ndarray) -> None:
        width = self.sequence_length + 1
        offsets = self.reader.token_offsets
        s = _one_shard(shard, inside)
        if s is not None:  # the common case: one map, fetched once (a plain view: memmap slices are slow)
            tokens = np.asarray(self.reader.shards[s].tokens)
            for row, local in enumerate((starts - int(offsets[s])).tolist()):
                out[row] = tokens[local : local + width]
            return
        for row, (start, s, ok) in enumerate(zip(starts.tolist(), shard.tolist(), inside.tolist())):
            if ok:
                local = start - int(offsets[s])
                out[row] = self.reader.shards[s].tokens[local : local + width]
            else:
                out[row] = self.reader.tokens(start, start + width)


def checked_indices(indices: np.ndarray | int, num_samples: int, what: str, folder: str) -> np.ndarray:
    """Sample indices as a flat int64 array (a scalar counts as one), each checked in ``[0, num_samples)``."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if len(idx) and (idx.min() < 0 or idx.max() >= num_samples):
        bad = idx[(idx < 0) | (idx >= num_samples)][0]
        raise IndexError(f"{what} {bad} outside [0, {num_samples}) of {folder}")
    return idx


def _shard_of(reader: NanosetReader, starts: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Shard of each range ``[start, start + width)``, and whether the whole range lies inside it."""
    offsets = reader.token_offsets
    if len(offsets) == 2:  # one shard: no search
        return np.zeros(len(starts), dtype=np.int64), starts + width <= int(offsets[1])
    first = np.searchsorted(offsets, starts, side="right") - 1
    last = np.searchsorted(offsets, starts + (width - 1), side="right") - 1
    return first, first == last


def position_ids_at(reader: NanosetReader, starts: np.ndarray, width: int, out: np.ndarray | None = None,
                    by_shard: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Position within its document of each token of the ranges ``[start, start + width)`` of the
    stream, restarting at 0 at every document start; a range's first token is position 0 too.

    Returns ``[len(starts), width]`` int64 (written into ``out`` when given). Vectorised per shard:
    two ``searchsorted`` calls find every document start of the batch. The index holds uint64
    offsets, so the searched values are uint64 too: int64 values would make numpy convert the
    whole index to float64 on every call, a cost that grows with the shard.
    """
    starts = np.asarray(starts, dtype=np.int64)
    out = np.empty((len(starts), width), dtype=np.int64) if out is None else out
    shard, inside = by_shard if by_shard is not None else _shard_of(reader, starts, width)
    s = _one_shard(shard, inside)
    if s is not None and _few_starts(reader, s, starts, width, out):
        return out
    found: list[tuple[np.ndarray, np.ndarray]] = []  # (row, offset in the row) of each document start
    ins = shard[inside]
    for s in [int(ins[0])] if len(ins) and ins.min() == ins.max() else np.unique(ins).tolist():
        rows = np.flatnonzero(inside & (shard == s))
        local = starts[rows] - int(reader.token_offsets[s])
        ends = reader.shards[s].ends
        local_u = local.astype(ends.dtype)
        lo = np.searchsorted(ends, local_u, side="right")
        counts = np.searchsorted(ends, local_u + width, side="left") - lo
        n = int(counts.sum())
        if n:
            first = np.repeat(np.cumsum(counts) - counts, counts)
            which = np.arange(n) - first + np.repeat(lo, counts)
            found.append((np.repeat(rows, counts), ends[which].astype(np.int64) - np.repeat(local, counts)))
    for row in np.flatnonzero(~inside).tolist():
        start = int(starts[row])
        rel = reader.document_starts(start, start + width) - start
        found.append((np.full(len(rel), row), rel))
    if len(found) == 1:
        rows, rels = found[0]
    else:
        rows = np.concatenate([f[0] for f in found]) if found else np.zeros(0, dtype=np.int64)
        rels = np.concatenate([f[1] for f in found]) if found else np.zeros(0, dtype=np.int64)
    _fill_positions(out, rows, rels)
    return out


def _one_shard(shard: np.ndarray, inside: np.ndarray) -> int | None:
    """The shard holding every range whole, if there is one."""
    if len(shard) and inside.all() and shard.min() == shard.max():
        return int(shard[0])
    return None


def _few_starts(reader: NanosetReader, s: int, starts: np.ndarray, width: int, out: np.ndarray) -> bool:
    """Ranges all inside shard ``s`` with few document starts (the common case: windows of long
    documents): a ramp, restarted at each start by one slice copy. False (nothing written) when
    there are more starts than ``8 · rows``; the caller's running maximum is cheaper then."""
    ends = np.asarray(reader.shards[s].ends)  # a plain view: memmap slices cost microseconds each
    local = starts - int(reader.token_offsets[s])
    local_u = local.astype(ends.dtype)
    lo = np.searchsorted(ends, local_u, side="right")
    hi = np.searchsorted(ends, local_u + width, side="left")
    if int((hi - lo).sum()) > 8 * len(starts):
        return False
    ramp = _ramp(width)
    out[...] = ramp
    for row, (a, b, base) in enumerate(zip(lo.tolist(), hi.tolist(), local.tolist())):
        for end in ends[a:b].tolist():  # ascending: each start restarts the rest of the row
            out[row, end - base :] = ramp[: width - (end - base)]
    return True


def _fill_positions(out: np.ndarray, rows: np.ndarray, rels: np.ndarray) -> None:
    """``out[r, t] = t - d`` with ``d`` the latest document start ``≤ t`` of row ``r`` (0 if none), given
    every start as ``(rows[k], rels[k])``, each row's together and ascending.

    A ramp with one slice per document piece when the starts are few (windows of long documents:
    a handful of copies); a running maximum over the whole batch when they are many."""
    width = out.shape[1]
    ramp = _ramp(width)
    if len(rels) > 8 * len(out):
        out[...] = 0
        out[rows, rels] = rels
        np.maximum.accumulate(out, axis=1, out=out)
        np.subtract(ramp, out, out=out)
        return
    out[...] = ramp
    if len(rels):
        same_row = np.append(rows[1:] == rows[:-1], False)
        stops = np.where(same_row, np.append(rels[1:], 0), width)
        for row, a, b in zip(rows.tolist(), rels.tolist(), stops.tolist()):
            out[row, a:b] = ramp[: b - a]


@functools.lru_cache(maxsize=16)
def _ramp(width: int) -> np.ndarray:
    ramp = np.arange(width, dtype=np.int64)
    ramp.flags.writeable = False
    return ramp


def label_mask(windows: SampleSpace, samples: np.ndarray, use_position_ids: bool) -> np.ndarray:
    """The ``label_mask`` the collator gives samples ``samples`` of one dataset (``[n, L]`` bool): the
    dataset's own mask (loss masks, packing) and, with position ids, no label across a document start."""
    samples = np.asarray(samples, dtype=np.int64).reshape(-1)
    mask = np.ones((len(samples), windows.sequence_length), dtype=bool)
    if windows.has_label_mask:
        mask &= windows.label_mask(samples)
    if use_position_ids:
        mask &= windows.position_ids(samples)[:, 1:] != 0
    return mask
