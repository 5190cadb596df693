"""``mixing.jsonl``: the decisions of a run's adaptive stages, one JSON line each, in the run folder.

A decision is written as one whole line by a single ``write`` on a file opened for appending, then
fsynced: a crash leaves the lines before it and at most a torn last line, which readers skip and a
resume cuts (with every decision after the resumed step, as ``metrics.jsonl`` is cut). Each line holds
the stage, the step and block that decided, the block it decides (``decides_block``: two later), the
block's per-source inputs, the weights it was trained with (``used``), the decided ``weights`` and the
rule's state after. The data order reads only ``stage``, ``decides_block`` and ``weights``.
"""

from __future__ import annotations

from pathlib import Path

from runtime.observe import step_log

MIXING_LOG = "mixing.jsonl"


def log_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / MIXING_LOG


def append_decision(path: Path, row: dict) -> None:
    """One decision, as one line written whole and fsynced (the data order reads it back); a full disk is one line
    naming the file."""
    step_log.append_row(path, row, durable=True)


def read_rows(path: Path) -> list[dict]:
    """The whole decision lines of ``path`` in file order (a torn or foreign line is skipped); none without a file."""
    return [row for row in step_log.read_rows(path) if {"stage", "decides_block", "weights"} <= row.keys()]


def cut_after(path: Path, step: int) -> None:
    """Keep the decisions made at steps ≤ ``step`` (a resume at ``step`` decides the later ones anew); atomic."""
    step_log.cut_after(path, step, kind=lambda row: str(row.get("stage")))


def read_decisions(path: Path) -> dict[str, list[list[float]]]:
    """Per stage, the decided weights of blocks 3, 4, ... without a gap (a later line of a block already read, as
    a resumed run would have cut, replaces nothing: the first one stands)."""
    out: dict[str, list[list[float]]] = {}
    for row in read_rows(path):
        blocks = out.setdefault(row["stage"], [])
        if row["decides_block"] == len(blocks) + 3:
            blocks.append([float(w) for w in row["weights"]])
    return out
