"""Megatron-LM indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``, the ``MMIDIDX`` format), read in place.

The ``.idx`` file is a 34-byte header (magic ``MMIDIDX\\x00\\x00``, version 1 as uint64, a dtype code
as uint8, the sequence count and the document-boundary count as uint64), then int32 sequence
lengths, int64 byte pointers into ``.bin`` and int64 document indices (sequence numbers, from 0 to
the sequence count; document ``d`` is sequences ``[indices[d], indices[d+1])``). The token stream
is the ``.bin`` file itself, mapped with its dtype: nothing is copied.

Our readers need each document's cumulative token end. Megatron stores sequence boundaries, so
the ends are derived once from the pointers (in bounded chunks, checking every pointer and index
on the way) and kept in a small file in the user's cache, keyed by the ``.idx`` file's path, size,
modification and status-change times and inode (``nanoset.cache.file_stamp``); dataset folders are
often read-only. Unlike other derived data it must be written (it is mapped, not held in memory: 8
bytes a document, in every process): a cache that cannot be written is an error naming
``$NANOSET_CACHE_DIR``. Documents without tokens are dropped from the ends: they add nothing to the
stream. The tokenizer is unknown, as for datatrove folders, and Megatron data need not end its documents
with EOS, so nothing checks for one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from nanoset import storage
from nanoset.atomic import atomic_write, writable_folder
from nanoset.cache import DerivedCache, file_stamp, key_digest
from nanoset.errors import NanosetError
from nanoset.format.reader import NanosetReader, ShardReader
from nanoset.format.spec import INDEX_DTYPE, MANIFEST_NAME, TOKENS_SUFFIX

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8
# megatron.core.datasets.indexed_dataset.DType codes
DTYPE_CODES = {1: np.dtype("u1"), 2: np.dtype("i1"), 3: np.dtype("<i2"), 4: np.dtype("<i4"),
               5: np.dtype("<i8"), 6: np.dtype("<f8"), 7: np.dtype("<f4"), 8: np.dtype("<u2")}
INDEX_SUFFIX = ".idx"
DATA_SUFFIX = ".bin"
CHUNK = 1 << 22  # sequences or documents per step of the index walk: bounded memory for any size


@dataclass(frozen=True)
class MegatronIndex:
    """The header of one ``.idx`` file, checked against the file's size; arrays are mapped on demand."""

    path: Path
    dtype: np.dtype
    num_sequences: int
    num_boundaries: int  # the header's "document count": one more than the number of documents

    @staticmethod
    def read(path: Path) -> MegatronIndex:
        try:
            head = storage.read_range(path, 0, HEADER_BYTES)
            size = storage.size(path)
        except FileNotFoundError:
            raise NanosetError(f"{path}: missing; a Megatron dataset needs both PREFIX.bin and PREFIX.idx") from None
        if head[: len(MAGIC)] != MAGIC:
            raise NanosetError(f"{path}: not a Megatron index (no MMIDIDX magic at the start)")
        if len(head) < HEADER_BYTES:
            raise NanosetError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte MMIDIDX header; "
                               f"the file is truncated")
        version, code, n, d = struct.unpack("<QBQQ", head[len(MAGIC):])
        if version != VERSION:
            raise NanosetError(f"{path}: MMIDIDX version {version} is not supported (only version {VERSION})")
        if code not in DTYPE_CODES:
            raise NanosetError(f"{path}: unknown MMIDIDX dtype code {code} (known: 1-8)")
        dtype = DTYPE_CODES[code]
        if dtype.kind == "f":
            raise NanosetError(f"{path}: dtype {dtype.name} (code {code}) holds floats, not token ids; "
                               f"only integer Megatron data can be read")
        expected = HEADER_BYTES + 4 * n + 8 * n + 8 * d
        if size == expected + n and n:
            raise NanosetError(f"{path}: has per-sequence modes (a multimodal Megatron dataset); "
                               f"only token data can be read")
        if size != expected:
            raise NanosetError(f"{path}: {size} bytes, but its header ({n} sequences, {d} document indices) "
                               f"implies {expected}; the file is truncated or corrupt")
        return MegatronIndex(path, dtype, n, d)

    def _array(self, dtype: str, offset: int, count: int) -> np.ndarray:
        if count == 0:
            return np.empty(0, dtype=dtype)
        return storage.map_range(self.path, dtype, offset, count)

    @property
    def lengths(self) -> np.ndarray:
        return self._array("<i4", HEADER_BYTES, self.num_sequences)

    @property
    def pointers(self) -> np.ndarray:
        return self._array("<i8", HEADER_BYTES + 4 * self.num_sequences, self.num_sequences)

    @property
    def document_indices(self) -> np.ndarray:
        return self._array("<i8", HEADER_BYTES + 12 * self.num_sequences, self.num_boundaries)

    def last_token_end(self) -> int:
        """Tokens the ``.bin`` file must hold by the last sequence's length and pointer (two values read,
        nothing mapped: every open checks this)."""
        n = self.num_sequences
        if not n:
            return 0
        at = HEADER_BYTES + 4 * (n - 1)
        (length,) = struct.unpack("<i", storage.read_range(self.path, at, at + 4))
        at = HEADER_BYTES + 4 * n + 8 * (n - 1)
        (pointer,) = struct.unpack("<q", storage.read_range(self.path, at, at + 8))
        return (pointer + length * self.dtype.itemsize) // self.dtype.itemsize


