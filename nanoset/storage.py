"""Where datasets live: a local folder, or a folder in an object store (``s3://bucket/key``, ``gs://...``).

Every read of a dataset folder goes through here, never through ``Path.is_file``, ``open`` or ``np.memmap``
in the readers: whether a file exists, its size, a folder's listing, its bytes (whole or a range), an open
file, a memory map, and a remote file's download into the local shard cache (``nanoset.remote_cache``, which
gives a reader the local file it maps). A place is a ``Location`` with one canonical spelling: a local path as given
(``str`` of its ``Path``), a URL as ``scheme://bucket/key`` (scheme in lower case, no empty segment, no
trailing slash). Local POSIX is the first backend; object stores are reached through fsspec, whose
libraries (s3fs, gcsfs) are imported here only, at the first URL, so that the toolkit and the runtime
import and run without them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

from nanoset.errors import NanosetError

T = TypeVar("T")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
# the library each protocol needs, and the extra that installs it
EXTRAS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}


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


# --- the operations: one function each, local or remote ---------------------------------------------------------

def exists(where: Where) -> bool:
    loc = location(where)
    return _remote(loc, lambda fs: fs.exists(_key(loc))) if loc.remote else loc.path.exists()


def is_file(where: Where) -> bool:
    loc = location(where)
    return _remote(loc, lambda fs: fs.isfile(_key(loc))) if loc.remote else loc.path.is_file()


def is_dir(where: Where) -> bool:
    loc = location(where)
    return _remote(loc, lambda fs: fs.isdir(_key(loc))) if loc.remote else loc.path.is_dir()


def size(where: Where) -> int:
    """The file's size in bytes (``FileNotFoundError`` where it is missing)."""
    loc = location(where)
    return int(_remote(loc, lambda fs: fs.size(_key(loc)))) if loc.remote else loc.path.stat().st_size


def sizes(folder: Where, names: list[str]) -> list[int | None]:
    """The sizes of the files ``names`` in ``folder`` (None where one is missing): locally one ``stat`` per file
    made relative to the open folder, no path walked per file (0.3 s for 300,000 files); remotely one listing."""
    loc = location(folder)
    if loc.remote:
        try:
            entries = _remote(loc, lambda fs: fs.ls(_key(loc), detail=True, refresh=True))
        except FileNotFoundError:
            entries = []
        listed = {p["name"].rpartition("/")[2]: int(p["size"]) for p in entries if p.get("type") == "file"}
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
        try:
            names = [p.rstrip("/").rpartition("/")[2]
                     for p in _remote(loc, lambda fs: fs.ls(_key(loc), detail=False, refresh=True))]
        except FileNotFoundError:
            return []
    else:
        try:
            names = os.listdir(loc.path)
        except (FileNotFoundError, NotADirectoryError):
            return []
    return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


def read_bytes(where: Where) -> bytes:
    loc = location(where)
    if loc.remote:
        return _remote(loc, lambda fs: fs.cat_file(_key(loc)))
    return loc.path.read_bytes()


def read_text(where: Where) -> str:
    return read_bytes(where).decode("utf-8")


