"""The surgery a run folder records: what ``nanoset train --rewind-to`` did, so that no later start drops it.

``<run_dir>/surgery.json`` holds one entry per rewind: the step rewound to, the steps skipped and the
documents excised from the step after it (or after an earlier step a later rewind returned to). Every start
of the run (the trainer, ``explain``, ``--check``) adds them to the config's ``surgery:`` section; a
checkpoint records the union in force. Written atomically, read as plain JSON: a missing file is no surgery.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from nanoset.atomic import atomic_write_text
from nanoset.errors import ConfigError
from runtime.config import Config
from runtime.data.order.surgery import (
    SURGERY_KEY,
    Surgery,
    config_surgery,
    resumed_surgery,
    surgery_of,
)

SURGERY_FILE = "surgery.json"


@dataclass(frozen=True)
class RewindEntry:
    """One ``--rewind-to STEP [--skip-steps A:B]… [--exclude-documents FILE]``."""

    rewind_to: int
    skip_steps: list[str] = field(default_factory=list)
    exclude_documents: dict[str, list[int]] = field(default_factory=dict)  # dataset key → document indices
    datasets: dict[str, str] = field(default_factory=dict, compare=False)  # dataset key → its folder (display)

    def surgery(self, from_step: int | None = None) -> Surgery:
        """Its skips, and its documents excluded from ``from_step`` (default: the step after the one rewound to)."""
        docs = {f: np.array(d, dtype=np.int64) for f, d in self.exclude_documents.items()}
        first = self.rewind_to + 1 if from_step is None else from_step
        return surgery_of(self.skip_steps, docs, first, f"{SURGERY_FILE}: rewind to {self.rewind_to}", self.datasets)


def surgery_file(config: Config) -> Path:
    return config.general.run_path / SURGERY_FILE


def recorded_entries(config: Config) -> list[RewindEntry]:
    """The rewinds the run folder records, in the order they were made."""
    path = surgery_file(config)
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [RewindEntry(int(e["rewind_to"]), list(e["skip_steps"]), dict(e["exclude_documents"]),
                            dict(e.get("datasets", {}))) for e in data["rewinds"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: cannot read the run's recorded surgery ({e}); restore the file (a copy is in "
                          f"every checkpoint's metadata.json, extensions.{SURGERY_KEY})") from None


def record_entry(config: Config, entry: RewindEntry) -> None:
    """Append ``entry`` to the run folder's record (atomically)."""
    entries = [*recorded_entries(config), entry]
    path = surgery_file(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"rewinds": [asdict(e) for e in entries]}, indent=1) + "\n")


def run_surgery(config: Config, pending: RewindEntry | None = None) -> Surgery:
    """The config's ``surgery:`` and every rewind the run folder records (and ``pending``, one not yet recorded).
    A rewind's exclusions apply from the earliest step it or a later rewind returned to: a later rewind to an
    earlier step trains those steps again, and what the earlier rewind excised stays out of them."""
    total = config_surgery(config)
    entries = [*recorded_entries(config), *([pending] if pending is not None else [])]
    for i, entry in enumerate(entries):
        total = total.union(entry.surgery(min(e.rewind_to for e in entries[i:]) + 1))
    return total


def surgery_at_resume(surgery: Surgery, metadata: dict | None, last_step: int, checkpoint: Path | None) -> Surgery:
    """The surgery of a run starting from ``checkpoint`` (None: step 0): with the checkpoint's own, and refused when
    it would change a step that checkpoint trained."""
    if checkpoint is None:
        return surgery
    return resumed_surgery(surgery, (metadata or {}).get(SURGERY_KEY), last_step, str(checkpoint))
