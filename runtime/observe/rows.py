"""The step observer of metrics: each step's row of ``metrics.jsonl`` (and its console line, TensorBoard and W&B
scalars), built from what the step did; on every start the log is cut after the resumed step and W&B started.

A trained step's row: ``step``, ``stage``, ``loss``, ``lr``, ``grad_norm``, ``skipped``, ``tokens_per_s``,
``data_wait_ms``, ``label_tokens``, ``tokens``, ``data_hash`` (the config's batches only), ``mfu``, ``time``, then
``sources`` and ``weights`` when known and what the observers before it added (``spike_z``). A step surgery skips
logs its step, stage, lr and data hash with ``skipped: "surgery"`` and no loss.
"""

from __future__ import annotations

import time

from runtime.config import Config
from runtime.control.progress import Progress, stage_spans
from runtime.data.order.plan import DataPlan
from runtime.data.order.source_names import source_names
from runtime.observe.metrics import (
    SURGERY_SKIP,
    MetricsLogger,
    ParameterCount,
    model_flops_utilization,
    source_metrics,
    tokens_per_second,
)
from runtime.observe.observer import StepObserver, TrainedStep
from runtime.observe.wandb_logger import start_wandb


class MetricsRows(StepObserver):
    """``from_config``: the batches are the config's data order (the data hash, weights and samples are known);
    ``peak``: the device's peak FLOP/s for the MFU (None: not known)."""

    def __init__(self, config: Config, plan: DataPlan, metrics: MetricsLogger, parameters: ParameterCount,
                 from_config: bool, peak: float | None) -> None:
        self.config, self.plan, self.metrics = config, plan, metrics
        self.parameters, self.from_config, self.peak = parameters, from_config, peak
        self.names = source_names(plan)  # folder → the name the rows give it
        self.progress = Progress(config.tokens.train_steps, stages=stage_spans(plan))

    def start(self, resumed_step: int) -> None:
        """Cut metrics.jsonl after the resumed step (no step logged twice), then start W&B (global rank 0), given the
        steps it logged before (what the file held) and sent the rows it may have lost. The run's time and ETA count
        from its end."""
        logged = self.metrics.last_logged_step()
        self.metrics.truncate_after(resumed_step)
        if self.metrics.enabled:
            self._start_wandb(resumed_step, logged)
        self.progress = Progress(self.config.tokens.train_steps, stages=stage_spans(self.plan))

    def _start_wandb(self, resumed_step: int, logged: int) -> None:
        p = self.parameters
        config = dict(self.config.to_dict(), parameters={"total": p.total, "embedding": p.embedding, "rest": p.rest})
        general = self.config.general
        self.metrics.wandb = start_wandb(self.config.logging.wandb, general.run, general.run_path, config,
                                         resumed_step, logged, self.metrics.info)
        if self.metrics.wandb is not None:
            self.metrics.resend(self.metrics.wandb.replay_after)

    def after_step(self, step: TrainedStep) -> None:
        result, stage = step.result, step.stage
        data_hash = self.plan.data_hash(step.step) if self.from_config and self.metrics.enabled else None
        names = [self.names[self.plan.datasets[d].folder] for d in stage.dataset_ids]  # as the rows key them
        # the weights the step was drawn with (adaptive: as decided), trained or skipped
        weights = {"weights": dict(zip(names, stage.weights_at(step.step)))} if self.from_config else {}
        if result is None:
            self.metrics.log({"step": step.step, "stage": stage.name, "loss": None, "lr": step.lr, "grad_norm": None,
                              "skipped": SURGERY_SKIP, "data_hash": data_hash, "time": time.time(), **weights})
            return
        tokens_per_s = tokens_per_second(self.config, stage.sequence_length, step.seconds)
        row = {
            "step": step.step, "stage": stage.name, "loss": result.loss, "lr": step.lr, "grad_norm": result.grad_norm,
            "skipped": result.skipped, "tokens_per_s": tokens_per_s, "data_wait_ms": 1000 * step.data_wait,
            "label_tokens": result.num_label_tokens, "tokens": self.config.global_batch_size * stage.sequence_length,
            "data_hash": data_hash,
            "mfu": model_flops_utilization(tokens_per_s, self.config, stage.sequence_length, self.peak),
            "time": time.time(),
        }
        if result.sources is not None:  # per dataset of the stage; none from a loader without source ids
            row["sources"] = source_metrics(names, result.sources)
        row.update(weights)
        row.update(step.row)
        self.metrics.log(row, self.progress.step_done(step.step, step.seconds) if self.metrics.enabled else "")
        for line in step.lines:
            self.metrics.info(line)
