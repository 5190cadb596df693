"""The Trainer: multi-stage training loop, stage switching, checkpoint/resume and metrics.

``trainer.run(loaders)`` trains on a loader, a dict of stage name → loader or zero-argument callable returning
one, or (``None``) the config's stages; Nanotron's two call styles, ``trainer.train(dataloader_or_dls=...)`` and
``trainer.train_dataloader = loader; trainer.fit()``, come from ``runtime.compat.NanotronCallStyles``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nanoset.errors import NanosetError, WriteFailed
from runtime.checkpoint.layout import LATEST, checkpoints_folder, checkpoints_url
from runtime.checkpoint.record import CheckpointRecord
from runtime.checkpoint.run_folder import Rewound, move_aside, rewind
from runtime.checkpoint.store import CheckpointManager
from runtime.compat import NanotronCallStyles
from runtime.config import Config
from runtime.control.preemption import installed, stop_on_signal
from runtime.control.progress import clock, describe_tokens, duration
from runtime.data.loading.feed import StepFeed, training_feed
from runtime.data.order.holdout import overlap_warnings, write_holdout_file
from runtime.data.order.plan import StagePlan
from runtime.data.order.surgery import SURGERY_KEY, surgery_record
from runtime.engine import Engine
from runtime.evaluation.evaluator import DueEvaluation, Evaluator
from runtime.hf.export import export_checkpoint
from runtime.hf.load import load_hf_weights
from runtime.models.registry import spec_of
from runtime.observe.divergence import DivergenceGuard
from runtime.observe.metrics import MetricsLogger, parameter_count, peak_flops, short_names
from runtime.observe.mixing import RunMixing
from runtime.observe.observer import StepObserver, TrainedStep
from runtime.observe.rows import MetricsRows
from runtime.observe.spikes import SpikeLog, SpikeWatch
from runtime.parallel.agreement import raise_together
from runtime.parallel.context import ParallelContext
from runtime.parallel.step_reduction import StepReduction
from runtime.stage_optimizer import RECORD_KEY as STAGE_OPTIMIZERS_KEY
from runtime.stage_optimizer import StageOptimizers
from runtime.startup import Startup, start_up, startup_notes, startup_warnings
from runtime.validation import DueValidation, Validator

WRITE_FAILED = "write_failed"  # the step reduction's count of ranks whose metrics write failed
KILL_AT_STEP_ENV = "NANOSET_FAULT_KILL_AT_STEP"  # fault injection for tests: SIGKILL rank 0 after this step


@dataclass
class TrainSummary:
    last_step: int
    final_loss_per_stage: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None
    metrics_file: Path | None = None
    stopped_by_signal: bool = False  # preempted: a checkpoint of last_step was saved; rerun to resume
    exit_status: int = 0  # what the process should exit with: 128 + the signal that stopped it (130: Ctrl-C)


class Trainer(NanotronCallStyles):
    def __init__(self, config: Config | str | Path, parallel_context: ParallelContext | None = None,
                 startup: Startup | None = None) -> None:
        """``config``: a YAML path or a ``Config``; ``startup``: the checks ``runtime.startup.start_up`` made of
        it before the process group (done here when not given)."""
        startup = startup if startup is not None else start_up(config)
        self.config = config = startup.config
        self.plan, self.start, self.held_out = startup.plan, startup.start, startup.held_out
        self.validator = Validator(config, startup.validation_sets)
        self.evaluator = startup.evaluator if startup.evaluator is not None else Evaluator(config, [], [])
        p = config.parallelism
        self.parallel_context = parallel_context or ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp)
        self.is_main = self.parallel_context.world_rank == 0
        self.run_dir = config.general.run_path
        resumed = self.start.record.last_step if self.start.record is not None else 0
        stop = installed()
        with stop.held() if stop is not None else nullcontext():  # a Ctrl-C here waits for the moves' end
            moved, rewound = self._prepare_run_folder(resumed)
        torch.manual_seed(config.general.seed)
        # resumed or from Hugging Face: every weight is loaded in _resume, so none is drawn first
        self.engine = Engine(config, self.parallel_context,
                             initialize=self.start.checkpoint is None and config.model.init_from_hf is None)
        self.optimizers = StageOptimizers(config)  # each stage's optimizer keys and learning-rate schedule
        cuda = self.parallel_context.device.type == "cuda"
        background = config.checkpoints.async_save if config.checkpoints.async_save is not None else cuda
        self.checkpoints = CheckpointManager(checkpoints_folder(config), config.checkpoints.keep_last, self.is_main,
                                             async_save=background, pinned=cuda, remote=checkpoints_url(config))
        self.metrics = MetricsLogger(self.run_dir, self.is_main, config.logging.tensorboard,
                                     config.logging.log_interval)
        self.metrics.source_names = short_names(self.plan.source_names())  # older rows keyed by folder
        self.metrics.train_steps = config.tokens.train_steps
        self.parameters = parameter_count(config.model)
        self.last_step = 0
        self._feed: StepFeed | None = None
        self.observers: list[StepObserver] = []  # made with the feed (its batches may be the config's or a user's)
        self._step_end = 0.0  # when the previous step ended (tokens/s)
        self._write_failure: WriteFailed | None = None  # this rank's failed metrics write, not yet raised
        if moved:
            self.metrics.info(f"checkpoints.replace_run: the previous run was moved to {', '.join(map(str, moved))}")
        for warning in startup_warnings(startup):
            self.metrics.info(f"warning: {warning}")
        for note in startup_notes(startup):
            self.metrics.info(f"note: {note}")
        for warning in overlap_warnings(config, self.plan) if self.is_main else []:
            self.metrics.info(f"warning: {warning}")
        if rewound is not None:
            self.metrics.info(f"rewound to step {resumed} ({self.start.checkpoint}): {rewound.describe()}")
        for line in self.plan.surgery.describe():
            self.metrics.info(f"surgery: {line}")
        self.metrics.info(self.parameters.describe())
        self.metrics.info(describe_tokens(self.plan, resumed, config.tokens.train_steps))
        self._failed = False  # the run ended by an error: W&B marks it failed

    def _prepare_run_folder(self, resumed: int) -> tuple[list[Path], Rewound | None]:
        """Global rank 0 moves an old run aside (``replace_run``) or rewinds to the resumed checkpoint, and makes the
        run folder; a failure there is raised on every rank (none goes on alone into the engine's collectives)."""
        moved, rewound, failure = [], None, ""
        if self.is_main:
            try:
                moved = move_aside(self.config) if self.start.replace_old_run else []
                if self.start.checkpoint is not None:
                    rewound = rewind(self.config, self.start.checkpoint, resumed)
                self.run_dir.mkdir(parents=True, exist_ok=True)
                if self.held_out:
                    write_holdout_file(self.run_dir, self.held_out)
            except NanosetError as e:
                failure = str(e)
            except OSError as e:
                failure = f"{self.run_dir}: preparing the run folder failed ({e}); fix the cause and rerun"
        raise_together(NanosetError(failure) if failure else None, self.parallel_context.device)
        return moved, rewound

    # ------------------------------------------------------------------ public -----------------

    def run(self, loaders: Any = None) -> TrainSummary:
        """Train on ``loaders``: None (the config's stages), one loader for the run, or stage name → loader."""
        try:
            return self._train(loaders)
        except BaseException:  # a failed run leaves no loader thread or worker behind
            self._failed = True
            self._release_loader()
            raise

    def _train(self, dataloader_or_dls: Any) -> TrainSummary:
        tokens = self.config.tokens
        self._feed = training_feed(dataloader_or_dls, self.plan, self.parallel_context, tokens.micro_batch_size,
                                   tokens.batch_accumulation_per_replica, self.metrics.info)
        self.checkpoints.clean_stale()
        self._make_observers(self._feed.from_config)
        self.last_step = self._resume()
        self._writing_metrics(*[lambda o=o: o.start(self.last_step) for o in self.observers])  # no step logged twice
        self._raise_write_failure()
        summary = TrainSummary(self.last_step, metrics_file=self.metrics.path)
        c = self.config
        last_save = self.last_step
        self._step_end = time.perf_counter()
        device = self.parallel_context.device
        with stop_on_signal() as stop:
            for step in range(self.last_step + 1, c.tokens.train_steps + 1):
                stage = self.plan.stage_for_step(step)
                batches = self._feed.batches(step)
                data_wait = self._feed.wait
                lr = self.optimizers.apply(self.engine, step)
                agreed = self._train_step(step, stage, batches, lr, data_wait, summary, stop)
                if os.environ.get(KILL_AT_STEP_ENV) == str(step) and self.is_main:
                    os.kill(os.getpid(), signal.SIGKILL)
                self._note(self.checkpoints.poll())  # a checkpoint written in the background is complete
                # every rank stops after the same step; a signal during the last one changes nothing
                summary.stopped_by_signal = agreed and step < c.tokens.train_steps
                interval = c.checkpoints.checkpoint_interval
                if summary.stopped_by_signal or interval and step % interval == 0 and step < c.tokens.train_steps:
                    self._raise_write_failure()
                    self._save(step)
                    last_save = step
                    summary.stopped_by_signal = stop.agreed(device)  # a signal during the save: this checkpoint is it
                if summary.stopped_by_signal:
                    break
            self._raise_write_failure()
            # the final checkpoint; with train_steps 0, of the weights loaded (an exact HF → checkpoint → HF trip)
            loaded_only = c.tokens.train_steps == 0 and self.start.checkpoint is None
            if c.checkpoints.save_final and (self.last_step > last_save or loaded_only):
                self._save(self.last_step)
            self._note(self.checkpoints.wait())  # a write in the background ends before the run does
        summary.checkpoint = self.checkpoints.resolve(LATEST)
        summary.last_step = self.last_step
        if c.checkpoints.export_hf and not summary.stopped_by_signal and summary.checkpoint is not None:
            self._export_hf(summary.checkpoint)
        self._release_loader()
        summary.exit_status = stop.exit_status if summary.stopped_by_signal else 0
        self._print_summary(summary, stop.reason)
        return summary

    def _make_observers(self, from_config: bool) -> None:
        """The step observers, in the order they see a step: spikes (judged before the row that shows them),
        adaptive mixing, the metrics row, validation, evaluation, and last the divergence guard (which may stop the
        run)."""
        c = self.config
        self.spikes = SpikeWatch(c, self.plan, SpikeLog(self.run_dir, self.is_main), from_config)
        self.mixing = RunMixing(self.plan, self.run_dir, self.is_main, self.metrics.info)
        self.divergence = DivergenceGuard(lambda step: self.optimizers.at(step).optimizer.max_skipped_steps,
                                          self.plan.surgery, self.checkpoints.newest_of_a_finite_step,
                                          self.spikes.skips, lambda: self._writing_metrics(self.metrics.release))
        self.rows = MetricsRows(c, self.plan, self.metrics, self.parameters, from_config,
                                peak_flops(self.parallel_context.device))
        self.observers = [self.spikes, self.mixing, self.rows,
                          DueValidation(self.validator, self.engine, self.metrics),
                          DueEvaluation(self.evaluator, self.engine, self.metrics), self.divergence]

    def _train_step(self, step: int, stage: StagePlan, batches: list[dict], lr: float, data_wait: float,
                    summary: TrainSummary, stop: Any) -> bool:
        """Train one step (a step surgery skips: read, never trained, no engine call at all) and have every observer
        see it; whether every rank agreed to stop after it. The stop and write-failure flags ride in the step's one
        reduction of the numbers it logs."""
        reduction = StepReduction(self.parallel_context.device)
        stop.add_to(reduction)
        reduction.add(WRITE_FAILED, 1.0 if self._write_failure is not None else 0.0)
        self.mixing.add_to(reduction)  # the previous step's decision, compared in this step's reduction
        result = None
        if self.plan.surgery.skips(step):
            reduction.read()
        else:
            result = self.engine.train_step(batches, stage.sequence_length, num_sources=len(stage.dataset_ids),
                                            reduction=reduction, skip_above=self.spikes.skip_above(stage.name))
        if reduction.value(WRITE_FAILED):  # a rank could not write the previous step's metrics
            self._raise_write_failure()
        self.mixing.agree_from(reduction)  # the previous step's decision, the same on every rank
        self.last_step = step
        agreed = stop.agree_from(reduction)
        self.metrics.hold_rows = self._saves_after(step, agreed)  # its row carries the checkpoint's blocking time
        if result is not None and not result.skipped:
            summary.final_loss_per_stage[stage.name] = result.loss
        trained = TrainedStep(step, stage, lr, result, time.perf_counter() - self._step_end, data_wait)
        self._writing_metrics(*[lambda o=o: o.after_step(trained) for o in self.observers])
        self._step_end = time.perf_counter()  # the next step's tokens/s leaves the observers (validation) out
        return agreed

    def _saves_after(self, step: int, stop: bool) -> bool:
        """Whether a checkpoint follows step ``step`` (the loop's rule, or the final one)."""
        c = self.config.checkpoints
        last = step == self.config.tokens.train_steps
        return c.save_final if last else stop or bool(c.checkpoint_interval and step % c.checkpoint_interval == 0)

    def _writing_metrics(self, *parts: Callable[[], None]) -> None:
        """Run every part on every rank. Rank 0 alone writes metrics.jsonl: a write that fails there (a full disk)
        is kept until every rank learns of it — in the next step's reduction, or before a checkpoint, or at the
        loop's end (``_raise_write_failure``) — so that no rank goes on alone or dies in the next collective with a
        traceback, and no step pays a collective of its own for it."""
        for part in parts:
            try:
                part()
            except WriteFailed as e:
                self._write_failure = self._write_failure or e

    def _raise_write_failure(self) -> None:
        """Raise on every rank the failed metrics write of the lowest rank that has one, or return on every rank."""
        failure, self._write_failure = self._write_failure, None
        raise_together(failure, self.parallel_context.device)

    def close(self) -> None:
        self._release_loader()
        self.metrics.close(failed=self._failed)
        self.parallel_context.destroy()

    def _release_loader(self) -> None:
        if self._feed is not None:
            self._feed.close()

    # ------------------------------------------------------------------ checkpoints -------------

    def _save(self, step: int) -> Path:
        """A checkpoint of ``step`` (with the count of skipped steps in a row, so that a resumed diverging run stops
        where an uninterrupted one would; a surgery skip is finite, not a state to avoid)."""
        record = CheckpointRecord.of_run(self.plan, step, self.optimizers.run_schedule.state_dict(),
                                         self.divergence.skipped_in_a_row)
        record.step_skipped = record.step_skipped and not self.plan.surgery.skips(step)
        record.extensions[SURGERY_KEY] = surgery_record(self.plan.surgery)
        record.extensions[STAGE_OPTIMIZERS_KEY] = self.optimizers.record()
        for observer in self.observers:
            state = observer.state_dict() if observer.checkpoint_key is not None else None
            if state is not None:
                record.extensions[observer.checkpoint_key] = state
        began = time.perf_counter()
        self._note(self.checkpoints.wait())  # the previous one's write, when still in the background
        path = self.checkpoints.save(self.engine, step, record, before_commit=lambda: self._writing_metrics(
            lambda: self.metrics.release(checkpoint_blocking_s=round(time.perf_counter() - began, 4))))
        how = "staged (writing it in the background)" if self.checkpoints.in_flight is not None else "saved"
        self.metrics.info(f"checkpoint {path} {how} in {duration(time.perf_counter() - began)}")
        self._step_end = time.perf_counter()  # the next step's time (tokens/s, the ETA) leaves the save out
        return path

    def _resume(self) -> int:
        path = self.start.checkpoint
        if path is None:
            if self.config.model.init_from_hf is not None:
                load_hf_weights(self.engine.chunks, self.config.model.init_from_hf)
                self.metrics.info(f"weights from {self.config.model.init_from_hf} (model.init_from_hf)")
            return 0
        record = self.checkpoints.load(self.engine, path)
        last = record.last_step
        self.divergence.skipped_in_a_row = record.skipped_in_a_row
        for observer in self.observers:
            state = record.extensions.get(observer.checkpoint_key) if observer.checkpoint_key is not None else None
            if state is not None:
                observer.load_state_dict(state)
        self.metrics.info(f"resumed from {path} at step {last}")
        return last

    def _note(self, line: str | None) -> None:
        if line is not None:
            self.metrics.info(line)

    def _export_hf(self, checkpoint: Path) -> None:
        """``checkpoints.export_hf``: the final checkpoint as a Hugging Face folder, ``run_dir/hf`` (rank 0).
        A failure is raised on rank 0 after the barrier, so the other ranks never wait for it forever."""
        failed = None
        if self.is_main:
            try:
                out = export_checkpoint(checkpoint, self.run_dir / "hf", replace=True)
                architecture = spec_of(self.config.model).hf_architectures[0]
                self.metrics.info(f"exported {checkpoint.name} to {out} (Hugging Face {architecture})")
            except Exception as e:  # noqa: BLE001 - reported below, once every rank is past the barrier
                failed = e
        torch.distributed.barrier()
        if failed is not None:
            raise NanosetError(f"checkpoints.export_hf: {failed}; the run and its checkpoint {checkpoint} are "
                               f"complete: "
                              f"export it with python -m runtime.export") from failed

    # ------------------------------------------------------------------ reporting ---------------

    def _print_summary(self, summary: TrainSummary, reason: str | None) -> None:
        """The run's last line; ``reason``: what stopped it (a signal's name), None when it ran to its end."""
        if summary.stopped_by_signal:  # only `resume: latest` continues it (null starts over, a path rewinds)
            how = ("rerun the same command" if self.config.checkpoints.resume == LATEST
                   else "set checkpoints.resume: latest and rerun")
            self.metrics.info(f"stopped by {reason} after step {summary.last_step}: checkpoint {summary.checkpoint}; "
                              f"{how} to resume")
            return
        losses = ", ".join(f"{name} {loss:.4f}" for name, loss in summary.final_loss_per_stage.items())
        metrics = summary.metrics_file
        wrote = f"; metrics: {metrics}" if metrics is not None and metrics.is_file() and metrics.stat().st_size else ""
        self.metrics.info(f"done: step {summary.last_step}/{self.config.tokens.train_steps} in "
                          f"{clock(self.rows.progress.elapsed())}; final loss per stage: "
                          f"{losses or 'none (nothing left to train)'}; checkpoint: {summary.checkpoint}{wrote}")
