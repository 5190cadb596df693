"""Where datasets live: a local folder, or a folder in an object store (``s3://bucket/key``, ``gs://...``).

Every read of a dataset folder goes through here, never through ``Path.is_file``, ``open`` or ``np.memmap``
in the readers: whether a file or folder is there, its size, a folder's listing, its bytes (whole or a range), an open
file, a memory map, and a remote file's download into the local shard cache (``nanoset.remote_cache``, which
gives a reader the local file it maps). A place is a ``Location`` with one canonical spelling: a local path as given
(``str`` of its ``Path``), a URL as ``scheme://bucket/key`` (scheme in lower case, no empty segment, no
trailing slash). Local POSIX is the first backend; S3 and GCS are reached through obstore (measured at a third
of s3fs's time for a download: tools/bench_storage.py), imported here only, at the first URL, so that the
toolkit and the runtime import and run without it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

from nanoset.errors import NanosetError

T = TypeVar("T")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
# the library each protocol needs, and the extra that installs it
STORES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}  # the protocols read, and the extra of each


def is_url(value: str | os.PathLike) -> bool:
    """Whether ``value`` names a place in an object store (``scheme://...``) rather than a local path."""
    return isinstance(value, (str, Location)) and _URL.match(str(value)) is not None


@dataclass(frozen=True)
class Location:
    """A file or folder, local or remote, in its canonical spelling (``url``; a local path as ``str(Path)``)."""

    url: str

    @property
    def remote(self) -> bool:
        return _URL.match(self.url) is not None

    @property
    def protocol(self) -> str:
        """``file`` for a local path, else the URL's scheme (``s3``, ``gs``)."""
        m = _URL.match(self.url)
        return m.group(1) if m else "file"

    @property
    def path(self) -> Path:
        """The local path (a remote location has none: a reader maps its copy, ``local_file``)."""
        if self.remote:
            raise ValueError(f"{self.url} is not a local path")
        return Path(self.url)

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rpartition("/")[2] if self.remote else self.path.name

    @property
    def parent(self) -> Location:
        if not self.remote:
            return Location(str(self.path.parent))
        scheme, _, rest = self.url.partition("://")
        head, _, _ = rest.rpartition("/")
        return Location(f"{scheme}://{head or rest}")

    def __truediv__(self, name: str) -> Location:
        if not self.remote:
            return Location(str(self.path / name))
        return location(f"{self.url}/{name}")

    def __str__(self) -> str:
        return self.url


def location(value: str | os.PathLike | Location) -> Location:
    """``value`` in its canonical spelling."""
    if isinstance(value, Location):
        return value
    text = os.fspath(value)
    m = _URL.match(text)
    if m is None:
        return Location(str(Path(text)))
    scheme, rest = m.group(1).lower(), m.group(2)
    parts = [p for p in rest.split("/") if p]
    if not parts:
        raise NanosetError(f"{text}: no bucket in the URL (expected {scheme}://BUCKET/PATH)")
    return Location(f"{scheme}://{'/'.join(parts)}")


Where = str | os.PathLike | Location


def resolved(folder: str | os.PathLike) -> str:
    """What names one dataset folder however it was given: a URL in its canonical spelling, a local path with
    links and ``.`` resolved (``A``, ``./A`` and ``/abs/A`` are one folder)."""
    return location(folder).url if is_url(str(folder)) else os.path.realpath(folder)


# --- the operations: one function each, local or remote ---------------------------------------------------------

def is_file(where: Where) -> bool:
    loc = location(where)
    return _remote(loc, lambda fs: fs.is_file(loc)) if loc.remote else loc.path.is_file()


def is_dir(where: Where) -> bool:
    loc = location(where)
    return _remote(loc, lambda fs: fs.is_dir(loc)) if loc.remote else loc.path.is_dir()


def size(where: Where) -> int:
    """The file's size in bytes (``FileNotFoundError`` where it is missing)."""
    loc = location(where)
    return int(_remote(loc, lambda fs: fs.head(loc))["size"]) if loc.remote else loc.path.stat().st_size


def modified_ns(where: Where) -> int:
    """When the file was last written, in nanoseconds since the epoch (an object's upload time)."""
    loc = location(where)
    if not loc.remote:
        return loc.path.stat().st_mtime_ns
    when = _remote(loc, lambda fs: fs.head(loc))["last_modified"]
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


def sizes(folder: Where, names: list[str]) -> list[int | None]:
    """The sizes of the files ``names`` in ``folder`` (None where one is missing): locally one ``stat`` per file
    made relative to the open folder, no path walked per file (0.3 s for 300,000 files); remotely one listing."""
    loc = location(folder)
    if loc.remote:
        listed = _remote(loc, lambda fs: fs.listing(loc))[1]
        return [listed.get(n) for n in names]
    relative = os.stat in os.supports_dir_fd
    fd = os.open(loc.path, os.O_RDONLY) if relative else None
    prefix = "" if relative else str(loc.path) + os.sep
    out: list[int | None] = []
    try:
        for name in names:
            try:
                out.append(os.stat(prefix + name, dir_fd=fd).st_size)
            except (FileNotFoundError, NotADirectoryError):
                out.append(None)
    finally:
        if fd is not None:
            os.close(fd)
    return out


def list_names(where: Where, pattern: str = "*") -> list[str]:
    """The names of the entries of folder ``where`` that match ``pattern`` (files and folders, hidden ones too),
    sorted; empty for a missing folder."""
    loc = location(where)
    if loc.remote:
        folders, files = _remote(loc, lambda fs: fs.listing(loc))
        names = [*folders, *files]
    else:
        try:
            names = os.listdir(loc.path)
        except (FileNotFoundError, NotADirectoryError):
            return []
    return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


def files_under(where: Where) -> list[str]:
    """The paths of every file below folder ``where``, relative to it (``/``-separated), sorted; empty for a
    missing folder."""
    loc = location(where)
    if loc.remote:
        return _remote(loc, lambda fs: fs.walk(loc))
    root = loc.path
    return sorted(str(Path(top, name).relative_to(root)).replace(os.sep, "/")
                  for top, _, names in os.walk(root) for name in names)


def read_bytes(where: Where) -> bytes:
    loc = location(where)
    if loc.remote:
        return _remote(loc, lambda fs: fs.read(loc))
    return loc.path.read_bytes()


def read_text(where: Where) -> str:
    return read_bytes(where).decode("utf-8")


def read_range(where: Where, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of the file (fewer at its end)."""
    loc = location(where)
    if loc.remote:
        return _remote(loc, lambda fs: fs.read(loc, start, stop))
    with open(loc.path, "rb") as f:
        f.seek(start)
        return f.read(stop - start)


def open_read(where: Where) -> IO[bytes]:
    """The file open for reading, in binary."""
    loc = location(where)
    return io.BytesIO(read_bytes(loc)) if loc.remote else open(loc.path, "rb")


def map_range(path: Path, dtype: str | np.dtype, offset: int, count: int) -> np.ndarray:
    """A read-only memory map of ``count`` items of a local file from byte ``offset``."""
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


def download(where: Where, dest: Path, expected_bytes: int | None = None, sha256: str | None = None) -> None:
    """Copy the remote file ``where`` to the local ``dest`` atomically (a temporary name beside it, fsync, rename),
    checked against ``expected_bytes`` and ``sha256`` first: a killed or bad download leaves nothing that a later
    run trusts. A transient failure is retried (``ATTEMPTS`` in all, one note); a checksum mismatch is not."""
    loc = location(where)
    dest.parent.mkdir(parents=True, exist_ok=True)  # a local failure here is no missing object
    _retrying(loc, lambda: _download_once(loc, dest, expected_bytes, sha256))


def upload(path: Path, where: Where) -> None:
    """Copy the local file ``path`` to ``where``. An object store makes an object visible only once whole (the
    atomic publish of a remote file); locally, a temporary name beside it and a rename."""
    loc = location(where)
    if not loc.remote:
        from nanoset.atomic import atomic_write

        with open(path, "rb") as src:
            atomic_write(loc.path, lambda out: shutil.copyfileobj(src, out, DOWNLOAD_BLOCK))
        return
    _remote(loc, lambda fs: fs.put(loc, path))


def holds_copy(where: Where, path: Path) -> bool:
    """Whether ``where`` already holds the bytes of the local file ``path``: the same size and, in an object store,
    the same md5 as the object's ETag (a multi-part upload's ETag is no md5: such an object counts as another)."""
    loc = location(where)
    local_size = path.stat().st_size
    if not loc.remote:
        return loc.path.is_file() and loc.path.stat().st_size == local_size and loc.path.read_bytes() == \
            path.read_bytes()
    try:
        info = _remote(loc, lambda fs: fs.head(loc))
    except FileNotFoundError:
        return False
    if int(info.get("size", -1)) != local_size:
        return False
    md5 = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(DOWNLOAD_BLOCK):
            md5.update(block)
    return str(info.get("e_tag") or "").strip('"') == md5.hexdigest()


def remove(where: Where) -> None:
    """Remove the file ``where`` (nothing where it is missing)."""
    loc = location(where)
    if not loc.remote:
        loc.path.unlink(missing_ok=True)
        return
    try:
        _remote(loc, lambda fs: fs.delete(loc))
    except FileNotFoundError:
        pass


def _copy(blocks: Iterator[bytes], out: IO[bytes], digest: Any) -> int:
    """Write ``blocks`` to ``out`` and into ``digest``; the bytes written."""
    got = 0
    for block in blocks:
        digest.update(block)
        out.write(block)
        got += len(block)
    return got


def _download_once(loc: Location, dest: Path, expected_bytes: int | None, sha256: str | None) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            got = _classified(loc, lambda fs: _copy(fs.stream(loc), out, digest))
            out.flush()
            os.fsync(out.fileno())
        if expected_bytes is not None and got != expected_bytes:
            raise NanosetError(f"{loc}: {got} bytes, the manifest implies {expected_bytes}; the object is truncated "
                               f"or replaced (rewrite the dataset there)")
        if sha256 is not None and digest.hexdigest() != sha256:
            raise NanosetError(f"{loc}: sha256 {digest.hexdigest()[:12]}… differs from the manifest's {sha256[:12]}…; "
                               f"the object is damaged or replaced: nothing was trained on it (rewrite the dataset "
                               f"there)")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


# --- the object-store backend --------------------------------------------------------------------------------------

ATTEMPTS = 3  # tries of a download; the client's own retries (bounded as well) come within each
RETRY_PAUSE_S = 0.5  # doubled after each failed try
DOWNLOAD_BLOCK = 8 << 20
_clients: dict[str, ObjectStore] = {}
_retry_noted: set[str] = set()


class _Transient(Exception):
    """A failure worth another try (a connection dropped, a timeout); ``cause`` in words, with no credential."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


def _note_retry(loc: Location, cause: str) -> None:
    if loc.protocol in _retry_noted:
        return
    _retry_noted.add(loc.protocol)
    print(f"note: retrying {loc} ({cause}); transient errors of {loc.protocol}:// are retried {ATTEMPTS} times",
          file=sys.stderr, flush=True)


def _remote(loc: Location, op: Callable[[Any], T]) -> T:
    """``op(filesystem)`` for ``loc``, retried where it failed for a transient cause."""
    return _retrying(loc, lambda: _classified(loc, op))


def _retrying(loc: Location, call: Callable[[], T]) -> T:
    """``call()``, tried again after a transient failure (``ATTEMPTS`` tries in all, pauses doubling, one note per
    process); a storage that stays unreachable is one line naming the URL and the cause."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call()
        except _Transient as e:
            if attempt == ATTEMPTS:
                raise NanosetError(f"{loc}: cannot reach the storage ({e.cause}) after {ATTEMPTS} attempts; check "
                                   f"that it is up (and AWS_ENDPOINT_URL, where set, names it), then rerun") from None
            _note_retry(loc, e.cause)
            time.sleep(RETRY_PAUSE_S * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def _classified(loc: Location, op: Callable[[ObjectStore], T]) -> T:
    """``op(client)`` for ``loc``, the client's failures in words: a missing object is a ``FileNotFoundError`` (a
    missing bucket one line saying so), denied credentials one line, a failure worth another try a ``_Transient``;
    never a credential in a message (the first line of the client's, which names the request and its status)."""
    fs = _fs(loc)
    errors = fs.obstore.exceptions
    try:
        return op(fs)
    except (FileNotFoundError, errors.NotFoundError) as e:  # obstore raises either, by operation
        if "NoSuchBucket" in str(e):
            raise NanosetError(f"{loc}: the bucket {_split(loc)[0]!r} does not exist (or is not visible with these "
                               f"credentials)") from None
        raise FileNotFoundError(f"{loc}: no such object") from None
    except (errors.PermissionDeniedError, errors.UnauthenticatedError) as e:
        raise NanosetError(f"{loc}: access denied ({_cause(e)}); check the credentials in the environment "
                           f"(AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS)"
                           ) from None
    except errors.GenericError as e:  # connections, timeouts, 5xx: what the client's own retries did not mend
        raise _Transient(_cause(e)) from None
    except errors.BaseError as e:
        raise NanosetError(f"{loc}: the storage refused the request ({_cause(e)})") from None


def _cause(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:200]


def _split(loc: Location) -> tuple[str, str]:
    """(bucket, key) of a remote location."""
    bucket, _, key = loc.url.partition("://")[2].partition("/")
    return bucket, key


class ObjectStore:
    """The object stores of one protocol, through obstore (one client per bucket, made at its first use)."""

    def __init__(self, protocol: str, obstore: Any, store_class: Any, options: dict[str, Any]) -> None:
        self.protocol = protocol
        self.obstore = obstore
        self._store_class = store_class
        self._options = options
        self._stores: dict[str, Any] = {}

    def store(self, loc: Location) -> tuple[Any, str]:
        bucket, key = _split(loc)
        store = self._stores.get(bucket)
        if store is None:
            store = self._stores[bucket] = self._store_class(bucket, **self._options)
        return store, key

    def head(self, loc: Location) -> dict[str, Any]:
        store, key = self.store(loc)
        return self.obstore.head(store, key)

    def is_file(self, loc: Location) -> bool:
        try:
            self.head(loc)
            return True
        except FileNotFoundError:
            return False

    def is_dir(self, loc: Location) -> bool:
        folders, files = self.listing(loc)
        return bool(folders or files)

    def listing(self, loc: Location) -> tuple[list[str], dict[str, int]]:
        """The folder's sub-folder names, and its files' names and sizes (both empty for a missing folder)."""
        store, key = self.store(loc)
        found = self.obstore.list_with_delimiter(store, key + "/" if key else None)
        folders = [p.rstrip("/").rpartition("/")[2] for p in found["common_prefixes"]]
        return folders, {o["path"].rpartition("/")[2]: int(o["size"]) for o in found["objects"]}

    def walk(self, loc: Location) -> list[str]:
        """Every object below the folder ``loc``, relative to it."""
        store, key = self.store(loc)
        prefix = key + "/" if key else ""
        return sorted(o["path"][len(prefix):] for batch in self.obstore.list(store, prefix or None) for o in batch)

    def read(self, loc: Location, start: int | None = None, stop: int | None = None) -> bytes:
        store, key = self.store(loc)
        if start is None:
            return bytes(self.obstore.get(store, key).bytes())
        size = int(self.head(loc)["size"])
        stop = min(stop if stop is not None else size, size)
        return bytes(self.obstore.get_range(store, key, start=start, end=stop)) if stop > start else b""

    def stream(self, loc: Location) -> Iterator[bytes]:
        store, key = self.store(loc)
        for chunk in self.obstore.get(store, key).stream(min_chunk_size=DOWNLOAD_BLOCK):
            yield bytes(chunk)

    def put(self, loc: Location, path: Path) -> None:
        store, key = self.store(loc)
        self.obstore.put(store, key, path)

    def delete(self, loc: Location) -> None:
        store, key = self.store(loc)
        self.obstore.delete(store, key)


def _fs(loc: Location) -> ObjectStore:
    """The client of ``loc``'s protocol, made once per process (and again for another endpoint); a missing library
    is one line naming the extra that installs it."""
    protocol = loc.protocol
    if protocol not in STORES:
        raise NanosetError(f"{loc}: {protocol}:// is not a storage nanoset reads (s3://, gs://)")
    options = _options(protocol)
    slot = f"{protocol} {os.environ.get('AWS_ENDPOINT_URL_S3') or os.environ.get('AWS_ENDPOINT_URL')}"
    client = _clients.get(slot)
    if client is not None:
        return client
    try:
        import obstore
        import obstore.store
    except ImportError:
        raise NanosetError(f"{loc}: reading {protocol}:// needs its library: pip install "
                           f"'nanoset[{STORES[protocol]}]'") from None
    store_class = obstore.store.S3Store if STORES[protocol] == "s3" else obstore.store.GCSStore
    client = _clients[slot] = ObjectStore(protocol, obstore, store_class, options)
    return client


def _options(protocol: str) -> dict[str, Any]:
    """The store's options: endpoint and credentials come from each cloud's standard environment only
    (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``..., ``GOOGLE_APPLICATION_CREDENTIALS``), which
    obstore reads itself; retries are bounded so that a server that stays down ends in one line, not a hang."""
    options: dict[str, Any] = {"retry_config": {"max_retries": 3, "retry_timeout": timedelta(seconds=30)},
                               "client_options": {"connect_timeout": timedelta(seconds=5),
                                                  "timeout": timedelta(seconds=120)}}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    if STORES[protocol] == "s3" and endpoint.startswith("http://"):  # a local server (MinIO, a test's)
        options["client_options"]["allow_http"] = True
    return options
