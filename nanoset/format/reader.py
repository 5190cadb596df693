"""Memory-mapped readers: one shard, and a dataset folder seen as one token stream, whatever the
format it is stored in (``nanoset.format.open`` finds the shards; this module reads them).

Opening is cheap and constant in the data size: shards are memory-mapped lazily on first touch, so a
folder of thousands of shards opens in milliseconds and RSS does not grow with the token count.
A folder with a manifest keeps its shards as columns (``ShardTable``, read from the shard table file)
and makes a ``ShardReader`` only for a shard that is read: 100,000 shards cost a few MB and a tenth of a
second to open. Each file's size is checked against the counts when it is mapped (the ``fstat`` a map
makes anyway), so opening makes no ``stat`` per shard; a datatrove folder, whose counts come from its
metadata files, is checked at open, and ``NanosetReader.check_sizes`` checks every shard at once
(``inspect``, ``verify``).
Maps live in a bounded, process-wide LRU (``nanoset.format.mapcache``): any number of shards is read
with a bounded number of open files and maps. Checksums are only read by ``nanoset verify``.
A folder of chat data also has a loss mask per shard (``NAME.ds.loss``, one 0/1 byte per token),
read the same way through ``NanosetReader.loss_mask``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

from nanoset import storage
from nanoset.errors import NanosetError
from nanoset.format.mapcache import new_key, shared_cache, wrong_size
from nanoset.format.maxid import dataset_max_token_id
from nanoset.format.spec import (
    INDEX_DTYPE,
    INDEX_SUFFIX,
    LOSS_DTYPE,
    LOSS_SUFFIX,
    TOKENS_SUFFIX,
    Manifest,
    ShardTable,
    TokenizerInfo,
    shard_files,
)
from nanoset.remote_cache import shard_cache
from nanoset.storage import Location

_MAPS = shared_cache()


def _map_keys() -> tuple[tuple[int, str], tuple[int, str], tuple[int, str]]:
    """Cache keys of a shard reader's maps (tokens, index, loss mask), unique within this process."""
    key = new_key()
    return (key, "ds"), (key, "index"), (key, "loss")


class ShardReader:
    """One shard: ``tokens`` and ``ends`` (cumulative document end offsets) as read-only memory maps.

    Each access goes through the shared map cache, so holding many ShardReaders costs no open
    files; an array obtained earlier stays valid after the cache drops its map.
    """

    format = "datatrove"  # a shard of a folder without a manifest; Nanoset shards have the same files

    def __init__(self, folder: Path, name: str, dtype: np.dtype, num_tokens: int, num_documents: int,
                 has_loss: bool = False, source: Location | None = None, sha256: dict[str, str] | None = None) -> None:
        self.folder = folder
        self.source = source  # a remote dataset's folder: its files are mapped from the shard cache
        self.sha256 = sha256 or {}  # a remote file is checked against it before its first use
        self.name = name
        self.dtype = dtype
        self.num_tokens = num_tokens
        self.num_documents = num_documents
        self.has_loss = has_loss
        files = shard_files(name)
        self.tokens_path = folder / files["ds"]
        self.index_path = folder / files["index"]
        self.metadata_path = folder / files["metadata"]
        self.loss_path = folder / (name + LOSS_SUFFIX)
        self._map_keys = _map_keys()
        # the bytes each mapped file must have (tokens, index, loss mask; None: not checked)
        self._bytes: list[int | None] = [num_tokens * self.dtype.itemsize, num_documents * INDEX_DTYPE.itemsize,
                                         num_tokens * LOSS_DTYPE.itemsize]

    def check_sizes(self) -> None:
        """The data files have exactly the sizes the counts imply (a datatrove folder's open, inspect, verify)."""
        sizes, folder = file_sizes(self.dtype.itemsize, self.has_loss), self.source or self.folder
        found = storage.sizes(folder, [self.name + suffix for suffix, _, _ in sizes])
        for (suffix, per_token, per_document), size in zip(sizes, found):
            check_size(folder / (self.name + suffix), size,
                       self.num_tokens * per_token + self.num_documents * per_document, self.folder)

    def __setstate__(self, state: dict) -> None:
        """Unpickled (e.g. in a DataLoader worker): a fresh cache key, maps reopen lazily there."""
        self.__dict__.update(state)
        self._map_keys = _map_keys()

    def _map(self, slot: int, path: Path, dtype: np.dtype, role: str) -> np.ndarray:
        if self.source is None:  # the hot path: every read of a local shard
            return _MAPS.get(self._map_keys[slot], path, dtype, self._bytes[slot])
        return _MAPS.get(self._map_keys[slot], self._urls[slot], dtype, self._bytes[slot], self.sha256.get(role))

    @cached_property
    def _urls(self) -> tuple[Location, Location, Location]:
        """A remote shard's files (tokens, index, loss mask), made once: every read passes them to the map cache."""
        assert self.source is not None
        return tuple(self.source / p.name for p in (self.tokens_path, self.index_path, self.loss_path))  # type: ignore

    def prefetch(self) -> None:
        """A remote shard: fetch its tokens and index into the shard cache in the background (nothing for a local
        one)."""
        if self.source is None:
            return
        cache = shard_cache()
        for slot, path, role in ((0, self.tokens_path, "ds"), (1, self.index_path, "index")):
            cache.prefetch(self.source / path.name, self._bytes[slot], self.sha256.get(role))

    @property
    def tokens(self) -> np.ndarray:
        return self._map(0, self.tokens_path, self.dtype, "ds")

    @property
    def ends(self) -> np.ndarray:
        return self._map(1, self.index_path, INDEX_DTYPE, "index")

    @property
    def loss(self) -> np.ndarray:
        """The loss mask, one uint8 (1 = trained on) per token; only for a shard with ``has_loss``."""
        if not self.has_loss:
            raise NanosetError(f"{self.tokens_path}: this shard has no loss mask ({self.loss_path.name})")
        return self._map(2, self.loss_path, LOSS_DTYPE, "loss")


