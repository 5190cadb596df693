"""When to evaluate (``evaluation.interval``) and the evaluation itself: every task scored through the engine at
the run's evaluation sequence length, then every hook called; the result is the metrics row's ``eval``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from nanoset import TokenizerInfo
from nanoset.errors import ConfigError
from runtime.config import Config
from runtime.evaluation.hooks import Hook, hook_metrics, load_hooks
from runtime.evaluation.tasks import Task, open_task
from runtime.observe.observer import StepObserver, TrainedStep

if TYPE_CHECKING:
    from runtime.engine import Engine
    from runtime.observe.metrics import MetricsLogger


def data_tokenizer(plan) -> TokenizerInfo | None:
    """The tokenizer the run's data records (one for all of it: the plan checked that), None where none does."""
    return next((d.reader.tokenizer for d in plan.datasets if d.reader.tokenizer is not None), None)


def task_tokenizer(info: TokenizerInfo | None, where: str):
    """The data's tokenizer (a ``tokenizers.Tokenizer``), which encodes the tasks as the data was encoded."""
    from nanoset.tokenize.tokenizer import load_tokenizer

    path = Path(info.path) if info is not None and info.path else None
    if path is None or not path.is_file():
        what = "records no tokenizer file" if path is None else f"recorded tokenizer {path} is not there"
        raise ConfigError(f"{where}: the data's {what}; the tasks are encoded with it: make it reachable (tokenize "
                          f"the data with a tokenizer.json on this machine)")
    return load_tokenizer(path)


def open_tasks(config: Config, info: TokenizerInfo | None, paths: list[tuple[str, str]] | None = None) -> list[Task]:
    """The config's ``evaluation.tasks`` (or ``paths``: name, file pairs), read, encoded and checked to fit."""
    wanted = paths if paths is not None else [(t.name, t.path) for t in config.evaluation.tasks]
    if not wanted:
        return []
    tokenizer = task_tokenizer(info, "evaluation.tasks")
    tasks = [open_task(name, path, tokenizer, info.eos_id) for name, path in wanted]
    for task in tasks:
        task.check_fits(config.validation_sequence_length)
    return tasks


class Evaluator:
    """The tasks and hooks of a run and the rule of when to run them."""

    def __init__(self, config: Config, tasks: list[Task], hooks: list[Hook] | None = None) -> None:
        self.config = config
        self.tasks = tasks
        self.hooks = hooks if hooks is not None else load_hooks(config.evaluation.hooks)

    def should_evaluate(self, step: int) -> bool:
        interval = self.config.evaluation.interval
        return interval > 0 and step % interval == 0 and bool(self.tasks or self.hooks)

    def evaluate(self, engine, step: int) -> dict[str, dict[str, float | int]]:
        """``{name: {"acc", "acc_norm", "n"}}`` per task, then what the hooks return; the same on every rank."""
        from runtime.evaluation.scoring import score

        results = {task.name: score(engine, task, self.config.validation_sequence_length) for task in self.tasks}
        for name, hook in zip(self.config.evaluation.hooks, self.hooks):
            results.update(hook_metrics(name, hook(model=engine, step=step)))
        return results


def describe(results: dict[str, dict[str, float | int]]) -> list[str]:
    """One part per task: ``NAME: acc A acc_norm B (n N)``; a hook's metrics as ``NAME: KEY V ...``."""
    return [f"{name}: acc {r['acc']:.4f} acc_norm {r['acc_norm']:.4f} (n {r['n']})"
            if {"acc", "acc_norm", "n"} <= set(r) else f"{name}: " + " ".join(f"{k} {v:.4g}" for k, v in r.items())
            for name, r in results.items()]


class DueEvaluation(StepObserver):
    """The step observer that evaluates after a step when it is due (after its validation, before its checkpoint)
    and logs the results as an ``eval`` row with how long they took."""

    def __init__(self, evaluator: Evaluator, engine: Engine, metrics: MetricsLogger) -> None:
        self.evaluator, self.engine, self.metrics = evaluator, engine, metrics

    def after_step(self, step: TrainedStep) -> None:
        if not self.evaluator.should_evaluate(step.step):
            return
        began = time.perf_counter()
        results = self.evaluator.evaluate(self.engine, step.step)
        self.metrics.log_validation(step.step, step.stage.name, results, describe(results), time.perf_counter() - began,
                                    key="eval")
