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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from nanoset.errors import NanosetError, WriteFailed
from runtime.checkpoint.layout import LATEST, checkpoints_folder, last_step
from runtime.checkpoint.run_folder import Rewound, move_aside, rewind
from runtime.checkpoint.store import SKIPPED, SKIPPED_IN_A_ROW, CheckpointManager
from runtime.compat import NanotronCallStyles
from runtime.config import Config
from runtime.data.loading.feed import StepFeed, training_feed
from runtime.data.order.plan import StagePlan, training_metadata
from runtime.engine import Engine, StepResult
from runtime.hf.export import export_checkpoint
from runtime.hf.load import load_hf_weights
from runtime.hf.preflight import data_tokenizer
from runtime.lr_schedule import LRSchedule
from runtime.metrics import (
    MetricsLogger,
    model_flops_utilization,
    peak_flops,
    short_names,
    source_metrics,
    tokens_per_second,
)
from runtime.parallel.agreement import raise_together
from runtime.parallel.context import ParallelContext
from runtime.preemption import installed, stop_on_signal
from runtime.startup import Startup, start_up, startup_notes
from runtime.validation import Validator, describe

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
        self.plan, self.start = startup.plan, startup.start
        self.validator = Validator(config, startup.validation_sets)
        p = config.parallelism
        self.parallel_context = parallel_context or ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp)
        self.is_main = self.parallel_context.world_rank == 0
        self.run_dir = config.general.run_path
        resumed = last_step(self.start.metadata) if self.start.checkpoint is not None else 0
        stop = installed()
        with stop.held() if stop is not None else nullcontext():  # a Ctrl-C here waits for the moves' end
            moved, rewound = self._prepare_run_folder(resumed)
        torch.manual_seed(config.general.seed)
        # resumed or from Hugging Face: every weight is loaded in _resume, so none is drawn first
        self.engine = Engine(config, self.parallel_context,
                             initialize=self.start.checkpoint is None and config.model.init_from_hf is None)
        self.lr_schedule = LRSchedule(config.lr_scheduler, config.optimizer.learning_rate, config.tokens.train_steps)
        self.checkpoints = CheckpointManager(checkpoints_folder(config), config.checkpoints.keep_last, self.is_main)
        self.metrics = MetricsLogger(self.run_dir, self.is_main, config.logging.tensorboard,
                                     config.logging.log_interval)
        self.metrics.source_names = short_names(self.plan.source_names())
        self.last_step = 0
        self._feed: StepFeed | None = None
        self._step_end = 0.0  # when the previous step ended (tokens/s)
        self._skipped_in_a_row = 0  # non-finite steps since the last finite one (kept in checkpoints)
        self._peak = peak_flops(self.parallel_context.device)
        if moved:
            self.metrics.info(f"checkpoints.replace_run: the previous run was moved to {', '.join(map(str, moved))}")
        for note in startup_notes(startup):
            self.metrics.info(f"note: {note}")
        if rewound is not None:
            self.metrics.info(f"rewound to step {resumed} ({self.start.checkpoint}): {rewound.describe()}")

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
            self._release_loader()
            raise

    def _train(self, dataloader_or_dls: Any) -> TrainSummary:
        tokens = self.config.tokens
        self._feed = training_feed(dataloader_or_dls, self.plan, self.parallel_context, tokens.micro_batch_size,
                                   tokens.batch_accumulation_per_replica, self.metrics.info)
        self.checkpoints.clean_stale()
        self.last_step = self._resume()
        self._writing_metrics(lambda: self.metrics.truncate_after(self.last_step))  # no step logged twice
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
                lr = self.lr_schedule.apply(self.engine.optimizer, step)
                result = self.engine.train_step(batches, stage.sequence_length, num_sources=len(stage.dataset_ids))
                self.last_step = step
                self._log_and_validate(step, stage, result, lr, data_wait, summary)
                self._count_skips(step, result)
                if os.environ.get(KILL_AT_STEP_ENV) == str(step) and self.is_main:
                    os.kill(os.getpid(), signal.SIGKILL)
                # every rank stops after the same step; a signal during the last one changes nothing
                summary.stopped_by_signal = stop.agreed(device) and step < c.tokens.train_steps
                interval = c.checkpoints.checkpoint_interval
                if summary.stopped_by_signal or interval and step % interval == 0 and step < c.tokens.train_steps:
                    self._save(step)
                    last_save = step
                    summary.stopped_by_signal = stop.agreed(device)  # a signal during the save: this checkpoint is it
                if summary.stopped_by_signal:
                    break
            # the final checkpoint; with train_steps 0, of the weights loaded (an exact HF → checkpoint → HF trip)
            loaded_only = c.tokens.train_steps == 0 and self.start.checkpoint is None
            if c.checkpoints.save_final and (self.last_step > last_save or loaded_only):
                self._save(self.last_step)
        summary.checkpoint = self.checkpoints.resolve(LATEST)
        summary.last_step = self.last_step
        if c.checkpoints.export_hf and not summary.stopped_by_signal and summary.checkpoint is not None:
            self._export_hf(summary.checkpoint)
        self._release_loader()
        summary.exit_status = stop.exit_status if summary.stopped_by_signal else 0
        self._print_summary(summary, stop.reason)
        return summary

    def _log_and_validate(self, step: int, stage: StagePlan, result: StepResult, lr: float, data_wait: float,
                          summary: TrainSummary) -> None:
        """Log the step, then validate when due (before this step's checkpoint: never repeated)."""
        validate = self.validator.should_validate(step, stage.index)
        self._writing_metrics(lambda: self._log_step(step, stage, result, lr, data_wait, summary),
                              lambda: self._validate(step, stage) if validate else None)

    def _writing_metrics(self, *parts: Callable[[], None]) -> None:
        """Run every part on every rank. Rank 0 alone writes metrics.jsonl: a write that fails there (a full disk)
        is raised on every rank once all parts ran (validation's collectives included), so that no rank goes on
        alone or dies in the next collective with a traceback."""
        failure = None
        for part in parts:
            try:
                part()
            except WriteFailed as e:
                failure = failure or e
        raise_together(failure, self.parallel_context.device)

    def _log_step(self, step: int, stage: StagePlan, result: StepResult, lr: float, data_wait: float,
                  summary: TrainSummary) -> None:
        now = time.perf_counter()
        tokens_per_s = tokens_per_second(self.config, stage.sequence_length, now - self._step_end)
        self._step_end = now
        if not result.skipped:
            summary.final_loss_per_stage[stage.name] = result.loss
        row = {
            "step": step, "stage": stage.name, "loss": result.loss, "lr": lr, "grad_norm": result.grad_norm,
            "skipped": result.skipped, "tokens_per_s": tokens_per_s, "data_wait_ms": 1000 * data_wait,
            "label_tokens": result.num_label_tokens,
            "data_hash": self.plan.data_hash(step) if self._feed.from_config and self.is_main else None,
            "mfu": self._mfu(tokens_per_s, stage.sequence_length), "time": time.time(),
        }
        if result.sources is not None:  # per dataset of the stage; none from a loader without source ids
            row["sources"] = source_metrics([self.plan.datasets[d].folder for d in stage.dataset_ids], result.sources)
        self.metrics.log(row)

    def _validate(self, step: int, stage: StagePlan) -> None:
        results = self.validator.validate(self.engine, stage.sequence_length, stage.use_position_ids)
        self.metrics.log_validation(step, stage.name, results, describe(results))
        self._step_end = time.perf_counter()  # the next step's tokens/s leaves the evaluation out

    def _count_skips(self, step: int, result: StepResult) -> None:
        """A run whose steps keep being non-finite (skipped) has diverged: stop it, naming where to resume."""
        self._skipped_in_a_row = self._skipped_in_a_row + 1 if result.skipped else 0
        limit = self.config.optimizer.max_skipped_steps
        if self._skipped_in_a_row > limit:
            first = step - self._skipped_in_a_row + 1
            good = self.checkpoints.newest_of_a_finite_step()
            where = (f"the newest checkpoint of a finite step is {good}: resume from it (checkpoints.resume: {good})"
                     if good is not None else "no checkpoint of a finite step was saved: start over")
            raise NanosetError(f"steps {first}-{step}: {self._skipped_in_a_row} steps in a row had a non-finite loss "
                               f"or gradient norm and were skipped (optimizer.max_skipped_steps {limit}); the run has "
                               f"diverged: {where} with a lower optimizer.learning_rate")

    def close(self) -> None:
        self._release_loader()
        self.metrics.close()
        self.parallel_context.destroy()

    def _release_loader(self) -> None:
        if self._feed is not None:
            self._feed.close()

    # ------------------------------------------------------------------ checkpoints -------------

    def _save(self, step: int) -> Path:
        """A checkpoint of ``step``; one of a skipped (non-finite) step is not one to return to, and carries the count
        of skipped steps in a row, so that a resumed diverging run stops where an uninterrupted one would."""
        tokenizer = data_tokenizer(self.plan)  # for runtime.export: bos/eos ids and the tokenizer files
        meta = {"training": training_metadata(self.plan, step).to_json(),
                "lr_schedule": self.lr_schedule.state_dict(), "config": self.config.to_dict(),
                "tokenizer": asdict(tokenizer) if tokenizer is not None else None,
                SKIPPED: self._skipped_in_a_row > 0, SKIPPED_IN_A_ROW: self._skipped_in_a_row}
        return self.checkpoints.save(self.engine, step, meta)

    def _resume(self) -> int:
        path = self.start.checkpoint
        if path is None:
            if self.config.model.init_from_hf is not None:
                load_hf_weights(self.engine.chunks, self.config.model.init_from_hf)
                self.metrics.info(f"weights from {self.config.model.init_from_hf} (model.init_from_hf)")
            return 0
        metadata = self.checkpoints.load(self.engine, path)
        last = last_step(metadata)
        # a checkpoint from before the count was saved: its own step's skip, if any
        self._skipped_in_a_row = metadata.get(SKIPPED_IN_A_ROW, int(bool(metadata.get(SKIPPED, False))))
        self.metrics.info(f"resumed from {path} at step {last}")
        return last

    def _export_hf(self, checkpoint: Path) -> None:
        """``checkpoints.export_hf``: the final checkpoint as a Hugging Face folder, ``run_dir/hf`` (rank 0).
        A failure is raised on rank 0 after the barrier, so the other ranks never wait for it forever."""
        failed = None
        if self.is_main:
            try:
                out = export_checkpoint(checkpoint, self.run_dir / "hf", replace=True)
                self.metrics.info(f"exported {checkpoint.name} to {out} (Hugging Face LlamaForCausalLM)")
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
        self.metrics.info(f"done: step {summary.last_step}/{self.config.tokens.train_steps}; final loss per stage: "
                          f"{losses or 'none (nothing left to train)'}; checkpoint: {summary.checkpoint}{wrote}")
