"""The Trainer: multi-stage training loop, stage switching, checkpoint/resume and metrics.

``trainer.run(loaders)`` trains on a loader, a dict of stage name → loader or zero-argument callable returning
one, or (``None``) the config's stages; Nanotron's two call styles, ``trainer.train(dataloader_or_dls=...)`` and
``trainer.train_dataloader = loader; trainer.fit()``, come from ``runtime.compat.NanotronCallStyles``.
"""

from __future__ import annotations

import math
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
from runtime.checkpoint.layout import LATEST, checkpoints_folder
from runtime.checkpoint.record import CheckpointRecord
from runtime.checkpoint.run_folder import Rewound, move_aside, rewind
from runtime.checkpoint.store import CheckpointManager
from runtime.compat import NanotronCallStyles
from runtime.config import Config
from runtime.data.loading.feed import StepFeed, training_feed
from runtime.data.order.holdout import overlap_warnings, write_holdout_file
from runtime.data.order.plan import StagePlan
from runtime.data.order.provenance import explain_step
from runtime.data.order.source_names import source_names
from runtime.data.order.surgery import SURGERY_KEY, surgery_record
from runtime.engine import Engine, StepResult
from runtime.evaluation.evaluator import Evaluator
from runtime.evaluation.evaluator import describe as describe_evaluation
from runtime.hf.export import export_checkpoint
from runtime.hf.load import load_hf_weights
from runtime.metrics import (
    SURGERY_SKIP,
    MetricsLogger,
    model_flops_utilization,
    parameter_count,
    peak_flops,
    short_names,
    source_metrics,
    tokens_per_second,
)
from runtime.mixing import CHECKPOINT_KEY as MIXING_KEY
from runtime.mixing import RunMixing
from runtime.models.registry import spec_of
from runtime.parallel.agreement import raise_together
from runtime.parallel.context import ParallelContext
from runtime.parallel.step_reduction import StepReduction
from runtime.preemption import installed, stop_on_signal
from runtime.progress import Progress, clock, describe_tokens, duration, stage_spans
from runtime.spikes import SpikeDetector, SpikeLog, ranked_samples
from runtime.stage_optimizer import RECORD_KEY as STAGE_OPTIMIZERS_KEY
from runtime.stage_optimizer import StageOptimizers
from runtime.startup import Startup, start_up, startup_notes, startup_warnings
from runtime.validation import Validator, describe
from runtime.wandb_logger import start_wandb

