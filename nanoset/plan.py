"""The tokenize plan: a fixed, worker-independent list of tasks, and the output folder's state.

The plan depends only on the inputs and the options that change the bytes written, so any
number of workers, machines or restarts produce the same shards. It is saved in the output's
work folder; a rerun with the same plan resumes, with a different one it refuses (or starts
over with ``--overwrite``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from nanoset.corpus import Piece, Source, split_source
from nanoset.errors import NanosetError
from nanoset.format import (
    INDEX_SUFFIX,
    MANIFEST_NAME,
    METADATA_SUFFIX,
    TOKENS_SUFFIX,
    Manifest,
    ShardInfo,
    atomic_write_text,
)

WORK_DIR = ".nanoset-work"
DEFAULT_TASK_BYTES = 8 << 20


@dataclass
class Task:
    index: int
    pieces: list[Piece]

    def shard_prefix(self, width: int) -> str:
        return f"{self.index:0{width}d}"


@dataclass
class Plan:
    build: dict  # everything that determines the output bytes; recorded in the manifest
    sources: list[Source]
    tasks: list[Task]

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.build, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def width(self) -> int:
        return max(5, len(str(len(self.tasks) - 1)))

    def state_json(self) -> str:
        """What a rerun compares: the build plus input modification times (not in the manifest)."""
        return json.dumps({"build": self.build, "mtimes": [s.mtime_ns for s in self.sources],
                           "num_tasks": len(self.tasks)}, sort_keys=True)


def make_plan(sources: list[Source], options: dict, task_bytes: int = DEFAULT_TASK_BYTES) -> Plan:
    """Group source pieces, in corpus order, into tasks of about ``task_bytes`` of input."""
    tasks: list[Task] = []
    current: list[Piece] = []
    weight = 0
    for source in sources:
        for piece in split_source(source, task_bytes):
            current.append(piece)
            weight += piece.weight
            if weight >= task_bytes:
                tasks.append(Task(len(tasks), current))
                current, weight = [], 0
    if current:
        tasks.append(Task(len(tasks), current))
    build = dict(options, task_bytes=task_bytes, inputs=[s.describe() for s in sources])
    return Plan(build=build, sources=sources, tasks=tasks)


def work_progress(path: Path) -> tuple[int, int | None] | None:
    """(tasks done, tasks planned) of an unfinished tokenize output; None when ``path`` has no work folder."""
    work = Path(path) / WORK_DIR
    if not work.is_dir():
        return None
    done = sum(1 for _ in work.glob("task-*.json"))
    try:
        total = json.loads((work / "plan.json").read_text()).get("num_tasks")
    except (OSError, ValueError):
        total = None
    return done, total


class OutputFolder:
    """The output folder of a tokenize job: its plan, task markers and manifest."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.work = self.path / WORK_DIR

    def marker(self, task: int) -> Path:
        return self.work / f"task-{task:06d}.json"

    def completed_manifest(self) -> Manifest | None:
        return Manifest.load(self.path) if (self.path / MANIFEST_NAME).is_file() else None

    def prepare(self, plan: Plan, overwrite: bool) -> bool:
        """Make the folder ready for ``plan``; True when the dataset is already complete."""
        manifest = self.completed_manifest()
        if manifest is not None and manifest.build == plan.build and not overwrite:
            shutil.rmtree(self.work, ignore_errors=True)
            return True
        saved = self.work / "plan.json"
        ours = saved.is_file() and saved.read_text() == plan.state_json()
        if not ours and self.path.is_dir() and any(self.path.iterdir()):
            if not overwrite:
                what = "a different dataset" if manifest or saved.is_file() else "other files"
                raise NanosetError(
                    f"{self.path}: holds {what}; pass --overwrite to replace it, or choose another output folder"
                )
            self.clear()
        self.work.mkdir(parents=True, exist_ok=True)
        if not ours:
            atomic_write_text(saved, plan.state_json())
        return False

    def clear(self) -> None:
        """Remove what a tokenize job writes (shards, manifest, work files); leave anything else."""
        shutil.rmtree(self.work, ignore_errors=True)
        for p in self.path.iterdir():
            n = p.name.lstrip(".")
            if p.is_file() and (n == MANIFEST_NAME or any(s in n for s in (TOKENS_SUFFIX, INDEX_SUFFIX, METADATA_SUFFIX))):
                p.unlink()

    def remove_partials(self, prefix: str) -> None:
        """Delete temporary files an interrupted attempt at a task left behind."""
        for p in self.path.glob(f".{prefix}_*.partial-*"):
            p.unlink(missing_ok=True)

    def done(self, task: Task, itemsize: int) -> TaskResult | None:
        """The result of a task completed earlier (marker present, shard files of the right size)."""
        marker = self.marker(task.index)
        if not marker.is_file():
            return None
        result = TaskResult.from_json(json.loads(marker.read_text()))
        for s in result.shards:
            ds, index = (self.path / f for f in (s.name + TOKENS_SUFFIX, s.name + INDEX_SUFFIX))
            if not ds.is_file() or ds.stat().st_size != s.num_tokens * itemsize or not index.is_file():
                return None
        return result

    def mark_done(self, task: Task, result: TaskResult) -> None:
        atomic_write_text(self.marker(task.index), json.dumps(result.to_json(), sort_keys=True))

    def finish(self) -> None:
        """After the manifest: drop the work folder and any temporary file left by a killed attempt."""
        shutil.rmtree(self.work, ignore_errors=True)
        for p in self.path.glob(".*.partial-*"):
            p.unlink(missing_ok=True)


@dataclass
class TaskResult:
    shards: list[ShardInfo]
    skipped_lines: int

    def to_json(self) -> dict:
        return {"shards": [asdict(s) for s in self.shards], "skipped_lines": self.skipped_lines}

    @staticmethod
    def from_json(d: dict) -> TaskResult:
        return TaskResult([ShardInfo.from_json(s) for s in d["shards"]], d["skipped_lines"])
