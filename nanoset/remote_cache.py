"""The local shard cache: where the files of a dataset in an object store are kept while a node reads them.

A remote dataset folder has one local folder here (``ROOT/datasets/DIGEST``, DIGEST from its URL) holding its
manifest and shard table, read at every open, and the shard files fetched when a sample first needs them.
A file is downloaded whole, checked against the manifest's size and sha256, and renamed into place
(``nanoset.storage.download``): a killed download leaves only a temporary name, which nothing trusts, and a
file under its final name was checked. One download per node: the processes of a node (its ranks, their
loader workers) share the folder and take a lock per file, so the others wait and then map the same file.
Within ``cache_limit_gb`` the least recently used files go first (a file's time is set at each use; a file
still mapped stays readable after its name is removed); a file larger than the limit is refused in one line.

Settings: ``storage: {cache_dir, cache_limit_gb}`` of a training config (``configure``), kept in the
environment (``$NANOSET_STORAGE_CACHE_DIR``, ``$NANOSET_STORAGE_CACHE_LIMIT_GB``) so that every process the
run starts reads the same; default: ``remote/`` under the user's cache (``nanoset.cache``), no limit.
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
from contextlib import contextmanager
from pathlib import Path

from nanoset import storage
from nanoset.cache import key_digest, user_cache_root
from nanoset.env import env_number
from nanoset.errors import NanosetError
from nanoset.format.spec import MANIFEST_NAME, SHARD_TABLE_NAME
from nanoset.storage import Location

ENV_CACHE_DIR = "NANOSET_STORAGE_CACHE_DIR"
ENV_CACHE_LIMIT_GB = "NANOSET_STORAGE_CACHE_LIMIT_GB"
DATASETS = "datasets"
LOCK_SUFFIX = ".lock"
KEPT = (MANIFEST_NAME, SHARD_TABLE_NAME)  # read at each open, never evicted


def configure(cache_dir: str | Path | None, cache_limit_gb: float | None) -> None:
    """Use ``cache_dir`` (None: the default) within ``cache_limit_gb`` (None: no limit) in this process and every
    process it starts."""
    for name, value in ((ENV_CACHE_DIR, cache_dir), (ENV_CACHE_LIMIT_GB, cache_limit_gb)):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)


def local_file(where: storage.Where, expected_bytes: int | None = None, sha256: str | None = None) -> Path:
    """The local file a reader maps for ``where``: the file itself where it is local, else its copy in the shard
    cache (downloaded once per node, checked against ``sha256`` before its first use)."""
    loc = storage.location(where)
    return shard_cache().fetch(loc, expected_bytes, sha256) if loc.remote else loc.path


class ShardCache:
    """The local copies of remote dataset files under ``root``, at most ``limit_bytes`` of them (None: no limit)."""

    def __init__(self, root: Path, limit_bytes: int | None) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self._ahead: queue.Queue | None = None  # what the prefetch thread fetches next
        self._asked: set[str] = set()

    def folder(self, remote_folder: Location) -> Path:
        """The local folder of a remote dataset folder."""
        return self.root / DATASETS / key_digest(remote_folder.url, 24)  # made by the first download into it

    def fetch(self, loc: Location, expected_bytes: int | None = None, sha256: str | None = None) -> Path:
        """The local copy of the remote file ``loc``, downloaded and checked where this node has none."""
        path = self.folder(loc.parent) / loc.name
        if _usable(path, expected_bytes):
            try:
                os.utime(path)  # used now: the last to evict
                return path
            except FileNotFoundError:  # evicted by another process just now: fetched again below
                pass
        if expected_bytes is not None and self.limit_bytes is not None and expected_bytes > self.limit_bytes:
            raise NanosetError(f"{loc}: {expected_bytes / 1e9:.3g} GB, larger than storage.cache_limit_gb "
                               f"({self.limit_bytes / 1e9:.3g}); raise the limit above the largest shard")
        with _file_lock(path):  # the other processes and threads of the node wait, then find the file
            if not _usable(path, expected_bytes):
                if expected_bytes is not None:
                    self.make_room(expected_bytes, keep=path)
                storage.download(loc, path, expected_bytes, sha256)
            os.utime(path)
        return path

    def prefetch(self, loc: Location, expected_bytes: int | None, sha256: str | None) -> None:
        """Fetch ``loc`` in the background (a daemon thread, files in the order asked, each once per process): the
        shards the next steps read, named by the data order. A failure there is left to the reader's own fetch,
        which then says it in one line."""
        if loc.url in self._asked:
            return
        self._asked.add(loc.url)
        if self._ahead is None:
            self._ahead = queue.Queue()
            threading.Thread(target=self._fetch_ahead, args=(self._ahead,), name="nanoset-shard-prefetch",
                             daemon=True).start()
        self._ahead.put((loc, expected_bytes, sha256))

    def _fetch_ahead(self, ahead: queue.Queue) -> None:
        while True:
            loc, expected_bytes, sha256 = ahead.get()
            try:
                self.fetch(loc, expected_bytes, sha256)
            except Exception:  # noqa: BLE001 - the reader's fetch of this file reports it
                pass

    def refresh(self, loc: Location) -> Path:
        """Download the small file ``loc`` (a manifest, a shard table) again, whatever copy is here."""
        path = self.folder(loc.parent) / loc.name
        with _file_lock(path):
            storage.download(loc, path)
        return path

    def make_room(self, incoming: int, keep: Path) -> None:
        """Remove the least recently used files until ``incoming`` more bytes fit within the limit."""
        if self.limit_bytes is None:
            return
        files = []
        for folder in (self.root / DATASETS).iterdir():
            for entry in os.scandir(folder):
                if entry.is_file() and entry.name not in KEPT and not entry.name.startswith(".") \
                        and not entry.name.endswith(LOCK_SUFFIX) and entry.path != str(keep):
                    st = entry.stat()
                    files.append((st.st_mtime_ns, st.st_size, entry.path))
        used = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if used + incoming <= self.limit_bytes:
                break
            Path(path).unlink(missing_ok=True)
            used -= size


def _usable(path: Path, expected_bytes: int | None) -> bool:
    """A file under its final name was checked when it was renamed there; its size says it was not replaced since."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    return expected_bytes is None or size == expected_bytes


@contextmanager
def _file_lock(path: Path):
    """An exclusive lock on ``PATH.lock``, shared by the processes of this node."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_cache: ShardCache | None = None
_settings: tuple[str | None, str | None] | None = None


def shard_cache() -> ShardCache:
    """This process's cache, as the environment sets it now (``configure``)."""
    global _cache, _settings
    settings = (os.environ.get(ENV_CACHE_DIR), os.environ.get(ENV_CACHE_LIMIT_GB))
    if _cache is None or settings != _settings:
        root = Path(settings[0]) if settings[0] else user_cache_root() / "remote"
        limit = env_number(ENV_CACHE_LIMIT_GB, 0.0, kind=float, minimum=0.0)
        _cache = ShardCache(root, int(limit * 1e9) if settings[1] else None)
        _settings = settings
    return _cache
