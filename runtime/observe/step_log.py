"""A run's step logs (``metrics.jsonl``, ``spikes.jsonl``, ``mixing.jsonl``): one JSON object a line, each with its
``step``; the one code that appends to, reads and cuts them.

A line is appended whole by one ``write`` on a file opened for appending: a crash leaves the lines before it and at
most a torn last line, which ``read_rows`` skips. On every start ``cut_after`` keeps the rows of the steps up to the
resumed one (the later steps are trained, and logged, again) and drops a torn line; the file is rewritten
atomically. Plain ``json``, no torch: ``nanoset metrics`` and ``explain`` read the logs without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Hashable
from pathlib import Path

from nanoset.atomic import atomic_write_text
from nanoset.errors import WRITE_ERRNOS, WriteFailed


def append_row(path: Path, row: dict, durable: bool = False) -> None:
    """``row`` as one line written whole (``durable``: fsynced, for a log the data order reads back); a full disk
    (or a quota, a file size limit) is one line naming the file."""
    line = (json.dumps(row) + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno not in WRITE_ERRNOS:
            raise
        raise WriteFailed(path, e.strerror) from None


def read_rows(path: Path) -> list[dict]:
    """The rows of ``path`` in file order: JSON objects with an integer ``step``, a torn or foreign line left out;
    none without a file."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def last_step(path: Path) -> int:
    """The highest step ``path`` holds (0: none)."""
    return max((row["step"] for row in read_rows(path)), default=0)


def cut_after(path: Path, step: int, kind: Callable[[dict], Hashable] = lambda row: 0) -> None:
    """Keep the rows of steps ≤ ``step``: one of each (step, ``kind``), the last one written (the one its checkpoint
    followed), in step order; a torn line is dropped. Atomic; nothing without a file."""
    if not path.is_file():
        return
    rows = {(row["step"], kind(row)): row for row in read_rows(path) if row["step"] <= step}
    atomic_write_text(path, "".join(json.dumps(rows[k]) + "\n" for k in sorted(rows)))
