"""Validation loss: when to validate (``validation.interval``, stage ends) and the validation itself.

Each named validation set comes through the feed in steps shaped like training steps (this rank's rows;
with tp or cp > 1 one rank of the replica's cp × tp group reads and broadcasts) and runs forward-only
through the engine (``Engine.eval_step``). The loss is Σ token losses / label tokens over the whole set, with the
run's one validation sequence length (``validation.sequence_length``, default the first stage's) and the first
stage's position-id rule, whatever stage the step is in, so a set's series is one quantity over the whole run, the
same for every dp/cp/tp/pp layout and for ``python -m runtime.evaluate``; each result records the length.
"""

from __future__ import annotations

import math
import time

from runtime.config import Config
from runtime.data.loading.feed import validation_batches
from runtime.data.order.validation_sets import ValidationSet
from runtime.engine import Engine
from runtime.observe.metrics import MetricsLogger
from runtime.observe.observer import StepObserver, TrainedStep


class Validator:
    """The validation sets of a run and the rule of when to validate them."""

    def __init__(self, config: Config, sets: list[ValidationSet]) -> None:
        self.config = config
        self.sets = sets

    def should_validate(self, step: int, stage_index: int) -> bool:
        """After ``step``: every ``interval`` steps, and at the last step of each stage (``at_stage_end``)."""
        v = self.config.validation
        if not self.sets:
            return False
        if v.interval > 0 and step % v.interval == 0:
            return True
        return v.at_stage_end and step == self.config.stage_end_step(self.config.data_stages[stage_index]) - 1

    def validate(self, engine: Engine) -> dict[str, dict[str, float | int | None]]:
        """``{name: {"loss", "ppl", "tokens", "sequence_length"}}`` for every set, identical on every rank."""
        tokens = self.config.tokens
        sequence_length = self.config.validation_sequence_length
        use_position_ids = self.config.data_stages[0].data.use_position_ids
        out = {}
        for vset in self.sets:
            loss_sum, count = 0.0, 0
            for batches in validation_batches(vset, sequence_length, use_position_ids, engine.ctx,
                                              tokens.micro_batch_size, tokens.batch_accumulation_per_replica):
                s, n = engine.eval_step(batches, sequence_length)
                loss_sum += s
                count += n
            out[vset.name] = {**summarize(loss_sum, count), "sequence_length": sequence_length}
        return out


def summarize(loss_sum: float, count: int) -> dict[str, float | int | None]:
    """``{"loss", "ppl", "tokens"}``; loss and ppl are null when not finite (a diverged model's NaN or infinity) or
    when the set's windows hold no label token (chat data sampled in user turns only): NaN and Infinity are not
    JSON, and metrics.jsonl must stay JSON."""
    if not count:
        return {"loss": None, "ppl": None, "tokens": 0}
    loss = loss_sum / count
    if not math.isfinite(loss):
        return {"loss": None, "ppl": None, "tokens": count}
    return {"loss": loss, "ppl": math.exp(loss) if loss < 700 else None, "tokens": count}


def describe(results: dict[str, dict[str, float | int | None]]) -> list[str]:
    """One line per dataset: ``NAME: loss L ppl P tokens N`` (``no label tokens`` when there are none, ``loss not
    finite`` when it is NaN or infinite)."""
    return [f"{name}: no label tokens (raise validation.samples)" if not r["tokens"] else
            f"{name}: loss not finite (NaN or infinity) tokens {r['tokens']}" if r["loss"] is None else
            f"{name}: loss {r['loss']:.4f} ppl " + ("overflow" if r["ppl"] is None else f"{r['ppl']:.2f}") +
            f" tokens {r['tokens']}" for name, r in results.items()]


class DueValidation(StepObserver):
    """The step observer that validates after a step when it is due (before the step's checkpoint: never repeated
    on a resume) and logs the losses with how long they took."""

    def __init__(self, validator: Validator, engine: Engine, metrics: MetricsLogger) -> None:
        self.validator, self.engine, self.metrics = validator, engine, metrics

    def after_step(self, step: TrainedStep) -> None:
        stage = step.stage
        if not self.validator.should_validate(step.step, stage.index):
            return
        began = time.perf_counter()
        results = self.validator.validate(self.engine)
        self.metrics.log_validation(step.step, stage.name, results, describe(results), time.perf_counter() - began)
