"""The tokenize plan: a fixed, worker-independent list of tasks, and the output folder's state.

The plan depends only on the inputs and the options that change the bytes written, so any
number of workers, machines or restarts produce the same shards. It is saved in the output's
work folder; a rerun with the same plan resumes, with a different one it refuses (or starts
over with ``--overwrite``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from nanoset.atomic import PROBE_PREFIX, atomic_write_text, writable_folder
from nanoset.errors import FolderNotWritable, NanosetError
from nanoset.format.spec import (
    INDEX_SUFFIX,
    JOB_LOCK,
    LOSS_SUFFIX,
    MANIFEST_NAME,
    SKIPPED_NAME,
    TASK_MARKER_GLOB,
    TOKENS_SUFFIX,
    WORK_DIR,
    WORK_PLAN,
    Manifest,
    ShardInfo,
    is_dataset_file,
    task_marker_name,
)
from nanoset.tokenize.inputs import Piece, Source, split_source
from nanoset.tokenize.joblock import JobLock, LocksUnsupported

MAX_TASKS = 2000  # tasks (so shard files, markers) of any corpus with the default task size
SMALL_CORPUS_TASKS = 64  # a small corpus is still cut this fine, so that many workers all get work ...
SMALL_TASK_CAP = 1 << 20  # ... while that keeps tasks under 1 MiB of input
MIN_TASK_BYTES = 64 << 10  # below this, a task's fixed costs (its files and marker) dominate
ENCODER_FALLBACK = "encoder-fallback.txt"  # in the work folder: why this job stopped using its fast backend
UNWRITABLE_ADVICE = "choose another -o folder"


def auto_task_bytes(total_bytes: int) -> int:
    """Input bytes per task from the corpus size alone: never from the number of workers or machines, so
    the output is the same for any ``--workers`` and ``--num-tasks``. The smallest power of two (at least
    64 KiB) that keeps the corpus within 2,000 tasks and, up to 1 MiB tasks, gives it 64 or fewer."""
    want = max(-(-total_bytes // (MAX_TASKS - 1)), min(SMALL_TASK_CAP, -(-total_bytes // SMALL_CORPUS_TASKS)))
    return 1 << (max(want, MIN_TASK_BYTES) - 1).bit_length()


@dataclass
class Task:
    index: int
    pieces: list[Piece]

    def shard_prefix(self, width: int) -> str:
        return f"{self.index:0{width}d}"


@dataclass
class TokenizePlan:
    """A tokenize job's work: what decides the bytes written (``build``), the inputs, and the tasks they are cut
    into (not the runtime's ``DataPlan``, which orders samples for training)."""

    build: dict  # everything that determines the output bytes; recorded in the manifest
    sources: list[Source]
    tasks: list[Task]

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.build, sort_keys=True).encode()).hexdigest()[:16]

    def share(self, num_tasks: int, task_index: int) -> list[Task]:
        """The tasks of run ``task_index`` of ``num_tasks`` (``--num-tasks/--task-index``)."""
        return [t for t in self.tasks if t.index % num_tasks == task_index]

    @property
    def width(self) -> int:
        return max(5, len(str(len(self.tasks) - 1)))

    def state_json(self) -> str:
        """What a rerun compares: the build plus input modification times (not in the manifest)."""
        return json.dumps({"build": self.build, "mtimes": [s.mtime_ns for s in self.sources],
                           "num_tasks": len(self.tasks)}, sort_keys=True)


def make_plan(sources: list[Source], options: dict, task_bytes: int | None = None) -> TokenizePlan:
    """Cut the corpus, in order, into tasks of ``task_bytes`` of input (by default ``auto_task_bytes`` of
    its size): splittable sources are cut where a task is full, so each task but the last holds at least
    ``task_bytes`` and no more than that plus one unsplittable file (or parquet row group)."""
    if task_bytes is None:
        task_bytes = auto_task_bytes(sum(s.bytes for s in sources))
    tasks: list[Task] = []
    current: list[Piece] = []
    weight = 0
    for source in sources:
        for piece in split_source(source, task_bytes, room=task_bytes - weight):
            current.append(piece)
            weight += piece.weight
            if weight >= task_bytes:
                tasks.append(Task(len(tasks), current))
                current, weight = [], 0
    if current:
        tasks.append(Task(len(tasks), current))
    build = dict(options, task_bytes=task_bytes, inputs=[s.describe() for s in sources])
    return TokenizePlan(build=build, sources=sources, tasks=tasks)