WRITE_FAILED = "write_failed"  # the step reduction's count of ranks whose metrics write failed
KILL_AT_STEP_ENV = "NANOSET_FAULT_KILL_AT_STEP"  # fault injection for tests: SIGKILL rank 0 after this step
SPIKE_WINDOW = "spike_window"  # metadata key: the spike detector's window of recent losses


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
                                             async_save=background, pinned=cuda)
        self.metrics = MetricsLogger(self.run_dir, self.is_main, config.logging.tensorboard,
                                     config.logging.log_interval)
        self.source_names = source_names(self.plan)  # folder → the name the rows give it
        self.metrics.source_names = short_names(self.plan.source_names())  # older rows keyed by folder
        saved = self.start.record.extensions.get(MIXING_KEY) if self.start.record is not None else None
        self.mixing = RunMixing(self.plan, self.run_dir, self.is_main, saved, self.metrics.info)
        self.metrics.train_steps = config.tokens.train_steps
        self.parameters = parameter_count(config.model)
        spike = config.surgery.spike
        self.spikes = SpikeDetector(spike, config) if spike is not None else None
        self.spike_log = SpikeLog(self.run_dir, self.is_main)
        self.last_step = 0
        self._feed: StepFeed | None = None
        self._step_end = 0.0  # when the previous step ended (tokens/s)
        self._skipped_in_a_row = 0  # non-finite steps since the last finite one (kept in checkpoints)
        self._write_failure: WriteFailed | None = None  # this rank's failed metrics write, not yet raised
        self._peak = peak_flops(self.parallel_context.device)
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
        self.last_step = self._resume()
        logged = self.metrics.last_logged_step()  # what W&B has, before the steps to train again are dropped
        self._writing_metrics(lambda: self.metrics.truncate_after(self.last_step),  # no step logged twice
                              lambda: self.mixing.start(self.last_step),  # nor decided twice
                              lambda: self.spike_log.truncate_after(self.last_step))
        self._raise_write_failure()
        self._start_wandb(logged)
        summary = TrainSummary(self.last_step, metrics_file=self.metrics.path)
        c = self.config
        last_save = self.last_step
        self.progress = Progress(c.tokens.train_steps, stages=stage_spans(self.plan))
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

    def _train_step(self, step: int, stage: StagePlan, batches: list[dict], lr: float, data_wait: float,
                    summary: TrainSummary, stop: Any) -> bool:
        """Train, judge, log and validate one step (a step surgery skips: read, never trained, no engine call at all);
        whether every rank agreed to stop after it. The stop and write-failure flags ride in the step's one reduction
        of the numbers it logs."""
        reduction = StepReduction(self.parallel_context.device)
        stop.add_to(reduction)
        reduction.add(WRITE_FAILED, 1.0 if self._write_failure is not None else 0.0)
        self.mixing.add_to(reduction)
        spikes = self.spikes
        result = None
        if self.plan.surgery.skips(step):
            reduction.read()
        else:
            skip_above = spikes.threshold(stage.name) if spikes is not None and spikes.skips else None
            result = self.engine.train_step(batches, stage.sequence_length, num_sources=len(stage.dataset_ids),
                                            reduction=reduction, skip_above=skip_above)
        if reduction.value(WRITE_FAILED):  # a rank could not write the previous step's metrics
            self._raise_write_failure()
        self.mixing.agree_from(reduction)  # the previous step's decision, the same on every rank
        self.last_step = step
        agreed = stop.agree_from(reduction)
        self.metrics.hold_rows = self._saves_after(step, agreed)  # its row carries the checkpoint's blocking time
        if result is None:
            self._log_surgery_skip(step, stage, lr)
            return agreed
        if spikes is not None:  # a non-finite step is not judged and does not enter the window
            spikes.forget_verdict()
            if math.isfinite(result.loss) and math.isfinite(result.grad_norm):
                spikes.judge(stage.name, result.loss)
        self._log_and_validate(step, stage, result, lr, data_wait, summary)
        self._count_skips(step, result)
        return agreed

    def _saves_after(self, step: int, stop: bool) -> bool:
        """Whether a checkpoint follows step ``step`` (the loop's rule, or the final one)."""
        c = self.config.checkpoints
        last = step == self.config.tokens.train_steps
        return c.save_final if last else stop or bool(c.checkpoint_interval and step % c.checkpoint_interval == 0)

    def _log_and_validate(self, step: int, stage: StagePlan, result: StepResult, lr: float, data_wait: float,
                          summary: TrainSummary) -> None:
        """Log the step, then validate when due (before this step's checkpoint: never repeated)."""
        validate = self.validator.should_validate(step, stage.index)
        self._writing_metrics(lambda: self.mixing.after_step(step, stage, result.sources),
                              lambda: self._log_step(step, stage, result, lr, data_wait, summary),
                              lambda: self._validate(step, stage) if validate else None,
                              lambda: self._evaluate(step, stage) if self.evaluator.should_evaluate(step) else None)

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

    def _log_step(self, step: int, stage: StagePlan, result: StepResult, lr: float, data_wait: float,
                  summary: TrainSummary) -> None:
        now = time.perf_counter()
        seconds, self._step_end = now - self._step_end, now  # validation and checkpoint saves left out
        tokens_per_s = tokens_per_second(self.config, stage.sequence_length, seconds)
        if not result.skipped:
            summary.final_loss_per_stage[stage.name] = result.loss
        row = {
            "step": step, "stage": stage.name, "loss": result.loss, "lr": lr, "grad_norm": result.grad_norm,
            "skipped": result.skipped, "tokens_per_s": tokens_per_s, "data_wait_ms": 1000 * data_wait,
            "label_tokens": result.num_label_tokens, "tokens": self.config.global_batch_size * stage.sequence_length,
            "data_hash": self.plan.data_hash(step) if self._feed.from_config and self.is_main else None,
            "mfu": self._mfu(tokens_per_s, stage.sequence_length), "time": time.time(),
        }
        if result.sources is not None:  # per dataset of the stage; none from a loader without source ids
            row["sources"] = source_metrics(self._names(stage), result.sources)
        row.update(self._drawn_weights(step, stage))
        spike = self.spikes.last if self.spikes is not None else None
        if spike is not None:
            row["spike_z"] = spike[0]
            if result.skipped:
                row["skipped"] = "spike"
        self.metrics.log(row, self.progress.step_done(step, seconds) if self.is_main else "")
        if spike is not None:  # its line after the step's
            self._log_spike(step, stage, result, spike[0])

    def _names(self, stage: StagePlan) -> list[str]:
        """The names of the stage's sources (``source_names``), as the rows key them."""
        return [self.source_names[self.plan.datasets[d].folder] for d in stage.dataset_ids]

    def _log_spike(self, step: int, stage: StagePlan, result: StepResult, z: float) -> None:
        """A row of spikes.jsonl (its samples named by the data order when they are the config's) and a line."""
        if not self.is_main:
            return
        identities = explain_step(self.plan, step) if self._feed.from_config else None
        samples = ranked_samples(result.samples, identities) if result.samples is not None else []
        self.spike_log.append(step, stage.name, result.loss, z, samples)
        self.metrics.info(self.spikes.describe(step, stage.name, result.loss))

    def _drawn_weights(self, step: int, stage: StagePlan) -> dict:
        """A row's ``weights``: the ones the step was drawn with (adaptive: as decided), trained or skipped; none
        for a custom loader's batches."""
        if not self._feed.from_config:
            return {}
        return {"weights": dict(zip(self._names(stage), stage.weights_at(step)))}

    def _log_surgery_skip(self, step: int, stage: StagePlan, lr: float) -> None:
        """The row of a step that surgery skips: its step, stage and data hash, ``skipped: "surgery"``, no loss."""
        self._step_end = time.perf_counter()
        row = {"step": step, "stage": stage.name, "loss": None, "lr": lr, "grad_norm": None, "skipped": SURGERY_SKIP,
               "data_hash": self.plan.data_hash(step) if self._feed.from_config and self.is_main else None,
               "time": time.time(), **self._drawn_weights(step, stage)}
        validate = self.validator.should_validate(step, stage.index)
        self._writing_metrics(lambda: self.mixing.after_step(step, stage, None),  # a block's decision is still due
                              lambda: self.metrics.log(row), lambda: self._validate(step, stage) if validate else None,
                              lambda: self._evaluate(step, stage) if self.evaluator.should_evaluate(step) else None)

    def _validate(self, step: int, stage: StagePlan) -> None:
        began = time.perf_counter()
        results = self.validator.validate(self.engine)
        self.metrics.log_validation(step, stage.name, results, describe(results), time.perf_counter() - began)
        self._step_end = time.perf_counter()  # the next step's tokens/s leaves the evaluation out

    def _evaluate(self, step: int, stage: StagePlan) -> None:
        began = time.perf_counter()
        results = self.evaluator.evaluate(self.engine, step)
        self.metrics.log_validation(step, stage.name, results, describe_evaluation(results),
                                    time.perf_counter() - began, key="eval")
        self._step_end = time.perf_counter()  # the next step's tokens/s leaves the evaluation out

    def _count_skips(self, step: int, result: StepResult) -> None:
        """A run whose steps keep being non-finite (skipped) has diverged: stop it, naming where to resume."""
        self._skipped_in_a_row = self._skipped_in_a_row + 1 if result.skipped else 0
        limit = self.optimizers.at(step).optimizer.max_skipped_steps
        if self._skipped_in_a_row > limit:
            first = self._streak_start(step)
            between = [f"{max(a, first)}-{min(b, step)}" for a, b in self.plan.surgery.skip_steps
                       if a <= step and b >= first]
            counted = f" (steps {', '.join(between)}, skipped by surgery, between them not counted)" if between else ""
            good = self.checkpoints.newest_of_a_finite_step()
            where = (f"the newest checkpoint of a finite step is {good}: resume from it (checkpoints.resume: {good})"
                     if good is not None else "no checkpoint of a finite step was saved: start over")
            spikes = " or were spikes (surgery.spike.action: skip)" if self.spikes and self.spikes.skips else ""
            self._writing_metrics(self.metrics.release)  # a row held for the checkpoint this run will not save
            raise NanosetError(f"steps {first}-{step}: {self._skipped_in_a_row} steps in a row had a non-finite loss "
                               f"or gradient norm{spikes} and were skipped{counted} "
                               f"(optimizer.max_skipped_steps {limit}); the run has diverged: {where} with a lower "
                               f"optimizer.learning_rate")

    def _streak_start(self, step: int) -> int:
        """The first step of the run of non-finite steps ending at ``step``: the steps surgery skips inside it
        neither count nor end it."""
        left = self._skipped_in_a_row
        while left > 1 or self.plan.surgery.skips(step):
            left -= not self.plan.surgery.skips(step)
            step -= 1
        return step

    def _start_wandb(self, last_logged_step: int) -> None:
        """``logging.wandb``: global rank 0's W&B run, given the resolved config and the parameter count."""
        if not self.is_main:
            return
        p = self.parameters
        config = dict(self.config.to_dict(), parameters={"total": p.total, "embedding": p.embedding, "rest": p.rest})
        self.metrics.wandb = start_wandb(self.config.logging.wandb, self.config.general.run, self.run_dir, config,
                                         self.last_step, last_logged_step, self.metrics.info)
        if self.metrics.wandb is not None:
            self.metrics.resend(self.metrics.wandb.replay_after)

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
                                         self._skipped_in_a_row)
        record.step_skipped = record.step_skipped and not self.plan.surgery.skips(step)
        record.extensions[SURGERY_KEY] = surgery_record(self.plan.surgery)
        record.extensions[MIXING_KEY] = self.mixing.checkpoint_state()
        record.extensions[STAGE_OPTIMIZERS_KEY] = self.optimizers.record()
        if self.spikes is not None:
            record.extensions[SPIKE_WINDOW] = self.spikes.state_dict()
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
        self._skipped_in_a_row = record.skipped_in_a_row
        window = record.extensions.get(SPIKE_WINDOW)
        if self.spikes is not None and window:  # the window goes on as if never interrupted
            self.spikes.load_state_dict(window)
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

    def _mfu(self, tokens_per_s: float, sequence_length: int) -> float | None:
        return model_flops_utilization(tokens_per_s, self.config, sequence_length, self._peak)

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
                          f"{clock(self.progress.elapsed())}; final loss per stage: "
                          f"{losses or 'none (nothing left to train)'}; checkpoint: {summary.checkpoint}{wrote}")
