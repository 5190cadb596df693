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
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from nanoset.errors import ConfigError, RunFolderError
from runtime.checkpoint.layout import (
    LATEST,
    checkpoint_step,
    checkpoints_folder,
    latest_name,
    saved_checkpoints,
    step_folders,
    write_latest,
)
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


class RunLock:
    """The locks a run holds while it lives (its run folder's and, kept outside it, its checkpoints folder's).

    ``made``: the folders that taking them created (deepest first); ``close`` removes those that still hold
    nothing but the lock file, so a start-up that ends before training (``--check``, a mistake found after the
    lock) leaves no empty run folder behind."""

    def __init__(self, files: list[IO], made: list[Path] | None = None) -> None:
        self.files = files
        self.made = made or []

    def close(self) -> None:
        for f in self.files:
            f.close()
        for folder in self.made:
            try:
                if [p.name for p in folder.iterdir()] == [RUN_LOCK]:
                    (folder / RUN_LOCK).unlink()
                folder.rmdir()
            except OSError:  # something else is in it now (the run's files): it stays
                pass
        self.made = []


RUN_LOCK = ".nanoset-run.lock"  # inside the run folder (and a checkpoints folder kept outside it)


def run_lock(config: Config) -> RunLock | None:
    """Exclusive locks, held by global rank 0 while the run lives, on ``<run_dir>/.nanoset-run.lock`` and, for a
    ``checkpoints.checkpoints_path`` outside the run folder, on the same file inside that: a second launch of the
    same run (submitted twice, or requeued while the first still runs), or another run saving into the same
    checkpoints folder, is refused instead of writing there (two runs replaced and pruned each other's step-N
    folders). Inside the folders, so that a run needs no write access beside them (a shared filesystem's parent
    folder); ``move_aside`` links the held lock file into the fresh folder."""
    check_writable(config.general.run_path, "general.run_dir", moving=False)
    run = Path(os.path.realpath(config.general.run_path))
    checkpoints = Path(os.path.realpath(checkpoints_folder(config)))
    folders = [(run, config.general.run_path, "general.run_dir", "in this folder")]
    if run != checkpoints and run not in checkpoints.parents:
        check_writable(checkpoints_folder(config), "checkpoints.checkpoints_path", moving=False)
        folders.append((checkpoints, checkpoints_folder(config), "checkpoints.checkpoints_path",
                        "with this checkpoints folder"))
    lock = RunLock([])
    try:
        for real, shown, key, where in folders:
            lock.made[:0] = [p for p in (real, *real.parents) if not p.exists()]  # deepest first
            f = _lock(real, shown, key, where)
            if f is not None:
                lock.files.append(f)
    except BaseException:
        lock.close()
        raise
    if not lock.files:
        lock.close()
        return None
    return lock


def _lock(folder: Path, shown: Path, key: str, where: str) -> IO | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        f = open(folder / RUN_LOCK, "a+")
    except OSError as e:  # check_writable said yes a moment ago: a folder made read-only since, or a race
        raise ConfigError(f"{key}: {shown}: cannot create its run lock {RUN_LOCK} there ({e.strerror or e}); make "
                          f"the folder writable or choose another {key}") from None
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):  # a filesystem without locks (Lustre -o noflock)
            f.close()
            return None
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise RunFolderError(f"{shown}: another run is training {where} ({holder}); wait for it to end or stop it, "
                             f"or choose another {key}") from None
    try:  # who holds it, for the refusal above: best effort (a full disk is said where the run writes)
        f.seek(0)
        f.truncate()
        f.write(f"{socket.gethostname()} pid {os.getpid()}\n")
        f.flush()
    except OSError:
        pass
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
            if (dst / RUN_LOCK).is_file():  # the lock this run holds (its inode, locked) is linked into the new folder
                try:
                    os.link(dst / RUN_LOCK, src / RUN_LOCK)
                except OSError:  # a filesystem without hard links: the lock file moves instead
                    os.replace(dst / RUN_LOCK, src / RUN_LOCK)
            moved.append(dst)
    return moved


REWOUND = "rewound"  # <run_dir>/rewound-<UTC time>/: what a rewind moved aside (a branch of the run)


@dataclass
class Rewound:
    """Where a rewind moved the run's later checkpoints and its metrics."""

    folder: Path  # <run_dir>/rewound-<UTC time>: metrics.jsonl, and checkpoints/ on the run folder's filesystem
    checkpoints: Path  # the later checkpoints, with a `latest` naming the newest

    def describe(self) -> str:
        return describe_rewind("the run's later checkpoints were", self.folder, self.checkpoints)


def describe_rewind(what: str, folder: Path | str, checkpoints: Path | str) -> str:
    """Where a rewind puts ``what`` it moves (``the 2 later checkpoint(s) (...) are``) and the copy of
    metrics.jsonl, for the run's log and for ``--check``."""
    if Path(checkpoints) == Path(folder) / "checkpoints":
        return f"{what} moved to {checkpoints}, and a copy of metrics.jsonl made in {folder}"
    return f"{what} moved to {checkpoints} (on their own filesystem), and a copy of metrics.jsonl made in {folder}"