class OutputFolder:
    """The output folder of a tokenize job: its plan, task markers and manifest."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.work = self.path / WORK_DIR
        self.notes: list[str] = []  # what prepare did that the user should hear of
        self.job_lock: JobLock | None = None

    def lock(self, tasks: list[int], num_tasks: int, task_index: int) -> None:
        """Lock the folder for a run that writes ``tasks`` (``nanoset.tokenize.joblock``), creating it first;
        ``release`` ends it. A finished dataset in a place this run cannot write is left unlocked: nothing can
        be written there, and ``prepare`` finds it complete (or says the place cannot be written)."""
        try:
            writable_folder(self.path, UNWRITABLE_ADVICE)
        except FolderNotWritable:
            if (self.path / MANIFEST_NAME).is_file():
                return
            raise
        try:
            self.job_lock = JobLock.acquire(self.path, tasks, num_tasks, task_index)
        except LocksUnsupported as e:  # refusing would stop every job there: it runs unguarded, with a note
            self.notes.append(f"{self.path}: no file locks here ({e}): nothing keeps two tokenize jobs from "
                              f"writing this folder at once; run one at a time (one per --task-index)")

    def release(self) -> None:
        if self.job_lock is not None:
            self.job_lock.release()
            self.job_lock = None

    def marker(self, task: int) -> Path:
        return self.work / task_marker_name(task)

    def skipped_log(self, task: int) -> Path:
        """Where task ``task`` lists the rows it skipped (written beside its marker, under a temporary name until
        the task is done)."""
        return self.work / f"skipped-{task:06d}.txt"

    def write_skipped_list(self, tasks: list[Task], results: list[TaskResult]) -> None:
        """``SKIPPED_NAME``: every task's skipped rows, in task order (before the manifest; none when no row was
        skipped)."""
        path = self.path / SKIPPED_NAME
        if not any(r.skipped_lines for r in results):
            path.unlink(missing_ok=True)
            return
        parts = []
        for task, result in zip(tasks, results):
            log = self.skipped_log(task.index)
            if result.skipped_lines:
                parts.append(log.read_text(encoding="utf-8") if log.is_file() else
                             f"task {task.index}: {result.skipped_lines} rows skipped (list lost; rerun with "
                             f"--overwrite to list them)\n")
        atomic_write_text(path, "".join(parts))

    def completed_manifest(self) -> Manifest | None:
        return Manifest.load(self.path) if (self.path / MANIFEST_NAME).is_file() else None

    def prepare(self, plan: TokenizePlan, overwrite: bool) -> bool:
        """Make the folder ready for ``plan``; True when the dataset is already complete.

        Several machines may start, run and finish at the same time. Each creates the work folder with
        its plan in one rename, writes the manifest before it removes the work folder, and reads the
        folder's listing, then the saved plan, then the manifest: whatever another machine is doing,
        a folder that is ours is seen as ours. An unfinished job of other options (a run that failed on
        a bad row, a changed flag, a new rule version) is replaced, and ``notes`` says so; a complete
        dataset of another plan needs ``--overwrite``. A run that holds the folder's lock (``lock``) empties it
        only while no other run is on it."""
        state = plan.state_json()
        entries = self._entries()
        saved = _read_text(self.work / WORK_PLAN)
        same_plan = saved == state
        manifest = self.completed_manifest()
        if manifest is not None and manifest.build == plan.build and not overwrite:
            self.finish()
            return True
        writable_folder(self.path, UNWRITABLE_ADVICE)
        if not same_plan and entries:
            if not overwrite:
                touched = _modified_input(plan, saved)
                if touched and any(self.work.glob(TASK_MARKER_GLOB)):  # its tasks cannot be reused: say which
                    raise NanosetError(f"{self.path}: holds an unfinished job on these inputs, but {touched} was "
                                       f"modified since it began; pass --overwrite to start over")
                if manifest is not None and _changed_keys(manifest.build, plan.build) == ["chat.mask_rule"]:
                    raise NanosetError(f"{self.path}: was made with loss-mask rule {manifest.loss_mask_rule}; this "
                                       f"nanoset writes rule {plan.build['chat']['mask_rule']} (see `nanoset inspect`)"
                                       f": pass --overwrite to make it again, or keep using it as it is")
                if manifest is not None or not self.work.is_dir():
                    what = "a different dataset" if manifest else "other files"
                    raise NanosetError(f"{self.path}: holds {what}; pass --overwrite to replace it, or choose "
                                       f"another output folder")
                self.notes.append(self._replaced_job(plan, saved))
            if self.job_lock is not None:  # never under another run writing here
                self.job_lock.empty_folder()
            self.clear()
            self._create_work(state)
            if self.job_lock is not None:  # the work folder is there: the other runs of this job may join
                self.job_lock.emptied()
            return False
        if not same_plan:
            self._create_work(state)
        return False

    def _replaced_job(self, plan: TokenizePlan, saved: str | None) -> str:
        """The note for an unfinished job of another plan that this one replaces: what differed, how far it got."""
        try:
            old = json.loads(saved) if saved else {}
        except ValueError:
            old = {}
        old_build = old.get("build") if isinstance(old, dict) and isinstance(old.get("build"), dict) else {}
        changed = _changed_keys(old_build, plan.build)
        done = sum(1 for _ in self.work.glob(TASK_MARKER_GLOB))
        total = old.get("num_tasks", "?") if isinstance(old, dict) else "?"
        touched = _modified_input(plan, saved) or _resized_input(old_build, plan.build, changed)
        reason = (f"whose input {touched} changed since it began" if touched
                  else f"with other {', '.join(changed)}" if changed and old_build else "of another plan")
        return f"{self.path}: replaced an unfinished job {reason} ({done} of {total} tasks done) by this one"

    def _remove_work(self) -> None:
        """The work folder, and any a killed run left half created."""
        for p in [self.work, *self.path.glob(WORK_DIR + ".tmp-*")]:
            shutil.rmtree(p, ignore_errors=True)

    def _entries(self) -> list[Path]:
        """What the folder holds, but for work folders other machines are creating, their probes of the folder
        and the job's lock file."""
        if not self.path.is_dir():
            return []
        return [p for p in self.path.iterdir()
                if not p.name.startswith((WORK_DIR + ".tmp-", PROBE_PREFIX)) and p.name != JOB_LOCK]

    def _create_work(self, state: str) -> None:
        """Create the work folder holding ``state`` as plan.json, in one rename (or find another machine's)."""
        tmp = self.path / f"{WORK_DIR}.tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        atomic_write_text(tmp / WORK_PLAN, state)
        try:
            os.rename(tmp, self.work)
        except OSError:  # another machine created it first
            shutil.rmtree(tmp, ignore_errors=True)
            if _read_text(self.work / WORK_PLAN) != state:
                raise NanosetError(f"{self.path}: another run is writing a different dataset there; "
                                   f"give every machine the same inputs and options") from None

    def clear(self) -> None:
        """Remove what a tokenize job writes (shards, manifest, work files); leave anything else."""
        self._remove_work()
        for p in self.path.iterdir():
            if p.is_file() and is_dataset_file(p.name):
                p.unlink()

    def remove_partials(self, prefixes: list[str]) -> None:
        """Delete temporary files interrupted attempts at these tasks left behind (``.PREFIX_NNNNN...partial-PID``),
        in one listing of the folder: one per task cost 20 s before a rerun of 2,000 tasks."""
        wanted = set(prefixes)
        for p in self.path.glob(".*.partial-*"):
            if p.name[1:].split("_", 1)[0] in wanted:
                p.unlink(missing_ok=True)

    def done(self, task: Task, itemsize: int) -> TaskResult | None:
        """The result of a task completed earlier (marker present, shard files of the right size)."""
        text = _read_text(self.marker(task.index))  # None also when a finishing machine just removed it
        if text is None:
            return None
        result = TaskResult.from_json(json.loads(text))
        for s in result.shards:
            ds, index = (self.path / f for f in (s.name + TOKENS_SUFFIX, s.name + INDEX_SUFFIX))
            if not ds.is_file() or ds.stat().st_size != s.num_tokens * itemsize or not index.is_file():
                return None
            loss = self.path / (s.name + LOSS_SUFFIX)
            if "loss" in s.sha256 and (not loss.is_file() or loss.stat().st_size != s.num_tokens):
                return None
        return result

    def mark_done(self, task: Task, result: TaskResult) -> None:
        atomic_write_text(self.marker(task.index), json.dumps(result.to_json(), sort_keys=True))

    def encoder_fallback(self) -> str | None:
        """Why this job encodes with the reference although a fast backend was chosen: a difference a task saw
        (kept for reruns, which redo the tasks the fast backend finished; not part of the plan, so they still
        resume)."""
        return _read_text(self.work / ENCODER_FALLBACK)

    def record_encoder_fallback(self, note: str) -> None:
        atomic_write_text(self.work / ENCODER_FALLBACK, note)

    def finish(self) -> None:
        """After the manifest: drop the work folder and any temporary file left by a killed attempt (shard
        files, or the manifest itself: killed while writing it). Idempotent: every machine that finds the
        job complete may call it, at the same time. The lock file goes too (a run that locks it meanwhile takes
        a new one)."""
        self._remove_work()
        with contextlib.suppress(OSError):  # a finished dataset in a place this run cannot write keeps it
            (self.path / JOB_LOCK).unlink(missing_ok=True)
        for p in [*self.path.glob(".*.partial-*"), *self.path.glob(f".{MANIFEST_NAME}.tmp-*")]:
            p.unlink(missing_ok=True)


