"""Whole-document packing: samples of ``L + 1`` tokens made of whole documents, never a cut one.

Documents are packed greedily in corpus order (next-fit): a sample takes the next documents
while they fit in ``L + 1`` tokens; the rest of the sample is padding, whose labels are masked
and whose tokens each start a document of their own (position 0), so document-masked attention
isolates them. A document longer than ``L + 1`` fills a sample alone, truncated to its first
``L + 1`` tokens, or (``drop_long_documents``) is left out and counted.

A packed sample is one contiguous token range ``[start, stop)`` of the stream (the documents of
a sample are consecutive; a dropped document ends the sample before it), so ``PackedDocuments``
is a ``SampleSpace`` as ``TokenWindows`` is, and the sample permutation, blending, stages, DP sharding,
resume and ``explain`` work on it unchanged. The packing is computed once per (dataset
fingerprint, L, mode) with numpy and cached (``nanoset.cache``, under ``general.cache_dir``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from nanoset import NanosetReader, open_dataset
from nanoset.cache import DerivedCache, file_stamp
from runtime.data.order.windows import checked_indices, position_ids_at

CACHE_VERSION = 1


def pack_documents(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Next-fit packing in corpus order: bin ``b`` holds documents ``[first[b], first[b + 1])``.

    Returns ``first`` with ``len(lengths)`` appended (int64). Lengths above ``capacity`` count as
    ``capacity`` (such a document fills a bin alone). No per-document Python: ``jump[a]`` (the first
    document of the bin after one that starts at ``a``) comes from one ``searchsorted`` over the
    cumulative lengths, and the chain ``0, jump[0], jump[jump[0]], …`` by pointer doubling: each round
    doubles the known prefix of the chain and squares the jump table, so the work is
    ``O(n · log(bins))`` in vectorised passes and the memory ``O(n)``.
    """
    n = len(lengths)
    cum = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.minimum(np.asarray(lengths, dtype=np.int64), capacity), out=cum[1:])
    jump = np.searchsorted(cum, cum + capacity, side="right") - 1  # last b with cum[b] - cum[a] ≤ capacity
    chain = np.zeros(1, dtype=np.int64)
    while chain[-1] != n:
        chain = np.concatenate([chain, jump[chain]])
        jump = jump[jump]
    return np.append(chain[chain < n], n)


