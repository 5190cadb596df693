"""Writes that leave either the old state or the new one: a temporary name in the same folder,
fsync, then one rename. Used for every file a crash must not leave half written (manifests,
markers, checkpoint metadata, caches, metrics)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

from nanoset.errors import WRITE_ERRNOS, WriteFailed, unwritable_folder

PROBE_PREFIX = ".nanoset-probe-"  # what writable_folder creates and removes at once, to see that it can


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write`` on a temporary file in the same folder, fsync, then rename: old or new, never half. A full
    disk is one line naming the file, and leaves no temporary file behind (nor does a failed rename)."""
    tmp = write_beside(path, write)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_beside(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """``write`` into a fsynced temporary file beside ``path``, returned for the caller to rename onto ``path``
    (``os.replace``), which needs no more space. The name is unique across the machines sharing a folder (a PID
    alone is not: two nodes' writers of one manifest wrote into one file) and starts with
    ``.NAME.tmp-``. A failure removes it; a full disk is a ``WriteFailed`` naming ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno not in WRITE_ERRNOS:
            raise
        raise WriteFailed(path, e.strerror) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_write_array(path: Path, array: np.ndarray) -> None:
    """``array`` as a ``.npy`` file (no pickles), written atomically."""
    atomic_write(path, lambda f: np.save(f, array, allow_pickle=False))


def fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def writable_folder(folder: Path, advice: str, named: Path | None = None) -> Path:
    """``folder``, created with its parents where missing, and checked to take new entries; where either fails,
    one line naming it (or ``named``, what is made in it) and ``advice`` (``unwritable_folder``), not a bare errno
    from deep inside a job. It tries (a probe folder made and removed) rather than asks ``os.access``: root
    passes every permission check, yet can create nothing in /sys, on a read-only filesystem or in an immutable
    folder."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=PROBE_PREFIX, dir=folder))
    except OSError as e:
        raise unwritable_folder(named or folder, e, advice) from None
    return folder


def fresh_folder_beside(out: Path, tmp_name: str) -> Path:
    """An empty folder ``tmp_name`` beside ``out`` (its parents made), where an output is built before its
    rename into place; a place where it cannot be made is one line (``writable_folder``), not a bare errno."""
    tmp = writable_folder(out.parent, "choose another output folder", named=out) / tmp_name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp
