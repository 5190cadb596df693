"""The shard table, ``nanoset-shards.bin``: a manifest's shards as columns (names, token and document counts,
largest ids, loss counts, the fingerprints) and the rest of the manifest, in a compact binary file beside it.

Why: a folder of 100,000 shards has a 50 MB manifest whose streamed parse takes ~1.5 s; its table is 4.4 MB,
read in milliseconds. The table is tied to the manifest by the manifest's size and sha256 (hashing 50 MB takes
~40 ms), never by file times: its bytes are a function of the manifest's alone (tokenize writes the same folder
whatever its worker count), a copy of the folder keeps a valid table, and a rewritten manifest makes it stale.
A table that is stale, truncated or damaged (its own sha256 closes it) is ignored and built again from the
manifest, never trusted. A folder written before tables existed gets one at its first open: in the folder
where it can be written, else in the user cache, named by the manifest's sha256. Layout: docs/format.md.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import IO

import numpy as np

from nanoset import storage
from nanoset.atomic import atomic_write
from nanoset.cache import DerivedCache
from nanoset.errors import NanosetError
from nanoset.format.spec import (
    FORMAT_NAME,
    FORMAT_VERSION,
    SHARD_TABLE_NAME,
    Manifest,
    ManifestShards,
    ShardTable,
    manifest_from_json,
    read_manifest,
    read_whole_manifest,
)

MAGIC = b"NSSHARDS"
LAYOUT_VERSION = 1
# magic, layout version, reserved, manifest size, manifest sha256, shards, names bytes, head bytes, fingerprints
HEADER = struct.Struct("<8sII Q 32s QQQ 16s16s")
COLUMNS = ("num_tokens", "num_documents", "max_token_id", "loss_tokens")  # int64 each, in this order
DIGEST = 32  # the sha256 of every byte before it closes the file
HASH_BLOCK = 1 << 20
CACHE_FOLDER = "shard-tables"


def manifest_stamp(f: IO[bytes]) -> tuple[int, bytes]:
    """(size, sha256) of the manifest open as ``f`` (read from its start, left at its end): what ties a table to
    it. Read a block at a time into one buffer: a map of the file would count its 50 MB in the process's RSS."""
    h, block = hashlib.sha256(), bytearray(HASH_BLOCK)
    view, size = memoryview(block), 0
    while n := f.readinto(block):
        h.update(view[:n])
        size += n
    return size, h.digest()


