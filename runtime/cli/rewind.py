"""``nanoset train --rewind-to STEP [--skip-steps A:B]… [--exclude-documents FILE]``: data surgery in one command.

The launcher rewinds the run to its checkpoint of ``STEP`` (the later checkpoints moved aside, as any
rewind), records the surgery in the run folder (``surgery.json``: the skipped steps, the documents
excised from step ``STEP + 1``) and starts the workers, which resume ``latest`` with the surgery in force.
The same command again finds its surgery recorded and only resumes the latest checkpoint: a preempted
surgery run continues, nothing is rewound twice. ``--check`` shows what it would do and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanoset.errors import ConfigError
from runtime.checkpoint.layout import checkpoint_name, checkpoints_folder, is_complete, saved_checkpoints
from runtime.checkpoint.run_folder import rewind
from runtime.checkpoint.surgery_log import SURGERY_FILE, RewindEntry, record_entry, recorded_entries
from runtime.config import Config
from runtime.data.order.excision import sorted_unique
from runtime.data.order.surgery import dataset_key, parse_step_range, read_documents_file


@dataclass
class RewindPlan:
    """What ``--rewind-to`` does: the surgery entry, and the checkpoint to rewind to (None: recorded already)."""

    entry: RewindEntry
    checkpoint: Path | None  # step-STEP; None when the entry is recorded already: resume latest

    @property
    def resume(self) -> str:
        """The ``checkpoints.resume`` the launcher's checks use."""
        return str(self.checkpoint) if self.checkpoint is not None else "latest"


def rewind_entry(step: int, skip_steps: list[str], documents_file: str | None, train_steps: int) -> RewindEntry:
    """The surgery of the command line, checked: skips after ``step`` and inside the run, documents well formed
    (their datasets keyed by content, so the record means the same from any working directory, path or node)."""
    if step < 1:
        raise ConfigError(f"--rewind-to {step}: give the step of a saved checkpoint (≥ 1)")
    skips = []
    for text in skip_steps:
        a, b = parse_step_range(text, "--skip-steps")
        if a <= step:
            raise ConfigError(f"--skip-steps {text}: starts at or before the step rewound to ({step}), which is "
                              f"trained already; skip steps after {step}, or rewind to an earlier checkpoint")
        if b > train_steps:
            raise ConfigError(f"--skip-steps {text}: ends after tokens.train_steps {train_steps}; give steps in "
                              f"[{step + 1}, {train_steps}]")
        skips.append(f"{a}:{b}")
    docs = read_documents_file(documents_file, "--exclude-documents") if documents_file is not None else {}
    if not skips and not docs:
        raise ConfigError(f"--rewind-to {step}: give the surgery: --skip-steps A:B (repeatable) and/or "
                          f"--exclude-documents FILE")
    keyed: dict[str, list[np.ndarray]] = {}
    names: dict[str, str] = {}
    for folder, numbers in docs.items():
        key, location = dataset_key(folder)
        names.setdefault(key, location)
        keyed.setdefault(key, []).append(numbers)
    return RewindEntry(step, skips, {f: sorted_unique(np.concatenate(a)).tolist() for f, a in sorted(keyed.items())},
                       names)


def plan_rewind(config: Config, entry: RewindEntry) -> RewindPlan:
    """Rewind to the checkpoint of ``entry.rewind_to``, or (the entry is recorded already) resume the latest."""
    if entry in recorded_entries(config):
        return RewindPlan(entry, None)
    folder = checkpoints_folder(config)
    path = folder / checkpoint_name(entry.rewind_to)
    if not is_complete(path):
        have = ", ".join(p.name for p in saved_checkpoints(folder)) or "none"
        raise ConfigError(f"--rewind-to {entry.rewind_to}: {folder} has no complete checkpoint of step "
                          f"{entry.rewind_to} (its checkpoints: {have}); rewind to one of them")
    return RewindPlan(entry, path)


def carry_out(config: Config, plan: RewindPlan) -> str:
    """Rewind (later checkpoints and metrics moved aside) and record the surgery; the line saying what was done."""
    if plan.checkpoint is None:
        return (f"surgery of --rewind-to {plan.entry.rewind_to} already recorded in "
                f"{config.general.run_path / SURGERY_FILE}: resuming the latest checkpoint")
    rewound = rewind(config, plan.checkpoint, plan.entry.rewind_to)
    record_entry(config, plan.entry)  # after the rewind: a rerun after a crash in between rewinds again (a no-op)
    moved = f"; {rewound.describe()}" if rewound is not None else ""
    return (f"rewound to {plan.checkpoint} (step {plan.entry.rewind_to}), surgery recorded in "
            f"{config.general.run_path / SURGERY_FILE}{moved}")
