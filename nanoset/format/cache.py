"""The user's cache: where what is derived from a dataset is recorded (the largest id of a folder without
one in its manifest, a Megatron index's document ends), and what tells a file changed since.

Dataset folders are often read-only, so records live in ``$NANOSET_CACHE_DIR``, else
``$XDG_CACHE_HOME/nanoset``, else ``~/.cache/nanoset``. A record is keyed by its files' stamps (size,
modification and status-change times, inode number), so an unchanged file is never read again and a changed
one always is: a file rewritten with its size and modification time kept, as ``cp -p`` or ``rsync -a`` do,
still has a new inode or status-change time, which no tool sets back.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("NANOSET_CACHE_DIR"):
        return Path(os.environ["NANOSET_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "nanoset"
    try:
        return Path.home() / ".cache" / "nanoset"
    except (RuntimeError, KeyError):  # no home directory (some containers): a per-machine temporary cache
        return Path(tempfile.gettempdir()) / "nanoset"


def file_stamp(path: Path) -> list[int]:
    """What tells a file's content changed without reading it: size, modification and status-change times,
    inode number."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