def encode_table(manifest: Manifest, size: int, sha256: bytes) -> bytes:
    """The table file of ``manifest``, whose JSON is ``size`` bytes with this ``sha256``."""
    t = manifest.table
    names = "".join(n + "\0" for n in t.names).encode("utf-8")  # a name holds no NUL: no file name does
    head = json.dumps(manifest.head(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    fingerprints = [f.encode("ascii") for f in t.fingerprints]
    body = b"".join([HEADER.pack(MAGIC, LAYOUT_VERSION, 0, size, sha256, len(t), len(names), len(head), *fingerprints),
                     *(np.ascontiguousarray(getattr(t, c), dtype="<i8").tobytes() for c in COLUMNS), names, head])
    return body + hashlib.sha256(body).digest()


def decode_table(data: bytes | None, manifest_path: Path, size: int, sha256: bytes,
                 source: Path | None) -> Manifest | None:
    """The manifest the table ``data`` (read from ``source``) holds, if it is whole and of the manifest of this
    ``size`` and ``sha256``; None for anything else (stale, truncated, damaged, another layout version)."""
    if data is None or len(data) < HEADER.size + DIGEST:
        return None
    try:
        magic, version, _, t_size, t_sha, n, names_len, head_len, *prints = HEADER.unpack_from(data)
        columns_at = HEADER.size
        names_at = columns_at + 8 * len(COLUMNS) * n
        head_at = names_at + names_len
        if (magic, version, t_size, t_sha) != (MAGIC, LAYOUT_VERSION, size, sha256) or \
                head_at + head_len + DIGEST != len(data) or hashlib.sha256(data[:-DIGEST]).digest() != data[-DIGEST:]:
            return None
        columns = [np.frombuffer(data, "<i8", n, columns_at + 8 * n * k).astype(np.int64) for k in range(len(COLUMNS))]
        names = data[names_at:head_at].decode("utf-8").split("\0")
        head = json.loads(data[head_at : head_at + head_len].decode("utf-8"))
        if names.pop() != "" or len(names) != n or not isinstance(head, dict) or \
                (head.get("format"), head.get("version")) != (FORMAT_NAME, FORMAT_VERSION):
            return None
        table = ShardTable(names, *columns, (prints[0].decode("ascii"), prints[1].decode("ascii")))
        return manifest_from_json(head, ManifestShards(manifest_path, table, table_file=source))
    except (ValueError, KeyError, TypeError):  # ValueError: UnicodeDecodeError, bad JSON, a short buffer
        return None


def load_manifest(path: Path) -> Manifest:
    """The manifest at ``path``, read from its table (beside it, else in the user cache), else parsed and its
    table stored for the next open."""
    beside = path.with_name(SHARD_TABLE_NAME)
    try:
        f = storage.open_read(path)
    except OSError:
        return read_whole_manifest(path)  # which names the problem in one line
    with f:  # one open file throughout: the stamp and the parse are of the same bytes, whatever renames
        size, sha256 = manifest_stamp(f)
        cached = cached_table_path(sha256)
        for source in (beside, cached):
            manifest = decode_table(_read(source), path, size, sha256, source)
            if manifest is not None:
                return manifest
        f.seek(0)
        manifest = read_manifest(path, f)
    assert isinstance(manifest.shards, ManifestShards)
    manifest.shards.table_file = store_table(beside, cached, encode_table(manifest, size, sha256))
    return manifest


def cached_table_path(sha256: bytes) -> Path:
    """Where the user cache keeps the table of the manifest with this sha256 (a folder that cannot be written)."""
    return DerivedCache(CACHE_FOLDER).folder / (sha256.hex() + ".bin")


def store_table(beside: Path, cached: Path, data: bytes) -> Path | None:
    """Write the table in the dataset folder, else in the user cache; where it went (None: nowhere could be
    written, and the next open parses the manifest again)."""
    try:
        atomic_write(beside, lambda f: f.write(data))
        return beside
    except (OSError, NanosetError):  # a read-only folder (or a full disk: WriteFailed)
        return store_in_cache(cached, data)


def store_in_cache(path: Path, data: bytes) -> Path | None:
    """The user-cache write of a table: a cache, so a failure only means the work is done again next time (with the
    cache's one note)."""
    written = DerivedCache(CACHE_FOLDER).store(path, lambda: atomic_write(path, lambda f: f.write(data)))
    return path if written else None


def _read(path: Path) -> bytes | None:
    try:
        return storage.read_bytes(path)
    except OSError:
        return None


def check_shard_table(manifest: Manifest) -> None:
    """``nanoset verify``: the table the reader used says what the manifest says, field by field, against the
    manifest read again the plain way (every record, one ``json.loads``); raises naming the first difference."""
    shards = manifest.shards
    assert isinstance(shards, ManifestShards)
    expected = shards.whole()
    where = shards.table_file or shards.path
    difference = table_difference(manifest, expected)
    if difference:
        fix = f"delete {where}: it is built again from the manifest at the next open" if shards.table_file else \
            "a bug in reading the manifest: please report it"
        raise NanosetError(f"{where}: the shard table disagrees with {shards.path} ({difference}); {fix}")


def table_difference(got: Manifest, expected: Manifest) -> str | None:
    """The first difference between two manifests' tables and heads, in words; None when they agree."""
    a, b = got.table, expected.table
    if len(a) != len(b):
        return f"{len(a)} shards, the manifest lists {len(b)}"
    for k, (x, y) in enumerate(zip(a.names, b.names)):
        if x != y:
            return f"shard {k} is {x!r}, the manifest says {y!r}"
    for column in COLUMNS:
        x, y = getattr(a, column), getattr(b, column)
        bad = np.flatnonzero(x != y)
        if len(bad):
            k = int(bad[0])
            return f"shard {b.names[k]!r}: {column} {int(x[k])}, the manifest says {int(y[k])}"
    if a.fingerprints != b.fingerprints:
        return f"fingerprints {a.fingerprints}, the manifest's are {b.fingerprints}"
    x, y = got.head(), expected.head()
    if x != y:
        return f"its {', '.join(sorted(k for k in {*x, *y} if x.get(k) != y.get(k)))} differ"
    return None