def _changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    """The keys whose values differ (``chat.mask_rule`` inside a nested option)."""
    out = []
    for k in sorted({*old, *new}):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changed_keys(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(prefix + k)
    return out


def _resized_input(old: dict, new: dict, changed: list[str]) -> str | None:
    """The input whose size changed when the same inputs are listed and nothing else changed but the cut
    into tasks (which follows the corpus size)."""
    a, b = old.get("inputs"), new.get("inputs")
    if not set(changed) <= {"inputs", "task_bytes"} or not isinstance(a, list) or len(a) != len(b):
        return None
    if any(not isinstance(x, dict) or x.get("path") != y["path"] for x, y in zip(a, b)):
        return None
    return next((y["path"] for x, y in zip(a, b) if x != y), None)


def _modified_input(plan: TokenizePlan, saved: str | None) -> str | None:
    """The first input whose modification time differs from the saved plan's when all else is the same:
    'holds a different dataset' would send the user looking for a change they did not make."""
    try:
        old = json.loads(saved) if saved else None
    except ValueError:
        return None
    if not isinstance(old, dict) or old.get("build") != plan.build or len(old.get("mtimes", [])) != len(plan.sources):
        return None
    return next((s.path for s, m in zip(plan.sources, old["mtimes"]) if s.mtime_ns != m), None)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


@dataclass
class TaskResult:
    shards: list[ShardInfo]
    skipped_lines: int
    skipped_examples: list[str] = field(default_factory=list)  # the first rows skipped (all: skipped_log)
    encoder: str | None = None  # the backend that encoded it (its name and version); None: written before backends
    # for the driver only, never saved: what a fast backend made of the task's first texts (and of the probe
    # set), to compare with the reference (nanoset.tokenize.backends.FastCheck), or why it could not load
    checks: list = field(default_factory=list)
    unusable: str | None = None

    def to_json(self) -> dict:
        d = {"shards": [s.to_json() for s in self.shards], "skipped_lines": self.skipped_lines}
        if self.skipped_examples:
            d["skipped_examples"] = self.skipped_examples
        if self.encoder is not None:
            d["encoder"] = self.encoder
        return d

    @staticmethod
    def from_json(d: dict) -> TaskResult:
        return TaskResult([ShardInfo.from_json(s) for s in d["shards"]], d["skipped_lines"],
                          skipped_examples=d.get("skipped_examples", []), encoder=d.get("encoder"))


def describe_task(task: Task) -> str:
    """The input range of a task, for messages: its piece, or its first and last pieces."""

    def piece_range(p: Piece) -> str:
        unit = "rows" if p.source.kind in ("parquet", "hf") else "bytes"
        return p.source.path + (f"[{p.source.split}]" if p.source.split else "") + f" {unit} {p.start}-{p.stop}"

    if len(task.pieces) == 1:
        return piece_range(task.pieces[0])
    return f"{piece_range(task.pieces[0])} to {piece_range(task.pieces[-1])}, {len(task.pieces)} pieces"