class PackedDocuments:
    """The packed samples of a dataset folder: sample ``i`` is tokens ``[starts[i], stops[i])`` then padding.

    A ``SampleSpace``, plus ``num_long_documents`` (truncated or dropped), ``describe`` and ``lengths``.
    """

    packing = "documents"

    def __init__(self, folder: str | Path, sequence_length: int, reader: NanosetReader | None = None,
                 cache_dir: str | Path | None = None, drop_long_documents: bool = False) -> None:
        if sequence_length < 1:
            raise ValueError(f"sequence_length must be ≥ 1, got {sequence_length}")
        self.folder = str(folder)
        self.reader = reader if reader is not None else open_dataset(folder)
        self.sequence_length = sequence_length
        self.drop_long_documents = drop_long_documents
        self.pad_id = _pad_id(self.reader)
        table = _cached_packing(self.reader, sequence_length + 1, drop_long_documents, cache_dir)
        self.num_long_documents = int(table[0, 0])
        self.starts = table[1:, 0]
        self.stops = table[1:, 1]
        self.num_samples = len(self.starts)

    @property
    def mode(self) -> str:
        return "documents-drop" if self.drop_long_documents else "documents-truncate"

    @property
    def sample_key(self) -> str:
        """What identifies this sample space in data hashes: content, length and packing mode."""
        return f"{self.reader.fingerprint}/{self.sequence_length}/{self.mode}"

    def __len__(self) -> int:
        return self.num_samples

    @property
    def kept_tokens(self) -> int:
        """Tokens of the dataset in some packed sample (not in a dropped document or a truncated tail)."""
        return int((self.stops - self.starts).sum())

    @property
    def padding_share(self) -> float:
        """The share of the samples' ``L + 1`` tokens that is padding: what packing costs in compute."""
        return padding_share(self.kept_tokens, self.num_samples, self.sequence_length)

    def describe(self) -> str:
        """One line for the log: how many samples, how much of them is padding, and what happened to documents
        that were too long."""
        fate = "dropped" if self.drop_long_documents else "truncated"
        return (f"{self.folder}: {self.num_samples} packed samples of whole documents (≤ {self.sequence_length + 1} "
                f"tokens, {100 * self.padding_share:.1f}% of them padding); {self.num_long_documents} longer "
                f"documents {fate}")

    def _check(self, indices: np.ndarray | int) -> np.ndarray:
        return checked_indices(indices, self.num_samples, "packed sample", self.folder)

    def token_range(self, i: int | np.ndarray) -> tuple[int, int] | tuple[np.ndarray, np.ndarray]:
        """``[start, stop)`` in the token stream of the documents of sample ``i`` (ints), or of samples ``i``."""
        if np.ndim(i) == 0:
            return int(self.starts[int(i)]), int(self.stops[int(i)])
        idx = np.asarray(i, dtype=np.int64)
        return self.starts[idx], self.stops[idx]

    def lengths(self, indices: np.ndarray | int) -> np.ndarray:
        """Real (non-padding) tokens of each sample."""
        idx = self._check(indices)
        return (self.stops[idx] - self.starts[idx]).reshape(np.shape(indices))

    def tokens(self, indices: np.ndarray | int) -> np.ndarray:
        """Samples ``indices`` stacked, padded with the EOS id (0 without one): ``[*shape, L + 1]`` int64."""
        out = np.empty((np.size(indices), self.sequence_length + 1), dtype=np.int64)
        self.read(indices, out)
        return out.reshape(np.shape(indices) + (self.sequence_length + 1,))

    def position_ids(self, indices: np.ndarray | int) -> np.ndarray:
        """Positions within each document; every padding token is position 0 (a document of its own)."""
        out = np.empty((np.size(indices), self.sequence_length + 1), dtype=np.int64)
        self.read(indices, None, out)
        return out.reshape(np.shape(indices) + (self.sequence_length + 1,))

    def read(self, indices: np.ndarray, tokens: np.ndarray | None, positions: np.ndarray | None = None) -> None:
        """Write samples ``indices`` into ``tokens`` and/or their position ids into ``positions`` (each
        ``[len(indices), L + 1]`` int64), as ``TokenWindows.read`` does."""
        idx = self._check(indices)
        starts, stops = self.starts[idx], self.stops[idx]
        if tokens is not None:
            tokens[...] = self.pad_id
            for row, (start, stop) in enumerate(zip(starts.tolist(), stops.tolist())):
                tokens[row, : stop - start] = self.reader.tokens(start, stop)
        if positions is not None:
            width = self.sequence_length + 1
            position_ids_at(self.reader, starts, width, positions)
            positions[np.arange(width) >= (stops - starts)[:, None]] = 0

    @property
    def has_label_mask(self) -> bool:
        return True

    def label_mask(self, indices: np.ndarray | int, positions: np.ndarray | None = None) -> np.ndarray:
        """``[*shape, L]`` bool: a label counts when its target is a real token that does not start a
        document (no prediction across documents, none of padding) and, with loss masks, is trained on.
        ``positions``: the samples' position ids when the caller has them already."""
        idx = self._check(indices)
        width = self.sequence_length + 1
        if positions is None:
            positions = self.position_ids(idx)
        target = positions.reshape(len(idx), width)[:, 1:] != 0  # padding is position 0 too
        if self.reader.has_loss_masks:
            for row, (start, stop) in enumerate(zip(self.starts[idx].tolist(), self.stops[idx].tolist())):
                n = stop - start
                target[row, : n - 1] &= self.reader.loss_mask(start + 1, stop).astype(bool)
        return target.reshape(np.shape(indices) + (width - 1,))


