"""Everything a launch checks before any process group exists, done once, on every rank.

The config is loaded and checked, the world size compared with its layout, the run folder locked
and checked, the checkpoint to resume from resolved and read (and compared with the model), the
data opened and planned (the past from the checkpoint's record), the Hugging Face model and the
validation sets checked. Every mistake is one ``error:`` line, printed once, before a process
group could turn it into a traceback on every rank. The trainer starts from the result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nanoset.errors import ConfigError
from nanoset.remote_cache import configure as configure_storage
from runtime.checkpoint.layout import (
    LATEST,
    RESUME,
    check_same_model,
    checkpoints_folder,
    checkpoints_url,
    resolve_resume,
)
from runtime.checkpoint.record import CheckpointRecord, read_metadata
from runtime.checkpoint.remote import fetch_latest
from runtime.checkpoint.run_folder import (
    REWOUND,
    RunLock,
    branch_folder,
    check_writable,
    describe_rewind,
    existing_run,
    later_checkpoints,
    refuse_a_checkpoint_inside_the_run,
    run_lock,
)
from runtime.checkpoint.surgery_log import RewindEntry, run_surgery, surgery_at_resume
from runtime.config import Config
from runtime.config.load import load_config
from runtime.data.hf_datasets import resolve_stage_folders
from runtime.data.order.holdout import holdout_documents, holdout_surgery, training_folders
from runtime.data.order.packing import shorter_sequence_length
from runtime.data.order.plan import DataPlan
from runtime.data.order.source_names import source_names
from runtime.data.order.surgery import Surgery
from runtime.data.order.validation_sets import ValidationSet, holdout_sets, open_validation_sets, training_readers
from runtime.evaluation.evaluator import Evaluator, data_tokenizer, open_tasks
from runtime.hf.preflight import check_init_from_hf
from runtime.stage_optimizer import RECORD_KEY as STAGE_OPTIMIZERS_KEY
from runtime.stage_optimizer import StageOptimizers


@dataclass
class RunStart:
    """Where a run starts: a checkpoint to resume from, or step 0 (moving an old run aside first)."""

    checkpoint: Path | None  # the checkpoint to resume from; None: step 0
    record: CheckpointRecord | None  # what it records
    replace_old_run: bool = False  # a fresh start where a run exists: global rank 0 moves the old one aside
    lock: RunLock | None = field(default=None, repr=False)  # global rank 0: held while the run lives (see run_lock)


@dataclass
class Startup:
    """What the checks found: the trainer is built from it."""

    config: Config
    plan: DataPlan  # the data order, the past taken from the checkpoint's record
    start: RunStart
    validation_sets: list[ValidationSet]  # opened and checked
    evaluator: Evaluator | None = None  # the evaluation's tasks (read and encoded) and hooks (imported)
    held_out: dict[str, np.ndarray] = field(default_factory=dict)  # validation.holdout: folder → documents


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def start_up(config: Config | str | Path, world: int | None = None, lock: bool = True,
             pending: RewindEntry | None = None) -> Startup:
    """Load (a path) and check the config, its data, the checkpoint it resumes and the run folder.

    ``world``: the processes the launcher starts (default: ``WORLD_SIZE``); ``lock``: hold the run folder's
    lock (global rank 0 of the workers does; a launcher checking for them only tries it); ``pending``: a rewind
    ``--check`` shows, not recorded yet."""
    path = None if isinstance(config, Config) else config
    if path is not None:
        config = load_config(path)
    try:
        config.parallelism.check_world(world if world is not None else world_size())
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path is not None else str(e)) from None
    configure_storage(config.storage.cache_dir, config.storage.cache_limit_gb)  # the workers started later inherit it
    start = plan_start(config, lock)
    record = start.record
    resumed = record.last_step if record is not None else 0
    try:
        plan = DataPlan(config, resolve_stage_folders(config), surgery=Surgery()).resumed_from(
            start.checkpoint, record.training if record is not None else None)
        held_out = holdout_documents(config, plan)  # never trained: excised from step 1, validated on
        surgery = surgery_at_resume(run_surgery(config, pending).union(holdout_surgery(held_out)),
                                    record.extensions if record is not None else None, resumed, start.checkpoint)
        if surgery:
            plan = plan.with_surgery(surgery)
        check_init_from_hf(config, plan, fresh_start=start.checkpoint is None)
        validation_sets = [*open_validation_sets(config, training_readers(plan)),
                           *holdout_sets(config, held_out, training_folders(plan), source_names(plan))]
        evaluator = Evaluator(config, open_tasks(config, data_tokenizer(plan)))
    except BaseException:  # nothing starts: the lock goes, and the run folder it made if nothing else is in it
        if start.lock is not None:
            start.lock.close()
        raise
    return Startup(config, plan, start, validation_sets, evaluator, held_out)


def plan_start(config: Config, lock: bool = True) -> RunStart:
    """Resolve the checkpoint, check it fits the model, and refuse to mix two runs in one folder."""
    held = run_lock(config) if int(os.environ.get("RANK", "0")) == 0 else None  # refuses a run in progress
    if not lock and held is not None:  # a launcher checking for its workers: they take it
        held.close()
        held = None
    try:
        return _start(config, held)
    except BaseException:
        if held is not None:
            held.close()
        raise


def _start(config: Config, held: RunLock | None) -> RunStart:
    folder = checkpoints_folder(config)
    url = checkpoints_url(config)
    if url is not None and config.checkpoints.resume == LATEST:
        fetch_latest(url, folder)  # the bucket's latest checkpoint, where this machine has none as new
    path = resolve_resume(folder, config.checkpoints.resume)
    continues = config.checkpoints.resume == LATEST or (
        path is not None and path.resolve().parent == folder.resolve())
    if path is not None and not continues:
        refuse_a_checkpoint_inside_the_run(config, path)
    record = read_metadata(path) if path is not None else None
    if record is not None:
        check_same_model(config, record, path)
        last = record.last_step
        if last > config.tokens.train_steps:  # it would train nothing and report "done: step 12/10"
            raise ConfigError(f"{RESUME.about(path)}: at step {last}, past tokens.train_steps "
                              f"{config.tokens.train_steps}; raise tokens.train_steps or "
                              f"{RESUME.another('an earlier checkpoint')}")
    found = [] if continues else existing_run(config)
    if found and not config.checkpoints.replace_run:
        how = "starts fresh" if path is None else f"starts from {path}"
        raise ConfigError(f"{config.general.run_path}: holds a run ({', '.join(found)}) and this config {how}; "
                          f"set checkpoints.resume: latest to continue it, checkpoints.replace_run: true to move it "
                          f"aside, or another general.run_dir")
    check_writable(config.general.run_path, "general.run_dir", moving=bool(found))
    check_writable(folder, "checkpoints.checkpoints_path", moving=bool(found))
    return RunStart(path, record, replace_old_run=bool(found), lock=held)


def describe_start(startup: Startup) -> str:
    """Where the run starts and what that does to the run folder, for ``--check``: a resume, a rewind (what it
    moves aside, see ``run_folder.rewind``), a fresh start, or a fresh start moving an old run aside."""
    c, start = startup.config, startup.start
    steps = c.tokens.train_steps
    if start.checkpoint is None:
        fresh = f"starts fresh at step 1 of {steps}" if steps else "starts fresh (train_steps 0: saves the weights)"
        if not start.replace_old_run:
            return fresh
        return (f"{fresh}; checkpoints.replace_run moves the run in {c.general.run_path} aside to "
                f"{c.general.run_path.name}.old-<UTC time>")
    last = start.record.last_step
    todo = f"trains steps {last + 1}-{steps}" if last < steps else "nothing left to train"
    later = later_checkpoints(c, last)
    if not later:
        return f"resumes from {start.checkpoint} (step {last}): {todo}"
    aside = c.general.run_path / f"{REWOUND}-<UTC time>"
    moved = f"the {len(later)} later checkpoint(s) ({', '.join(p.name for p in later)}) are"
    where = describe_rewind(moved, aside, branch_folder(c, aside))
    return f"rewinds to {start.checkpoint} (step {last}): {todo}; {where}"


LOST_TOKENS_NOTE = 0.02  # packing that loses more than this share of a dataset's tokens is worth a note
# packed samples more than this share padding are worth a note suggesting a shorter length. Next-fit packing keeps
# any two consecutive samples over one sample's worth of tokens, so it passes 1/2 only for a dataset under one
# sample (or one that drops documents); a quarter of the compute spent on padding is already worth a line
PADDING_NOTE = 0.25
REPEAT_WARNING_EPOCHS = 10  # a dataset read more epochs than this within a stage is a warning, not a note


def startup_notes(startup: Startup) -> list[str]:
    """What a user would want to know before the run goes on, said once at start-up: a resume in another layout
    or with another batch, a learning-rate schedule recomputed for another length, a stage that repeats samples
    (more than one epoch of a dataset), packing that drops or truncates a share of a dataset's tokens or whose
    samples are more than a quarter padding."""
    c, plan, record = startup.config, startup.plan, startup.start.record
    notes = []
    if record is not None:
        saved = record.config
        last = record.last_step
        was = {**(saved.get("parallelism") or {}), **(saved.get("tokens") or {})}
        now = {**c.to_dict()["parallelism"], **c.to_dict()["tokens"]}
        changed = [f"{k} {was.get(k, 1)} → {now[k]}" for k in ("dp", "cp", "tp", "pp", "micro_batch_size",
                                                                  "batch_accumulation_per_replica")
                   if was.get(k, 1) != now[k]]
        old_batch = record.training.global_batch_size
        if changed:
            same = (f"global batch {c.global_batch_size} as before: the same samples in the same order, losses equal "
                    f"to float rounding (not to the bit)" if old_batch == c.global_batch_size else
                    f"global batch {old_batch} → {c.global_batch_size} from step {last + 1}")
            notes.append(f"resuming {startup.start.checkpoint} in another layout ({', '.join(changed)}): {same}")
        old_steps = record.lr_schedule.get("train_steps")
        if old_steps is not None and old_steps != c.tokens.train_steps:
            notes.append(f"tokens.train_steps is {c.tokens.train_steps}, the checkpoint's learning-rate schedule was "
                         f"for {old_steps}: it is recomputed for {c.tokens.train_steps} steps from step {last + 1}")
        notes += StageOptimizers(c).changed_since(record.extensions.get(STAGE_OPTIMIZERS_KEY) or {}, last)
    resumed = record.last_step if record is not None else 0
    named = plan.shown_names()
    for part in plan.stages:
        if part.end_step <= resumed + 1:
            continue  # finished before this start
        for reads in plan.reads(part):
            if reads.repeats and reads.epochs <= REPEAT_WARNING_EPOCHS:  # more: a warning (startup_warnings)
                notes.append(f"stage {part.name!r} reads {named[plan.datasets[reads.dataset].folder]} up to "
                             f"{reads.end_epoch:.2f} epochs: its samples repeat (add data, or fewer steps or a lower "
                             f"weight for it)")
    for w in plan.datasets:
        if w.packing == "documents" and w.reader.num_tokens:
            lost = 1 - w.kept_tokens / w.reader.num_tokens
            if lost > LOST_TOKENS_NOTE:
                # dropping loses whole long documents, truncating only their tails past the sample length
                fate = ("are in documents longer than {} tokens and dropped" if w.drop_long_documents else
                        "are the tails cut off documents longer than {} tokens (truncated)")
                notes.append(f"packing {named[w.folder]} at sequence length {w.sequence_length}: {100 * lost:.1f}% of "
                             f"its tokens {fate.format(w.sequence_length + 1)}; raise the stage's sequence_length "
                             f"to train on them")
            if w.padding_share > PADDING_NOTE:
                target = PADDING_NOTE / 2
                shorter = shorter_sequence_length(w.reader, w.sequence_length, w.drop_long_documents, target,
                                                  max(lost, LOST_TOKENS_NOTE))
                fix = (f"a stage sequence_length of {shorter[0]} would pad {100 * shorter[1]:.1f}%" if shorter else
                       f"no shorter power of two (down to 16) pads it under {100 * target:g}% without cutting more "
                       f"of its tokens")
                notes.append(f"packing {named[w.folder]} at sequence length {w.sequence_length}: "
                             f"{100 * w.padding_share:.1f}% of its samples' tokens are padding, computed but never "
                             f"learned from ({w.num_samples:,} samples of {w.sequence_length + 1:,} tokens hold its "
                             f"{w.kept_tokens:,}); {fix}")
    return notes


def startup_warnings(startup: Startup) -> list[str]:
    """What is likely a mistake but may be meant, said once at start-up (``warning:``): a stage that reads a
    dataset more than ``REPEAT_WARNING_EPOCHS`` epochs (a near-empty dataset, or a weight far too high for it),
    whose samples the model sees so often that it learns them by heart."""
    plan, record = startup.plan, startup.start.record
    resumed = record.last_step if record is not None else 0
    named = plan.shown_names()
    return [f"stage {part.name!r} reads {named[plan.datasets[reads.dataset].folder]} {reads.epochs:,.1f} epochs "
            f"(more than {REPEAT_WARNING_EPOCHS}): each of its samples is trained about {reads.epochs:,.0f} times; "
            f"add data, or fewer steps or a lower weight for it"
            for part in plan.stages if part.end_step > resumed + 1
            for reads in plan.reads(part) if reads.epochs > REPEAT_WARNING_EPOCHS]
