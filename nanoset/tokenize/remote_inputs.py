"""Tokenize inputs named by a URL (a file, a folder, or a glob under ``s3://``/``gs://``): copied through the
storage seam into the node's cache, then read as local files.

Each input keeps its place below the URL's folder in the copy (``inputs/<digest of the folder URL>/...``), so a
folder is walked, and a glob's matches sorted, as a local copy of the same files would be: the output is the one a
local tokenize of those files writes, naming the URLs where that names the input paths. A copy keeps the object's
upload time as its modification time, so a rerun resumes the job (an object replaced since gets a new time: the
job says the input changed) and downloads only what is not there with that size and time.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from pathlib import Path

from nanoset import storage
from nanoset.cache import key_digest
from nanoset.errors import NanosetError
from nanoset.remote_cache import shard_cache
from nanoset.storage import Location, is_url, location
from nanoset.tokenize.inputs import Source, kind_of

INPUTS = "inputs"  # the cache's folder of input copies
_WILDCARDS = "*?["


def local_inputs(inputs: list[str]) -> tuple[list[str], dict[str, str]]:
    """``inputs`` with every URL replaced by its local copy (a folder, or the files a glob matches, in order),
    local paths as given; and each copy's URL by its local path (for ``with_origins``)."""
    out: list[str] = []
    origins: dict[str, str] = {}
    for spec in inputs:
        if not is_url(spec):
            out.append(spec)
            continue
        for local, url in _fetched(spec):
            out.append(str(local))
            origins[str(local)] = url.url
    return out, origins


def with_origins(sources: list[Source], origins: dict[str, str]) -> list[Source]:
    """``sources`` with the URL each cached copy came from, which the output records instead of the cache path."""
    out = []
    for s in sources:
        origin = next((url + s.path[len(local):].replace(os.sep, "/") for local, url in origins.items()
                       if s.path == local or s.path.startswith(local + os.sep)), None)
        out.append(dataclasses.replace(s, origin=origin) if origin is not None else s)
    return out


def _fetched(spec: str) -> list[tuple[Path, Location]]:
    """The local copies of what ``spec`` names, each with its URL."""
    where = location(spec)
    if any(c in where.url for c in _WILDCARDS):
        return _glob(spec, where)
    if storage.is_file(where):
        return [(_copy(where.parent, where.name), where)]
    names = [n for n in storage.files_under(where) if not _hidden(n)]
    if not names:
        raise NanosetError(f"{spec}: no such object, and no folder holds objects there")
    for name in names:
        _copy(where, name)
    return [(_folder(where), where)]


def _glob(spec: str, where: Location) -> list[tuple[Path, Location]]:
    """The local copies of what a glob matches, in sorted order, as ``glob`` matches local paths: each wildcard
    within one path segment; a matched folder whole, a matched file where it is an input kind."""
    parts = where.url.split("/")
    fixed = next(i for i, part in enumerate(parts) if any(c in part for c in _WILDCARDS))
    root, pattern = Location("/".join(parts[:fixed])), parts[fixed:]
    if "**" in pattern:
        raise NanosetError(f"{spec}: '**' is not supported in a URL; name the folder (it is walked recursively)")
    names = [n for n in storage.files_under(root) if not _hidden(n)]
    matches: dict[str, list[str]] = {}  # what matched -> the files it holds
    for name in names:
        segments = name.split("/")
        if len(segments) >= len(pattern) and all(fnmatch.fnmatchcase(s, p) for s, p in zip(segments, pattern)):
            matched = "/".join(segments[: len(pattern)])
            if matched != name or kind_of(name):
                matches.setdefault(matched, []).append(name)
    if not matches:
        raise NanosetError(f"{spec}: no object matches it")
    for files in matches.values():
        for name in files:
            _copy(root, name)
    return [(_folder(root) / matched, root / matched) for matched in sorted(matches)]


def _hidden(name: str) -> bool:
    """Names a local walk skips (``.`` files and folders)."""
    return any(part.startswith(".") for part in name.split("/"))


def _folder(root: Location) -> Path:
    return shard_cache().root / INPUTS / key_digest(root.url, 24)


def _copy(root: Location, name: str) -> Path:
    """The local copy of ``root/name``, downloaded unless there with the object's size and upload time."""
    src, dest = root / name, _folder(root) / name
    size, modified = storage.size(src), storage.modified_ns(src)
    try:
        st = dest.stat()
        if st.st_size == size and st.st_mtime_ns == modified:
            return dest
    except FileNotFoundError:
        pass
    storage.download(src, dest, expected_bytes=size)
    os.utime(dest, ns=(modified, modified))
    return dest