def file_sizes(itemsize: int, has_loss: bool) -> list[tuple[str, int, int]]:
    """Each data file of a shard whose tokens take ``itemsize`` bytes: its suffix, and its bytes per token and
    per document (tokens, document ends, the loss mask if any; the metadata file's size is not fixed)."""
    sizes = [(TOKENS_SUFFIX, itemsize, 0), (INDEX_SUFFIX, 0, INDEX_DTYPE.itemsize)]
    if has_loss:
        sizes.append((LOSS_SUFFIX, LOSS_DTYPE.itemsize, 0))
    return sizes


def missing_file(path: str | Path) -> NanosetError:
    """The error for a file of a shard that is not there."""
    return NanosetError(f"{path}: missing; the dataset is incomplete (re-run `nanoset tokenize`)")


def check_size(path: str | Path, size: int | None, expected: int, folder: Path) -> None:
    """One file of a shard (``size`` bytes, None: missing) has exactly ``expected`` bytes: a missing, truncated or
    replaced file is one line."""
    if size is None:
        raise missing_file(path)
    if size != expected:
        raise wrong_size(path, size, expected, folder)


def index_problem(lengths: np.ndarray) -> str | None:
    """What is wrong with a shard index whose documents have these ``lengths`` (differences of its ends; a
    damaged or hand-made shard): a document whose end does not pass the one before. None when nothing is."""
    bad = np.flatnonzero(lengths <= 0)
    return f"document ends not strictly increasing at document {int(bad[0])}" if len(bad) else None


def loss_mask_problem(chunk: np.ndarray, start: int) -> str | None:
    """What is wrong with the loss-mask bytes ``chunk`` (from token ``start``): a value other than 0 and 1.
    None when nothing is."""
    bad = np.flatnonzero(chunk > 1)
    if not len(bad):
        return None
    return f"loss mask value {int(chunk[bad[0]])} at token {start + int(bad[0])}; only 0 and 1 are valid"


