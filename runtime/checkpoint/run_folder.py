"""The run folder: one run at a time, never two mixed in one folder.

A lock held by global rank 0 refuses a second launch of a running run; a fresh start where a run
already lives is refused unless ``checkpoints.replace_run`` moves the old one aside; a folder that
cannot be created or written is said before any process group starts.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import IO

from nanoset.errors import ConfigError, RunFolderError
from runtime.checkpoint.layout import LATEST, checkpoint_step, checkpoints_folder, step_folders
from runtime.config import Config


def existing_run(config: Config) -> list[str]:
    """What of a run the run folder (and checkpoints folder) already holds; empty when none."""
    found = []
    metrics = config.general.run_path / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(str(metrics))
    folder = checkpoints_folder(config)
    if folder.is_dir() and any(p.name == LATEST or checkpoint_step(p.name) is not None for p in folder.iterdir()):
        found.append(str(folder))
    return found


def run_lock(config: Config) -> IO | None:
    """An exclusive lock, held by global rank 0 while the run lives, on ``.<run_dir>.lock`` next to the run
    folder (so it survives ``replace_run`` renaming the folder): a second launch of the same run (submitted
    twice, or requeued while the first still runs) is refused instead of writing into the same folder."""
    check_writable(config.general.run_path, "general.run_dir", moving=False)
    run = Path(os.path.realpath(config.general.run_path))
    run.parent.mkdir(parents=True, exist_ok=True)
    f = open(run.parent / f".{run.name}.lock", "a+")
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):  # a filesystem without locks (Lustre -o noflock)
            f.close()
            return None
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise RunFolderError(f"{config.general.run_path}: another run is training in this folder ({holder}); wait "
                          f"for it to end or stop it, or choose another general.run_dir") from None
    f.seek(0)
    f.truncate()
    f.write(f"{socket.gethostname()} pid {os.getpid()}\n")
    f.flush()
    return f


def check_writable(folder: Path, key: str, moving: bool) -> None:
    """Refuse a run or checkpoints folder that cannot be created (or, ``moving`` an old run aside, renamed)
    here, before any process group, instead of a traceback from rank 0 after start-up."""
    target = Path(os.path.realpath(folder))
    existing = target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{key}: {folder}: {existing} is not a folder; choose another {key}")
    for d in [existing] + ([target.parent] if moving and target.exists() else []):
        if not os.access(d, os.W_OK | os.X_OK):
            raise ConfigError(f"{key}: {folder}: cannot write in {d}; choose another {key} or make it writable")
        try:  # os.access says yes to root everywhere, even where nothing can be made (/proc, /sys)
            os.rmdir(tempfile.mkdtemp(prefix=".nanoset-probe-", dir=d))
        except OSError as e:
            raise ConfigError(f"{key}: {folder}: cannot create a folder in {d} ({e.strerror}); choose another "
                              f"{key}") from None


def _stamped(folder: Path, name: str) -> Path:
    """``folder/NAME-<UTC time>``, numbered when that exists already."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dst, n = folder / f"{name}-{stamp}", 1
    while dst.exists():
        dst, n = folder / f"{name}-{stamp}-{n}", n + 1
    return dst


def move_aside(config: Config) -> list[Path]:
    """Rename the old run folder (and its checkpoints folder when that is elsewhere) to ``NAME.old-<UTC time>``."""
    run = config.general.run_path.resolve()
    moved = []
    for src in (run, checkpoints_folder(config).resolve()):
        if src.exists() and (src == run or run not in src.parents):
            dst = _stamped(src.parent, f"{src.name}.old")
            src.rename(dst)
            src.mkdir()  # a run folder given as a link keeps pointing at a folder
            moved.append(dst)
    return moved


def rewind(config: Config, step: int) -> Path | None:
    """Resuming step ``step`` of a run that went further (``checkpoints.resume: PATH`` of an earlier checkpoint):
    its later checkpoints and its metrics (which the resumed run rewrites from ``step`` on) are moved into
    ``<run_dir>/rewound-<UTC time>/``, never deleted; returns that folder, None when nothing came later."""
    folder = checkpoints_folder(config)
    later = [p for s, p in step_folders(folder) if s > step] if folder.is_dir() else []
    if not later:
        return None
    aside = _stamped(config.general.run_path, "rewound")
    (aside / "checkpoints").mkdir(parents=True)
    for p in later:
        p.rename(aside / "checkpoints" / p.name)
    metrics = config.general.run_path / "metrics.jsonl"
    if metrics.is_file():
        shutil.copy2(metrics, aside / metrics.name)
    return aside
