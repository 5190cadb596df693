"""A process-wide, bounded LRU of read-only memory maps of shard files.

Why: a reader must not keep a memory map (and, before Python 3.13, the file descriptor that
``mmap`` duplicates) for every shard file it ever touched: 600 shards would need 1,200 descriptors,
past the common ``ulimit -n 1024``, and ~32k shards would exhaust the kernel's map limit. At most
``2 × max_open_shards`` maps are cached, whatever the number of readers; an evicted map is unmapped
as soon as no array handed out still views it, so views stay valid after eviction.

Each cached map is keyed by a number unique to one shard reader of this process (see
:func:`new_key`), never by path: a reopened dataset never sees the map of a file replaced since.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import resource
import sys
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from nanoset import storage
from nanoset.env import env_number
from nanoset.errors import MissingPath, NanosetError
from nanoset.remote_cache import local_file
from nanoset.storage import Location

DEFAULT_MAX_OPEN_SHARDS = 64
ENV_MAX_OPEN_SHARDS = "NANOSET_MAX_OPEN_SHARDS"
# Python ≥ 3.13 can map a file without keeping a duplicate of its descriptor open.
_MMAP_KWARGS = {"trackfd": False} if sys.version_info >= (3, 13) else {}

_keys = itertools.count()


def new_key() -> int:
    """A key no other shard reader of this process uses (a forked child continues the parent's count)."""
    return next(_keys)


def map_file(source: Path | Location, dtype: np.dtype, expected_bytes: int | None = None,
             sha256: str | None = None) -> np.ndarray:
    """A read-only ndarray over the whole file (a remote file's local copy, checked against ``sha256``); the
    descriptor used to map it is closed at once. With ``expected_bytes``, a file of another size is refused (the
    size a shard's counts imply: checked here, at no cost, rather than by a ``stat`` of every file at open)."""
    path = local_file(source, expected_bytes, sha256)
    try:
        with _open(source, path, expected_bytes, sha256) as f:
            size = os.fstat(f.fileno()).st_size
            if expected_bytes is not None and size != expected_bytes:
                raise wrong_size(path, size, expected_bytes, path.parent)
            if size == 0:
                return np.empty(0, dtype=dtype)
            if size % dtype.itemsize:
                raise NanosetError(f"{path}: {size} bytes is not a multiple of {dtype.itemsize}; the file changed "
                                   f"while in use (run `nanoset verify {path.parent}`)")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ, **_MMAP_KWARGS)
    except FileNotFoundError:  # still a FileNotFoundError: a cache file (Megatron's ends) is rebuilt then
        raise MissingPath(f"{path}: missing: the file was removed or moved since the dataset was written; restore "
                           f"it (run `nanoset verify {path.parent}`) and rerun") from None
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
            raise
        raise NanosetError(f"{path}: cannot map it ({e.strerror}): set ${ENV_MAX_OPEN_SHARDS} lower (shards kept "
                           f"mapped, now {_cache.capacity // 2}) or raise `ulimit -n`") from None
    return np.frombuffer(mm, dtype=dtype)


def _open(source: Path | Location, path: Path, expected_bytes: int | None, sha256: str | None):
    """``path`` open for reading; a remote file's copy evicted by another process since it was fetched is fetched
    again."""
    try:
        return storage.open_read(path)
    except FileNotFoundError:
        if not isinstance(source, Location) or not source.remote:
            raise
        return storage.open_read(local_file(source, expected_bytes, sha256))


def wrong_size(path: str | Path, size: int, expected: int, folder: Path) -> NanosetError:
    """The error for a shard file whose size is not the one its counts imply."""
    return NanosetError(f"{path}: {size} bytes, expected {expected}; the file is truncated or replaced "
                        f"(run `nanoset verify {folder}`)")


def default_max_open_shards() -> int:
    """64, or fewer where ``ulimit -n`` is low: before Python 3.13 every map keeps a file descriptor (two
    per shard), and maps may take at most a quarter of the descriptors the process may open."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if _MMAP_KWARGS or soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_OPEN_SHARDS
    return max(1, min(DEFAULT_MAX_OPEN_SHARDS, soft // 8))


def _env_capacity() -> int:
    return env_number(ENV_MAX_OPEN_SHARDS, default_max_open_shards(), minimum=1)


class MapCache:
    """Least-recently-used memory maps, at most ``capacity`` of them (None: twice ``$NANOSET_MAX_OPEN_SHARDS``, read
    at the first map, inside a command, so that a bad value is its one-line error and not an import's traceback)."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self._maps: OrderedDict[tuple[int, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, str], path: Path | Location, dtype: np.dtype, expected_bytes: int | None = None,
            sha256: str | None = None) -> np.ndarray:
        arr = self._maps.get(key)  # the hot path takes no lock: each dict operation is atomic
        if arr is not None:
            try:
                self._maps.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile: the array stays valid all the same
                pass
            return arr
        arr = map_file(path, dtype, expected_bytes, sha256)
        with self._lock:
            self._maps[key] = arr
            self._evict()
        return arr

    def resize(self, capacity: int | None) -> None:
        """Keep at most ``capacity`` maps from now on (the least recently used go at once)."""
        with self._lock:
            self.capacity = capacity
            self._evict()

    def _evict(self) -> None:
        if self.capacity is None:
            self.capacity = 2 * _env_capacity()
        while len(self._maps) > self.capacity:
            self._maps.popitem(last=False)

    def __len__(self) -> int:
        return len(self._maps)

    def clear(self) -> None:
        with self._lock:
            self._maps.clear()

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a lock held by another thread at fork time would never be released


_cache = MapCache(None)
os.register_at_fork(after_in_child=_cache._after_fork)


def shared_cache() -> MapCache:
    return _cache


def set_max_open_shards(n: int) -> None:
    """Bound the shards (two maps each: tokens and index) kept mapped by this process; default
    ``$NANOSET_MAX_OPEN_SHARDS``, else ``default_max_open_shards()``."""
    if n < 1:
        raise NanosetError(f"max open shards must be ≥ 1, got {n}")
    _cache.resize(2 * n)