class ShardList(Sequence[ShardReader]):
    """The shards of a folder with a manifest: a ``ShardReader`` is made (once) when a shard is first
    asked for, so that opening makes none, whatever the number of shards."""

    def __init__(self, folder: Path, table: ShardTable, dtype: np.dtype, has_loss: bool,
                 source: Location | None = None, checksums: Callable[[int], dict[str, str]] | None = None) -> None:
        self.folder = folder
        self.source = source  # a remote dataset: ``folder`` is its local folder in the shard cache
        self.checksums = checksums  # shard k's sha256 per file, for a remote dataset's downloads
        self.table = table
        self.dtype = np.dtype(dtype)
        self.has_loss = has_loss
        self._made: dict[int, ShardReader] = {}

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        k = i + len(self) if -len(self) <= i < 0 else i
        if not 0 <= k < len(self):
            raise IndexError(f"shard {i} of {len(self)}")
        shard = self._made.get(k)
        if shard is None:
            t = self.table
            shard = self._made[k] = ShardReader(
                self.folder, t.names[k], self.dtype, int(t.num_tokens[k]), int(t.num_documents[k]), self.has_loss,
                self.source, self.checksums(k) if self.checksums is not None else None)
        return shard

    def check_sizes(self) -> None:
        """Every shard's files have the sizes the manifest implies: one ``stat`` per file, made relative to
        the open folder, and nothing else (0.3 s for 100,000 shards, which is why opening leaves it to the maps)."""
        t, folder, sizes = self.table, self.source or self.folder, file_sizes(self.dtype.itemsize, self.has_loss)
        found = iter(storage.sizes(folder, [name + suffix for name in t.names for suffix, _, _ in sizes]))
        for name, tokens, documents in zip(t.names, t.num_tokens.tolist(), t.num_documents.tolist()):
            for suffix, per_token, per_document in sizes:
                check_size(folder / (name + suffix), next(found), tokens * per_token + documents * per_document,
                           folder)


