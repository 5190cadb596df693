"""Writes that leave either the old state or the new one: a temporary name in the same folder,
fsync, then one rename. Used for every file a crash must not leave half written (manifests,
markers, checkpoint metadata, caches, metrics)."""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path

from nanoset.errors import NanosetError


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary name in the same folder, fsync, then rename: old or new, never half. The name is
    unique across the machines sharing a folder (a PID alone is not: two nodes' writers of one manifest
    wrote into one file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
            raise
        tmp.unlink(missing_ok=True)
        raise NanosetError(f"{path}: cannot write it ({e.strerror}); free some space (or fix the cause) and rerun "
                           f"the same command") from None
    os.replace(tmp, path)


def fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fresh_folder_beside(out: Path, tmp_name: str) -> Path:
    """An empty folder ``tmp_name`` beside ``out`` (its parents made), where an output is built before its
    rename into place; a place where it cannot be made is one line naming ``out``, not a bare errno."""
    tmp = out.with_name(tmp_name)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise NanosetError(f"{out}: cannot create the output folder there ({e.strerror}); choose another "
                           f"output folder") from None
    return tmp