def padding_share(kept_tokens: int, num_samples: int, sequence_length: int) -> float:
    """Padding's share of ``num_samples`` packed samples of ``sequence_length + 1`` tokens holding ``kept_tokens``."""
    return 1.0 - kept_tokens / (num_samples * (sequence_length + 1)) if num_samples else 0.0


def shorter_sequence_length(reader: NanosetReader, sequence_length: int, drop_long_documents: bool,
                            padding_at_most: float, lost_at_most: float) -> tuple[int, float] | None:
    """The longest power of two below ``sequence_length`` at which the packing of ``reader`` pads at most
    ``padding_at_most`` of its samples' tokens while it loses (truncates or drops) at most ``lost_at_most`` of the
    dataset's tokens, with its padding share; None when no length down to 16 does. One packing per length
    tried, longest first: said only where the padding is worth a note."""
    length = 1 << max(sequence_length - 1, 1).bit_length() - 1
    while length >= 16:
        table = packing_table(reader, length + 1, drop_long_documents)
        kept = int((table[1:, 1] - table[1:, 0]).sum())
        share = padding_share(kept, len(table) - 1, length)
        if share <= padding_at_most and 1 - kept / reader.num_tokens <= lost_at_most:
            return length, share
        length //= 2
    return None


def _pad_id(reader: NanosetReader) -> int:
    tok = reader.tokenizer
    return int(tok.eos_id) if tok is not None and tok.eos_id is not None else 0


def packing_table(reader: NanosetReader, capacity: int, drop_long_documents: bool) -> np.ndarray:
    """``[1 + samples, 2]`` int64: row 0 is ``(long documents, documents)``, then ``(start, stop)`` per sample."""
    ends = reader.document_ends
    lengths = np.diff(ends, prepend=0)
    first = pack_documents(lengths, capacity)
    doc_starts = np.concatenate([[0], ends])
    capped = np.concatenate([[0], np.cumsum(np.minimum(lengths, capacity))])
    starts = doc_starts[first[:-1]]
    stops = starts + capped[first[1:]] - capped[first[:-1]]
    long_docs = lengths > capacity
    keep = stops > starts
    if drop_long_documents:
        longs = np.concatenate([[0], np.cumsum(long_docs)])
        keep &= longs[first[1:]] == longs[first[:-1]]
    table = np.empty((1 + int(keep.sum()), 2), dtype=np.int64)
    table[0] = (int(long_docs.sum()), len(lengths))
    table[1:, 0] = starts[keep]
    table[1:, 1] = stops[keep]
    return table


def _content_key(reader: NanosetReader) -> str:
    """The dataset fingerprint; for a folder without a manifest (whose fingerprint holds only names and
    sizes) also the stamps of its files (``nanoset.cache.file_stamp``), so a rewritten index never meets
    a stale packing."""
    if reader.manifest is not None:
        return reader.fingerprint
    stamps = []
    for shard in reader.shards:
        for path in (shard.tokens_path, shard.index_path):
            if path.is_file():
                stamps.append((str(path), *file_stamp(path)))
    return reader.fingerprint + "-" + hashlib.sha256(json.dumps(stamps).encode()).hexdigest()[:8]


def _cached_packing(reader: NanosetReader, capacity: int, drop: bool, cache_dir: str | Path | None) -> np.ndarray:
    """The packing table, from the cache ``cache_dir/packing/`` (None: computed, not cached)."""
    if cache_dir is None:
        return packing_table(reader, capacity, drop)

    def valid(table: np.ndarray) -> bool:
        return (table.ndim == 2 and table.shape[1] == 2 and len(table) >= 1 and table.dtype == np.int64
                and int(table[0, 1]) == reader.num_documents)

    name = f"v{CACHE_VERSION}-{_content_key(reader)}-{capacity}-{'drop' if drop else 'truncate'}"
    return DerivedCache("packing", cache_dir).array(name, lambda: packing_table(reader, capacity, drop), valid)