def read_range(where: Where, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of the file (fewer at its end)."""
    loc = location(where)
    if loc.remote:
        return _remote(loc, lambda fs: fs.cat_file(_key(loc), start=start, end=stop))
    with open(loc.path, "rb") as f:
        f.seek(start)
        return f.read(stop - start)


def open_read(where: Where) -> IO[bytes]:
    """The file open for reading, in binary."""
    loc = location(where)
    return _remote(loc, lambda fs: fs.open(_key(loc), "rb")) if loc.remote else open(loc.path, "rb")


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
    _remote(loc, lambda fs: fs.put_file(str(path), _key(loc)))
    _remote(loc, lambda fs: fs.invalidate_cache(_key(loc.parent)))


def holds_copy(where: Where, path: Path) -> bool:
    """Whether ``where`` already holds the bytes of the local file ``path``: the same size and, in an object store,
    the same md5 as the object's ETag (a multi-part upload's ETag is no md5: such an object counts as another)."""
    loc = location(where)
    local_size = path.stat().st_size
    if not loc.remote:
        return loc.path.is_file() and loc.path.stat().st_size == local_size and loc.path.read_bytes() == \
            path.read_bytes()
    try:
        info = _remote(loc, lambda fs: fs.info(_key(loc), refresh=True))
    except FileNotFoundError:
        return False
    if int(info.get("size", -1)) != local_size:
        return False
    md5 = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(DOWNLOAD_BLOCK):
            md5.update(block)
    return str(info.get("ETag", "")).strip('"') == md5.hexdigest()


def remove(where: Where) -> None:
    """Remove the file ``where`` (nothing where it is missing)."""
    loc = location(where)
    if not loc.remote:
        loc.path.unlink(missing_ok=True)
        return
    try:
        _remote(loc, lambda fs: fs.rm_file(_key(loc)))
    except FileNotFoundError:
        pass
    _remote(loc, lambda fs: fs.invalidate_cache(_key(loc.parent)))


def _download_once(loc: Location, dest: Path, expected_bytes: int | None, sha256: str | None) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    digest, got = hashlib.sha256(), 0
    try:
        with _classified(loc, lambda fs: fs.open(_key(loc), "rb", block_size=DOWNLOAD_BLOCK)) as src, \
                open(tmp, "wb") as out:
            while True:
                block = _classified(loc, lambda fs: src.read(DOWNLOAD_BLOCK))
                if not block:
                    break
                digest.update(block)
                out.write(block)
                got += len(block)
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
_filesystems: dict[str, Any] = {}
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


def _classified(loc: Location, op: Callable[[Any], T]) -> T:
    """``op(filesystem)`` for ``loc``, its failures in words: a missing object stays a ``FileNotFoundError`` (a
    missing bucket says so), denied credentials and a storage that stays unreachable are one line naming the URL
    and the cause (never a credential: the messages are the client's error codes and the endpoint)."""
    fs = _fs(loc)
    try:
        return op(fs)
    except FileNotFoundError as e:
        bucket = _key(loc).partition("/")[0]
        if "bucket" in str(e).lower():
            raise NanosetError(f"{loc}: the bucket {bucket!r} does not exist (or is not visible with these "
                               f"credentials)") from None
        raise
    except PermissionError as e:
        raise NanosetError(f"{loc}: access denied ({_cause(e)}); check the credentials in the environment "
                           f"(AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS)"
                           ) from None
    except (NanosetError, _Transient):
        raise
    except Exception as e:  # the client's connection and protocol errors (botocore's are not OSErrors)
        name = type(e).__name__
        if "Connect" in name or "Timeout" in name or "Connection" in str(e) or isinstance(e, (OSError, TimeoutError)):
            raise _Transient(_cause(e)) from None
        raise NanosetError(f"{loc}: the storage refused the request ({_cause(e)})") from None


def _cause(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:200]


def _key(loc: Location) -> str:
    return loc.url.partition("://")[2]


def _fs(loc: Location) -> Any:
    """The fsspec filesystem of ``loc``'s protocol, made once per process; a missing library is one line naming the
    extra that installs it."""
    protocol = loc.protocol
    options = _options(protocol)
    slot = f"{protocol} {options.get('endpoint_url')}"  # a changed endpoint (a test's server) is another client
    fs = _filesystems.get(slot)
    if fs is not None:
        return fs
    library, extra = EXTRAS.get(protocol, (None, None))
    try:
        import fsspec

        if library is not None:
            __import__(library)
        fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
    except ImportError:
        install = f"pip install 'nanoset[{extra}]'" if extra else f"install the fsspec library for {protocol}://"
        raise NanosetError(f"{loc}: reading {protocol}:// needs its library: {install}") from None
    except ValueError as e:  # an unknown protocol
        raise NanosetError(f"{loc}: {protocol}:// is not a storage this installation can read ({e})") from None
    _filesystems[slot] = fs
    return fs


def _options(protocol: str) -> dict[str, Any]:
    """The filesystem's options: endpoint and credentials come from each cloud's standard environment only
    (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``..., ``GOOGLE_APPLICATION_CREDENTIALS``); retries
    are bounded so that a server that stays down ends in one line, not a hang."""
    if protocol in ("s3", "s3a"):
        options: dict[str, Any] = {"config_kwargs": {"retries": {"max_attempts": 3, "mode": "standard"},
                                                     "connect_timeout": 5, "read_timeout": 30}}
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options["endpoint_url"] = endpoint
        return options
    return {}