def check_data_size(index: MegatronIndex, bin_size: int) -> None:
    """The ``.bin`` file holds exactly the bytes the index's last sequence ends at."""
    need = index.last_token_end() * index.dtype.itemsize
    if need < 0:
        raise NanosetError(f"{index.path}: its last sequence ends at byte {need}; the index is corrupt")
    if bin_size != need:
        what = "truncated" if bin_size < need else "longer than its index says"
        raise NanosetError(f"{index.path.with_suffix(DATA_SUFFIX)}: {bin_size} bytes, but {index.path.name} needs "
                           f"{need}; the file is {what}")


def iter_document_ends(index: MegatronIndex, bin_size: int) -> Iterator[np.ndarray]:
    """The cumulative token end of every non-empty document, in uint64 chunks, checking on the way that
    sequences are contiguous from byte 0 to the end of ``.bin`` and the document indices run from 0 to
    the sequence count without going back. Raises a one-line NanosetError on the first problem."""
    n, size, path = index.num_sequences, index.dtype.itemsize, index.path
    data = path.with_suffix(DATA_SUFFIX)
    if bin_size % size:
        raise NanosetError(f"{data}: {bin_size} bytes is not a multiple of the {size}-byte {index.dtype.name} tokens")
    total = bin_size // size
    lengths, pointers, bounds = index.lengths, index.pointers, index.document_indices
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        length = lengths[lo:hi].astype(np.int64)
        if (length < 0).any():
            j = lo + int(np.argmax(length < 0))
            raise NanosetError(f"{path}: sequence {j} has negative length {int(lengths[j])}; the index is corrupt")
        start = pointers[lo:hi].astype(np.int64)
        expected = np.concatenate([[0 if lo == 0 else int(pointers[lo - 1]) + int(lengths[lo - 1]) * size],
                                   start[:-1] + length[:-1] * size])
        if (start != expected).any():
            j = lo + int(np.argmax(start != expected))
            raise NanosetError(f"{path}: sequence {j} starts at byte {int(pointers[j])}, expected "
                               f"{int(expected[j - lo])} (sequences must follow each other); the index is corrupt")
    check_data_size(index, bin_size)
    if n and (index.num_boundaries < 1 or int(bounds[0]) != 0 or int(bounds[-1]) != n):
        raise NanosetError(f"{path}: document indices must run from 0 to the {n} sequences; the index is corrupt")
    previous_end = 0
    for lo in range(1, index.num_boundaries, CHUNK):
        hi = min(index.num_boundaries, lo + CHUNK)
        b = bounds[lo:hi].astype(np.int64)
        back = b < np.concatenate([[int(bounds[lo - 1])], b[:-1]])
        if back.any() or (b > n).any():
            k = lo + int(np.argmax(back | (b > n)))
            raise NanosetError(f"{path}: document index {k} ({int(bounds[k])}) goes back or past the {n} "
                               f"sequences; the index is corrupt")
        inside = b < n
        ends = np.full(len(b), total, dtype=np.int64)
        ends[inside] = pointers[b[inside]].astype(np.int64) // size
        keep = np.diff(ends, prepend=previous_end) > 0
        if len(ends):
            previous_end = int(ends[-1])
        yield ends[keep].astype(INDEX_DTYPE)


def _cache_file(index_path: Path) -> Path:
    key = "|".join(map(str, [index_path.resolve(), *file_stamp(index_path)]))
    return DerivedCache("megatron-ends").folder / (key_digest(key) + ".ends")


def document_ends_file(index: MegatronIndex, bin_size: int) -> Path:
    """The cached uint64 document ends of ``index`` (written once, atomically, when missing)."""
    path = _cache_file(index.path)
    if storage.is_file(path):
        return path

    def write(f: IO[bytes]) -> None:
        for chunk in iter_document_ends(index, bin_size):
            f.write(chunk.tobytes())

    writable_folder(path.parent, f"set NANOSET_CACHE_DIR to a writable folder (the cache keeps the document index "
                                 f"of {index.path})")
    atomic_write(path, write)  # a full disk is a WriteFailed naming the file
    return path


