"""``mixing.jsonl``: the decisions of a run's adaptive stages, one JSON line each, in the run folder.

A decision is written as one whole line by a single ``write`` on a file opened for appending, then
fsynced: a crash leaves the lines before it and at most a torn last line, which readers skip and a
resume cuts (with every decision after the resumed step, as ``metrics.jsonl`` is cut). Each line holds
the stage, the step and block that decided, the block it decides (``decides_block``: two later), the
block's per-source inputs, the weights it was trained with (``used``), the decided ``weights`` and the
rule's state after. The data order reads only ``stage``, ``decides_block`` and ``weights``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nanoset.atomic import atomic_write_text
from nanoset.errors import WRITE_ERRNOS, WriteFailed

MIXING_LOG = "mixing.jsonl"


def log_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / MIXING_LOG


def append_decision(path: Path, row: dict) -> None:
    """One decision, as one line written whole and fsynced; a full disk is one line naming the file."""
    line = (json.dumps(row) + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno not in WRITE_ERRNOS:
            raise
        raise WriteFailed(path, e.strerror) from None


def read_rows(path: Path) -> list[dict]:
    """The whole decision lines of ``path`` in file order (a torn or foreign line is skipped); none without a file."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and {"stage", "step", "decides_block", "weights"} <= row.keys():
            rows.append(row)
    return rows


def read_decisions(path: Path) -> dict[str, list[list[float]]]:
    """Per stage, the decided weights of blocks 3, 4, ... without a gap (a later line of a block already read, as
    a resumed run would have cut, replaces nothing: the first one stands)."""
    out: dict[str, list[list[float]]] = {}
    for row in read_rows(path):
        blocks = out.setdefault(row["stage"], [])
        if row["decides_block"] == len(blocks) + 3:
            blocks.append([float(w) for w in row["weights"]])
    return out


def cut_after(path: Path, step: int) -> None:
    """Keep the decisions made at steps ≤ ``step`` (a resume at ``step`` decides the later ones anew); atomic."""
    if not path.is_file():
        return
    kept = [json.dumps(r) + "\n" for r in read_rows(path) if r["step"] <= step]
    atomic_write_text(path, "".join(kept))


def last_decision(path: Path) -> dict | None:
    rows = read_rows(path)
    return rows[-1] if rows else None
