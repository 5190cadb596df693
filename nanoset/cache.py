"""Derived data: what is computed from a dataset or a config once, kept, and read back at the next start
(document packings, weight-schedule counts, the largest token id of a folder without one in its manifest).

One policy for all of it. An entry is named by a key that holds everything it is computed from, content
stamps included (``file_stamp``: size, modification and status-change times, inode number), so an unchanged
input is never read again and a changed one always is: a file rewritten with its size and modification time
kept, as ``cp -p`` or ``rsync -a`` do, still has a new inode or status-change time, which no tool sets back.
It is written atomically (``nanoset.atomic``), and an entry that cannot be read back as it was written (a
damaged or foreign file) is computed again and replaced. A cache that cannot be written costs only time:
the value is used all the same, computed again at the next start, and one note per process and cache root
says so — never an error, never silent.

One root rule: the root a caller names (a training run's ``general.cache_dir``), else the user's cache:
``$NANOSET_CACHE_DIR``, else ``$XDG_CACHE_HOME/nanoset``, else ``~/.cache/nanoset`` (a folder in the
temporary directory where there is no home). Dataset folders are often read-only, so nothing derived is kept
beside the data.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from nanoset.atomic import atomic_write_array, atomic_write_text
from nanoset.errors import WriteFailed

ENV_CACHE_DIR = "NANOSET_CACHE_DIR"

_noted: set[str] = set()  # the roots this process has said it cannot write to


def user_cache_root() -> Path:
    """The user's cache: ``$NANOSET_CACHE_DIR``, else ``$XDG_CACHE_HOME/nanoset``, else ``~/.cache/nanoset``."""
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "nanoset"
    try:
        return Path.home() / ".cache" / "nanoset"
    except (RuntimeError, KeyError):  # no home directory (some containers): a per-machine temporary cache
        return Path(tempfile.gettempdir()) / "nanoset"


def cache_root(configured: str | Path | None = None) -> Path:
    """The cache root: ``configured`` (a run's ``general.cache_dir``) when given, else the user's cache."""
    return Path(configured) if configured is not None else user_cache_root()


def file_stamp(path: Path) -> list[int]:
    """What tells a file's content changed without reading it: size, modification and status-change times,
    inode number."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def key_digest(key: object, length: int = 32) -> str:
    """A file name for ``key``: the sha256 of the string itself, or of the JSON of anything else."""
    text = key if isinstance(key, str) else json.dumps(key, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def _entry_name(key: object) -> str:
    """A string key names its file as it is (a readable name: a packing's says dataset and length); any other
    key (a list, a dict) is named by its digest."""
    if isinstance(key, str):
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"a cache entry name must be a plain file name, got {key!r}")
        return key
    return key_digest(key)


class DerivedCache:
    """The entries of one kind of derived data (``kind``: their folder under the root, e.g. ``packing``)."""

    def __init__(self, kind: str, root: str | Path | None = None) -> None:
        self.root = cache_root(root)
        self.folder = self.root / kind

    def array(self, key: object, compute: Callable[[], np.ndarray],
              valid: Callable[[np.ndarray], bool] = lambda a: True) -> np.ndarray:
        """The array of ``key``: read back (memory-mapped) from ``FOLDER/NAME.npy`` when there and ``valid``,
        else ``compute()``, stored and returned. ``NAME``: a string key itself, else the key's digest."""
        path = self.folder / f"{_entry_name(key)}.npy"
        try:
            stored = np.load(path, mmap_mode="r", allow_pickle=False)
            if valid(stored):
                return stored
        except (OSError, ValueError, EOFError):  # missing, or not an .npy file as this cache writes them
            pass
        value = compute()
        self.store(path, lambda: atomic_write_array(path, value))
        return value

    def record(self, key: dict[str, Any], compute: Callable[[], dict[str, Any]], slot: str | None = None,
               valid: Callable[[dict[str, Any]], bool] = lambda r: True) -> dict[str, Any]:
        """A small JSON record: ``key``'s items and ``compute()``'s in one object, in ``FOLDER/NAME.json``,
        ``NAME`` the ``slot`` (one file per slot, e.g. per dataset folder: a new key replaces the old record)
        or the key's digest. Read back when the file holds ``key``'s items and is ``valid``."""
        path = self.folder / f"{_entry_name(slot if slot is not None else key)}.json"
        expected = json.loads(json.dumps(key))  # as it reads back: tuples are lists
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            if (isinstance(stored, dict) and all(stored.get(k) == v for k, v in expected.items())
                    and valid(stored)):
                return stored
        except (OSError, ValueError):  # missing, unreadable, not JSON (a damaged file)
            pass
        stored = {**expected, **compute()}
        self.store(path, lambda: atomic_write_text(path, json.dumps(stored)))
        return stored

    def store(self, path: Path, write: Callable[[], None]) -> bool:
        """``write()`` a file of this cache (``path`` under ``folder``; ``write`` atomic); where it cannot, one note
        per process and root, and False (the caller goes on with what it computed)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write()
            return True
        except (OSError, WriteFailed) as e:
            reason = e.reason if isinstance(e, WriteFailed) else (e.strerror or str(e))
            _note_unwritable(self.root, path, reason)
            return False


def _note_unwritable(root: Path, path: Path, reason: str) -> None:
    if str(root) in _noted:
        return
    _noted.add(str(root))
    print(f"note: cannot write the cache file {path} ({reason}): what the cache {root} holds is computed again at "
          f"every start until it can be written; make it writable, or set general.cache_dir (or "
          f"${ENV_CACHE_DIR}) to a writable folder", file=sys.stderr, flush=True)
