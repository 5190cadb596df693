"""The lock of a tokenize job's output folder: no two runs write one task, and no run empties a folder another
one is writing, while the task-index runs of one job (one per machine) still run side by side.

One lock file, ``OUT/.nanoset-work.lock``, and POSIX record locks on its bytes (``fcntl``: between processes
and, on NFS, between machines; the system releases them when a process dies, so a killed run never locks its
rerun out). Byte ``1 + t`` is held exclusively by the run that writes task ``t``: two runs of overlapping task
sets (the same ``--task-index`` twice, or a run of every task beside a task-index run) cannot both hold it.
Byte 0 is held shared by every run, and exclusively by a run that empties the folder (``--overwrite``, or
replacing an unfinished job of other options), which is refused while any other run holds it. Nothing waits:
a run that cannot take its bytes stops at once with one line naming the holder.

The file sits beside the work folder, not in it: the work folder is removed when a folder is emptied and
created whole in one rename, and the lock must be taken before either. Each run appends a line saying who it
is (host, pid, task share) for the refusal of another; the run that finishes the job removes the file, and a
run that locked a file removed meanwhile takes the new one instead.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import sys
from pathlib import Path

from nanoset.errors import NanosetError
from nanoset.format.spec import JOB_LOCK

FOLDER_BYTE = 0  # shared by every run, exclusive to the one that empties the folder
BUSY = (errno.EACCES, errno.EAGAIN)  # what a non-blocking lock taken elsewhere fails with
_FLOCK = "hhqqi"  # Linux's struct flock: l_type, l_whence, l_start, l_len, l_pid (F_GETLK, who holds a range)


class JobBusy(NanosetError):
    """Another run of ``nanoset tokenize`` holds what this one needs of the output folder."""


class LocksUnsupported(Exception):
    """The output folder's filesystem has no record locks (some Lustre or NFS mounts): the message says why."""


def _runs(tasks: list[int]) -> list[tuple[int, int]]:
    """Sorted task indices as ``(first, count)`` runs of consecutive ones: one lock range each."""
    runs: list[tuple[int, int]] = []
    for t in sorted(tasks):
        if runs and runs[-1][0] + runs[-1][1] == t:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((t, 1))
    return runs


class JobLock:
    """The locks one run holds on its output folder, from ``acquire`` to ``release``."""

    def __init__(self, folder: Path, fd: int) -> None:
        self.folder, self.fd = folder, fd

    @classmethod
    def acquire(cls, folder: Path, tasks: list[int], num_tasks: int, task_index: int) -> JobLock:
        """Take byte 0 shared and the bytes of ``tasks`` (this run's share, ``--num-tasks/--task-index``)
        exclusively; ``JobBusy`` naming the holder when another run holds one of them, ``LocksUnsupported`` where
        the filesystem has no locks."""
        path = folder / JOB_LOCK
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
            except OSError as e:  # another user's, say, in a folder this one may write in
                raise NanosetError(f"{path}: cannot open it ({e.strerror}), the lock of the tokenize runs writing "
                                   f"{folder}; remove it if no `nanoset tokenize` runs there, or choose another -o "
                                   f"folder") from None
            try:
                cls._take(fd, fcntl.LOCK_SH, FOLDER_BYTE, 1, folder)
                for first, count in _runs(tasks):
                    cls._take(fd, fcntl.LOCK_EX, 1 + first, count, folder)
            except BaseException:
                os.close(fd)
                raise
            if _names(path, fd):
                break
            os.close(fd)  # the run that finished the job removed the file meanwhile: lock the new one
        os.write(fd, f"{socket.gethostname()} {os.getpid()} {num_tasks} {task_index}\n".encode())
        return cls(folder, fd)

    @staticmethod
    def _take(fd: int, kind: int, start: int, length: int, folder: Path) -> None:
        try:
            fcntl.lockf(fd, kind | fcntl.LOCK_NB, length, start)
        except OSError as e:
            if e.errno not in BUSY:
                raise LocksUnsupported(e.strerror) from None
            holder = _holder(fd, kind, start, length)
            if start == FOLDER_BYTE and kind == fcntl.LOCK_EX:
                raise JobBusy(f"{folder}: another `nanoset tokenize` ({holder}) is writing this folder; it cannot "
                              f"be emptied (--overwrite, or a job of other options) while that one runs: wait "
                              f"for it to end or stop it, or choose another output folder") from None
            raise JobBusy(f"{folder}: another `nanoset tokenize` ({holder}) is writing "
                          f"{'this folder' if start == FOLDER_BYTE else 'these tasks of this folder'}; wait for it "
                          f"to end or stop it (a rerun resumes), and give each machine of one job its own "
                          f"--task-index") from None

    def empty_folder(self) -> None:
        """Hold byte 0 exclusively (no other run is on the folder) while it is emptied; ``JobBusy`` if not."""
        self._take(self.fd, fcntl.LOCK_EX, FOLDER_BYTE, 1, self.folder)
        os.ftruncate(self.fd, 0)  # the holders listed are gone: only this run is left
        os.write(self.fd, f"{socket.gethostname()} {os.getpid()} - -\n".encode())

    def emptied(self) -> None:
        """Back to sharing the folder with the other runs of this job."""
        fcntl.lockf(self.fd, fcntl.LOCK_SH, 1, FOLDER_BYTE)

    def release(self) -> None:
        os.close(self.fd)  # closing the file drops every lock this process holds on it


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` is still the file open as ``fd``."""
    try:
        a, b = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _holder(fd: int, kind: int, start: int, length: int) -> str:
    """Who holds a lock in the way: host and pid from the lines the runs appended (the one of the pid the
    system names, where it does; else the last run whose share holds the range)."""
    pid, first = _conflict(fd, kind, start, length)
    runs = []
    for line in os.pread(fd, 1 << 20, 0).decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[1].isdigit():
            runs.append(parts)
    holders = [r for r in runs if pid and int(r[1]) == pid]
    if not holders and first is not None:
        task = first - 1
        holders = [r for r in runs if first == FOLDER_BYTE or r[2] == "-" or
                (r[2].isdigit() and r[3].isdigit() and int(r[2]) > 0 and task % int(r[2]) == int(r[3]))]
    if holders:
        host, run_pid, n, i = holders[-1]
        share = f", --task-index {i} of {n}" if n.isdigit() and int(n) > 1 else ""
        return f"host {host}, pid {run_pid}{share}"
    return f"pid {pid}" if pid else "another process"


def _conflict(fd: int, kind: int, start: int, length: int) -> tuple[int | None, int | None]:
    """The pid and the first byte of a lock that conflicts with ``kind`` on the range (Linux: ``F_GETLK``); the
    pid is None where the system does not say (other systems lay the record out otherwise; NFS gives 0)."""
    if not sys.platform.startswith("linux"):
        return None, start
    want = fcntl.F_WRLCK if kind == fcntl.LOCK_EX else fcntl.F_RDLCK
    raw = struct.pack(_FLOCK, want, os.SEEK_SET, start, length, 0) + bytes(8)
    try:
        l_type, _, l_start, _, l_pid = struct.unpack_from(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, raw))
    except OSError:
        return None, start
    if l_type == fcntl.F_UNLCK:  # released meanwhile
        return None, start
    return (l_pid or None), l_start