def later_checkpoints(config: Config, step: int) -> list[Path]:
    """The checkpoints after ``step``: what a rewind to ``step`` moves aside."""
    folder = checkpoints_folder(config)
    return [p for s, p in step_folders(folder) if s > step] if folder.is_dir() else []


def branch_folder(config: Config, aside: Path) -> Path:
    """Where a rewind puts the later checkpoints: ``aside/checkpoints`` on the run folder's filesystem (a rename),
    else ``<checkpoints folder>/<aside's name>`` (a checkpoints_path on another disk is never copied)."""
    folder = checkpoints_folder(config)
    run = config.general.run_path
    same = not run.exists() or os.stat(run).st_dev == os.stat(folder).st_dev
    return aside / "checkpoints" if same else folder / aside.name


def rewind(config: Config, checkpoint: Path, step: int) -> Rewound | None:
    """Resuming ``checkpoint``, of step ``step``, of a run that went further (``checkpoints.resume: PATH`` of an
    earlier checkpoint): ``latest`` names it first (a run that dies before its next checkpoint leaves a folder
    whose ``latest`` resumes what it resumed), then the later checkpoints and the metrics (which the resumed run
    rewrites from ``step`` on) are moved aside, never deleted: to ``<run_dir>/rewound-<UTC time>/``, the
    checkpoints into its ``checkpoints/`` when that is on their filesystem (a rename), else into
    ``<checkpoints folder>/rewound-<UTC time>/`` (a checkpoints_path on another disk is never copied). Returns
    None when nothing came later."""
    folder = checkpoints_folder(config)
    if not folder.is_dir():
        return None
    if Path(os.path.realpath(checkpoint)).parent == Path(os.path.realpath(folder)) and \
            latest_name(folder) != checkpoint.name:
        write_latest(folder, checkpoint)
    later = later_checkpoints(config, step)
    if not later:
        return None
    aside = _stamped(config.general.run_path, REWOUND)
    checkpoints = branch_folder(config, aside)
    moved = 0
    try:
        aside.mkdir(parents=True)
        metrics = config.general.run_path / "metrics.jsonl"
        if metrics.is_file():
            shutil.copy2(metrics, aside / metrics.name)
        checkpoints.mkdir()
        for p in later:
            p.rename(checkpoints / p.name)
            moved += 1
        kept = saved_checkpoints(checkpoints)
        if kept:  # the branch is a checkpoints folder of its own: `resume: latest` there continues it
            write_latest(checkpoints, kept[-1])
    except OSError as e:
        if not moved:  # nothing of the run moved yet: leave no empty folders behind
            shutil.rmtree(checkpoints, ignore_errors=True)
            shutil.rmtree(aside, ignore_errors=True)
        done = (f"{moved} of them were moved, the rest are still in {folder}" if moved else "nothing was moved")
        raise RunFolderError(f"{folder}: rewinding to step {step}: moving the {len(later)} later checkpoints "
                             f"({', '.join(p.name for p in later)}) to {checkpoints} failed ({e.strerror or e}); "
                             f"{done}; fix the cause and rerun") from None
    return Rewound(aside, checkpoints)


def refuse_a_checkpoint_inside_the_run(config: Config, checkpoint: Path) -> None:
    """``checkpoints.resume: PATH`` inside this run's folder (or checkpoints folder) that is not one of the run's own
    checkpoints: a rewound branch's, or one copied there. Resuming it as another run's would find "a run" here, and
    ``replace_run`` would move it aside with the run before loading it: refused, saying how to continue it."""
    run = Path(os.path.realpath(config.general.run_path))
    folder = Path(os.path.realpath(checkpoints_folder(config)))
    path = Path(os.path.realpath(checkpoint))
    if path.parent == folder:
        return
    inside = next((base for base in (run, folder) if base in path.parents), None)
    if inside is None:
        return
    branch = next((q for q in path.parents if q.name.startswith(f"{REWOUND}-") and q.parent in (run, folder)), None)
    if branch is None:
        raise ConfigError(f"checkpoints.resume: {checkpoint}: lies inside this run's folder {inside} but is not one of "
                          f"its checkpoints ({folder}); move it out of the run folder first, or resume one of the "
                          f"run's own checkpoints")
    run_dir = run / branch.name
    keys = f"general.run_dir: {run_dir}"
    if path.parent != run_dir / "checkpoints" or config.checkpoints.checkpoints_path is not None:
        keys += f", checkpoints.checkpoints_path: {path.parent}"
    raise ConfigError(f"checkpoints.resume: {checkpoint}: a checkpoint of a branch that a rewind moved aside "
                      f"({branch}), not one of this run's ({folder}); to go back to that branch, train it as a run "
                      f"of its own: {keys} and checkpoints.resume: {checkpoint}")
