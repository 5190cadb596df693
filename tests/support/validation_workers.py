"""Processes for the validation tests: evaluate the held-out sets of a config in a given layout."""

from __future__ import annotations

import dataclasses
import json

from runtime.config import ParallelismArgs
from runtime.config.load import load_config
from runtime.config.rules import validate_config


def evaluate_in_layout(rank: int, world: int, config_path: str, layout: dict, out_path: str,
                       without_schedule_eval: bool) -> None:
    from runtime.data.order.validation_sets import open_validation_sets
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext
    from runtime.validation import Validator

    if without_schedule_eval:  # torch before 2.9: no eval(), and no loss computed without backward
        from torch.distributed.pipelining import schedules

        def old_maybe_compute_loss(self, stage, output, target_mbs, mb_index, loss_kwargs=None):
            if stage.is_last and self._has_backward:
                self._internal_losses.append(self._compute_loss(output, target_mbs[mb_index]))

        del schedules._PipelineSchedule.eval
        schedules._PipelineSchedule._maybe_compute_loss = old_maybe_compute_loss
    config = load_config(config_path)
    config = dataclasses.replace(config, parallelism=ParallelismArgs(**layout))
    validate_config(config)
    p = config.parallelism
    engine = Engine(config, ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp))
    results = Validator(config, open_validation_sets(config)).validate(engine)
    with open(f"{out_path}.rank{rank}", "w") as f:
        json.dump(results, f)


def train_with_slow_evaluations(rank: int, world: int, config_path: str, out_path: str) -> None:
    """Train with every evaluation taking 2 s more: the tokens/s of the following steps must not see it."""
    import time

    from runtime.trainer import Trainer
    from runtime.validation import Validator

    validate = Validator.validate

    def slow(*args, **kwargs):
        time.sleep(2)
        return validate(*args, **kwargs)

    Validator.validate = slow
    trainer = Trainer(config_path)
    try:
        trainer.train()
    finally:
        trainer.close()