class MegatronShardReader(ShardReader):
    """One ``PREFIX.bin``/``PREFIX.idx`` pair as a shard: tokens mapped from ``.bin``, document ends
    mapped from the cached ends file (rebuilt if the cache was cleaned meanwhile)."""

    format = "megatron"

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        self.megatron_index = MegatronIndex.read(prefix.with_name(prefix.name + INDEX_SUFFIX))
        data = prefix.with_name(prefix.name + DATA_SUFFIX)
        if not storage.is_file(data):
            raise NanosetError(f"{data}: missing; a Megatron dataset needs both PREFIX.bin and PREFIX.idx")
        bin_size = storage.size(data)
        check_data_size(self.megatron_index, bin_size)
        ends_path = document_ends_file(self.megatron_index, bin_size)
        super().__init__(prefix.parent, prefix.name, self.megatron_index.dtype, self.megatron_index.last_token_end(),
                         storage.size(ends_path) // INDEX_DTYPE.itemsize)
        self.tokens_path = data
        self.index_path = ends_path
        self.metadata_path = self.megatron_index.path
        self._bytes[1] = None  # the cached ends file: its size is where the document count came from

    def check_sizes(self) -> None:
        expected = self.num_tokens * self.dtype.itemsize
        size = storage.size(self.tokens_path) if storage.is_file(self.tokens_path) else None
        if size != expected:
            raise NanosetError(f"{self.tokens_path}: {size} bytes, expected {expected}; the file is missing, "
                               f"truncated or replaced (run `nanoset verify {self.prefix}`)")

    @property
    def ends(self) -> np.ndarray:
        try:
            return super().ends
        except FileNotFoundError:
            self.index_path = document_ends_file(self.megatron_index, storage.size(self.tokens_path))
            return super().ends


def megatron_prefixes(path: Path) -> list[Path] | None:
    """The prefixes ``path`` names: itself when ``path.idx`` or ``path.bin`` exists, the pairs in a folder
    with neither a manifest nor datatrove shards, else None (not Megatron data)."""
    own = [path.with_name(path.name + s) for s in (INDEX_SUFFIX, DATA_SUFFIX)]
    if any(storage.is_file(p) for p in own):
        for p in own:
            if not storage.is_file(p):
                raise NanosetError(f"{p}: missing; a Megatron dataset needs both {own[1].name} and {own[0].name}")
        return [path]
    if path.suffix in (INDEX_SUFFIX, DATA_SUFFIX) and storage.is_file(path):
        raise NanosetError(f"{path}: name the Megatron dataset by its prefix, without {path.suffix} "
                           f"({path.with_suffix('')})")
    if not storage.is_dir(path):
        return None
    stems = {n[: -len(s)] for s in (INDEX_SUFFIX, DATA_SUFFIX) for n in storage.list_names(path, "*" + s)
             if storage.is_file(path / n)}
    if storage.is_file(path / MANIFEST_NAME) or storage.list_names(path, "*" + TOKENS_SUFFIX):
        pairs = sorted(s for s in stems if all(storage.is_file(path / (s + x)) for x in (INDEX_SUFFIX, DATA_SUFFIX)))
        if pairs:  # read as the shards alone, the pairs' tokens would be silently left out
            raise NanosetError(f"{path}: holds both {TOKENS_SUFFIX} shards and Megatron pairs ({', '.join(pairs)}); "
                               f"one folder is one dataset: move the pairs to a folder of their own")
        return None
    for stem in sorted(stems):
        megatron_prefixes(path / stem)  # both files of each pair, or a one-line error
    return [path / stem for stem in sorted(stems)] or None


def open_megatron(path: Path, prefixes: list[Path]) -> NanosetReader:
    """Prefixes (one, or a folder's pairs in name order) as one token stream."""
    shards = [MegatronShardReader(p) for p in prefixes]
    dtypes = sorted({s.dtype.name for s in shards})
    if len(dtypes) > 1:
        raise NanosetError(f"{path}: Megatron files mix token dtypes {dtypes}; one dataset needs one dtype")
    return NanosetReader(path, shards, None, None)


def verify_megatron_shard(shard: MegatronShardReader) -> None:
    """``nanoset verify``: walk the ``.idx`` file again (every length, pointer and document index) and
    compare the document ends it gives with the cached ones the readers use."""
    index = MegatronIndex.read(shard.megatron_index.path)
    ends, pos = shard.ends, 0
    for chunk in iter_document_ends(index, storage.size(shard.tokens_path)):
        if not np.array_equal(ends[pos : pos + len(chunk)], chunk):
            break
        pos += len(chunk)
    else:
        if pos == len(ends):
            return
    raise NanosetError(f"{shard.index_path}: cached document ends differ from {index.path}; delete the cached "
                       f"file and retry")