class NanosetReader:
    """A dataset folder (Nanoset or plain datatrove) as one stream of tokens and documents."""

    def __init__(self, folder: Path, shards: Sequence[ShardReader], tokenizer: TokenizerInfo | None,
                 manifest: Manifest | None) -> None:
        self.folder = folder
        self.shards = shards
        self.tokenizer = tokenizer
        self.manifest = manifest
        if isinstance(shards, ShardList):
            self.dtype, self._has_loss = shards.dtype, shards.has_loss
            tokens, documents = shards.table.num_tokens, shards.table.num_documents
        else:
            self.dtype, self._has_loss = shards[0].dtype, all(s.has_loss for s in shards)
            tokens = np.array([s.num_tokens for s in shards], dtype=np.int64)
            documents = np.array([s.num_documents for s in shards], dtype=np.int64)
        self.token_offsets = np.concatenate([[0], np.cumsum(tokens, dtype=np.int64)]).astype(np.int64)
        self.document_offsets = np.concatenate([[0], np.cumsum(documents, dtype=np.int64)]).astype(np.int64)

    @property
    def num_tokens(self) -> int:
        return int(self.token_offsets[-1])

    def check_sizes(self) -> None:
        """Every shard's files have the sizes their counts imply, checked now rather than as each is mapped."""
        if isinstance(self.shards, ShardList):
            self.shards.check_sizes()
        else:
            for shard in self.shards:
                shard.check_sizes()

    @property
    def num_documents(self) -> int:
        return int(self.document_offsets[-1])

    @property
    def format(self) -> str:
        """Where the data comes from: 'nanoset' (a manifest), 'datatrove' or 'megatron'."""
        return "nanoset" if self.manifest is not None else self.shards[0].format

    def shard_of_token(self, pos: int) -> int:
        """The index of the shard that holds token ``pos`` of the stream."""
        return int(np.searchsorted(self.token_offsets, pos, side="right")) - 1

    def shard_of_document(self, i: int) -> int:
        """The index of the shard that holds document ``i``."""
        return int(np.searchsorted(self.document_offsets, i, side="right")) - 1

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the stream: a memmap view inside one shard, a copy across shards."""
        return self._gather(start, stop, "tokens", self.dtype)

    @property
    def has_loss_masks(self) -> bool:
        """Whether every shard has a loss mask (a ``--chat`` dataset, or a datatrove folder with ``.ds.loss``)."""
        return self._has_loss

    def loss_mask(self, start: int, stop: int) -> np.ndarray | None:
        """The loss mask of tokens ``[start, stop)`` (uint8, 1 = the token is trained on), aligned with
        ``tokens(start, stop)``: a memmap view inside one shard, a copy across shards; None when the
        dataset has no loss masks."""
        return self._gather(start, stop, "loss", LOSS_DTYPE) if self.has_loss_masks else None

    def _gather(self, start: int, stop: int, attr: str, dtype: np.dtype) -> np.ndarray:
        """Items ``[start, stop)`` of the per-token array ``attr`` of the shards, as one stream."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"token range [{start}, {stop}) outside [0, {self.num_tokens}) of {self.folder}")
        s = self.shard_of_token(start) if start < self.num_tokens else len(self.shards) - 1
        off = int(self.token_offsets[s])
        if stop <= int(self.token_offsets[s + 1]):
            return getattr(self.shards[s], attr)[start - off : stop - off]
        # copied shard by shard: holding a view of every shard would keep every shard's map open
        out = np.empty(stop - start, dtype=dtype)
        pos = start
        while pos < stop:
            off = int(self.token_offsets[s])
            end = min(stop, int(self.token_offsets[s + 1]))
            out[pos - start : end - start] = getattr(self.shards[s], attr)[pos - off : end - off]
            pos = end
            s += 1
        return out

    @property
    def remote(self) -> bool:
        """Whether the shards are read from object storage (through the node's shard cache)."""
        return isinstance(self.shards, ShardList) and self.shards.source is not None

    def prefetch(self, starts: np.ndarray, stops: np.ndarray) -> None:
        """Fetch in the background, in order, the remote shards that token ranges ``[starts, stops)`` lie in: what
        the next steps read, known ahead from the data order (nothing for a local dataset)."""
        if not self.remote or not len(starts):
            return
        first = np.searchsorted(self.token_offsets, np.asarray(starts), side="right") - 1
        last = np.searchsorted(self.token_offsets, np.maximum(np.asarray(stops) - 1, 0), side="right") - 1
        seen: set[int] = set()
        for a, b in zip(first.tolist(), last.tolist()):
            for k in range(max(a, 0), min(b, len(self.shards) - 1) + 1):
                if k not in seen:
                    seen.add(k)
                    self.shards[k].prefetch()

    def document_bounds(self, i: int) -> tuple[int, int]:
        """Global token range ``[start, end)`` of document ``i``."""
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} outside [0, {self.num_documents}) of {self.folder}")
        s = self.shard_of_document(i)
        local = i - int(self.document_offsets[s])
        ends = self.shards[s].ends
        off = int(self.token_offsets[s])
        return off + (int(ends[local - 1]) if local else 0), off + int(ends[local])

    def document(self, i: int) -> np.ndarray:
        return self.tokens(*self.document_bounds(i))

    def document_ids(self, start: int, stop: int) -> np.ndarray:
        """Ids of the documents that tokens ``[start, stop)`` overlap, in order."""
        first = self.document_at(start)
        last = self.document_at(max(start, stop - 1))
        return np.arange(first, last + 1, dtype=np.int64)

    def document_at(self, pos: int) -> int:
        """Id of the document holding global token ``pos``."""
        s = self.shard_of_token(pos)
        local = int(np.searchsorted(self.shards[s].ends, pos - int(self.token_offsets[s]), side="right"))
        return int(self.document_offsets[s]) + local

    def document_starts(self, start: int, stop: int) -> np.ndarray:
        """Global positions ``p`` with ``start < p < stop`` where a new document begins."""
        out = []
        s = self.shard_of_token(start)
        while s < len(self.shards) and int(self.token_offsets[s]) < stop:
            off = int(self.token_offsets[s])
            ends = self.shards[s].ends
            lo = np.searchsorted(ends, max(start - off, 0), side="right")
            hi = np.searchsorted(ends, stop - off, side="left")
            out.append(ends[lo:hi].astype(np.int64) + off)
            s += 1
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    @cached_property
    def document_ends(self) -> np.ndarray:
        """Global cumulative end offsets of all documents (materialised on first use)."""
        parts = [s.ends.astype(np.int64) + off for s, off in zip(self.shards, self.token_offsets[:-1])]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    @cached_property
    def max_token_id(self) -> int:
        """The largest token id (-1 for no tokens): recorded in the manifest, else scanned once and cached."""
        return dataset_max_token_id(self)

    @cached_property
    def fingerprint(self) -> str:
        """A short hash of what the data is (token and index checksums, or for a folder without a manifest
        its shards' names and counts: its content is not read, so a rewrite keeping every name and count
        looks the same; ``nanoset convert`` gives such data checksums). The metadata file (which names the
        tokenizer) does not count. Loss masks count only where there are some (their checksum, or without a
        manifest their presence), so plain folders keep their fingerprint while a chat folder differs from
        a plain copy of its tokens and from other masks."""
        loss = self.has_loss_masks
        if self.manifest is not None:  # computed while the manifest was read (spec.FingerprintHasher)
            return self.manifest.table.fingerprints[loss]
        payload = [(s.name, s.num_tokens, s.num_documents) + (("loss",) if loss else ()) for s in self.shards]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
