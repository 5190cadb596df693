"""The optimizer of each step: its stage's own optimizer keys and learning-rate schedule where it gives them.

A stage may hold ``optimizer:`` and ``lr_scheduler:`` with the top level's keys; a key it does not give is the top
level's (``Config.stage_optimizer``, ``Config.stage_lr_scheduler``). A stage with its own schedule (it gives
``lr_scheduler`` or ``optimizer.learning_rate``) counts it from its first step to its last; the other stages take
the run's schedule (steps 1 to ``tokens.train_steps``) at their steps. Everything is a pure function of the config
and the step, so a resume continues exactly; ``optimizer.reset_state: true`` zeroes AdamW's moments and step counts
before the stage's first step, which a checkpoint after it holds (a resume inside the stage does not reset again).
What each stage ran with is recorded in the checkpoint (``RECORD_KEY``); a resume with other values for a stage that
has begun follows the config from the resumed step on, and says so in a start-up note.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from runtime.config import Config
from runtime.config.schema import OptimizerArgs
from runtime.lr_schedule import LRSchedule

RECORD_KEY = "stage_optimizers"  # the checkpoint record's extension: stage name → what it trains with


@dataclass
class StageOptimizer:
    """What the steps of one stage train with."""

    name: str
    first_step: int
    last_step: int
    optimizer: OptimizerArgs  # the keys in force: the stage's own, the top level's for the rest
    schedule: LRSchedule  # its own (counted from first_step), or the run's
    own_schedule: bool
    reset_state: bool
    own_keys: bool  # the stage gives an optimizer or lr_scheduler section

    def record(self) -> dict:
        """As the checkpoint records it."""
        return {"optimizer": dataclasses.asdict(self.optimizer), "schedule": self.schedule.state_dict(),
                "reset_state": self.reset_state}

    def describe(self) -> str:
        o = self.optimizer
        schedule = self.schedule.describe() if self.own_schedule else "the run's schedule"
        reset = "; optimizer state reset at its first step" if self.reset_state else ""
        clip = f"clip_grad {o.clip_grad:g}" if o.clip_grad is not None else "no clipping"
        return (f"optimizer: stage {self.name!r} (steps {self.first_step}-{self.last_step}): {schedule}; "
                f"weight_decay {o.weight_decay:g}, betas ({o.adam_beta1:g}, {o.adam_beta2:g}), eps {o.adam_eps:g}, "
                f"{clip}{reset}")


class StageOptimizers:
    """Every stage's optimizer settings; ``apply`` sets a step's on the engine's optimizer."""

    def __init__(self, config: Config) -> None:
        self.run_schedule = LRSchedule(config.lr_scheduler, config.optimizer.learning_rate, config.tokens.train_steps)
        self.stages: list[StageOptimizer] = []
        for stage in sorted(config.data_stages, key=lambda s: s.start_training_step):
            first, last = stage.start_training_step, config.stage_end_step(stage) - 1
            optimizer = config.stage_optimizer(stage)
            schedule = (LRSchedule(config.stage_lr_scheduler(stage), optimizer.learning_rate, last, first)
                        if stage.own_schedule else self.run_schedule)
            self.stages.append(StageOptimizer(stage.name, first, last, optimizer, schedule, stage.own_schedule,
                                              stage.optimizer is not None and stage.optimizer.reset_state,
                                              stage.optimizer is not None or stage.lr_scheduler is not None))

    def at(self, step: int) -> StageOptimizer:
        return next(s for s in reversed(self.stages) if s.first_step <= step)

    def lr_at(self, step: int) -> float:
        return self.at(step).schedule.lr_at(step)

    def apply(self, engine, step: int) -> float:
        """Set ``engine``'s optimizer (and gradient clipping) to step ``step``'s stage, first zeroing its state at a
        stage's first step under ``reset_state``; the step's learning rate."""
        stage = self.at(step)
        o = stage.optimizer
        if stage.reset_state and step == stage.first_step:
            reset_state(engine.optimizer)
        lr = stage.schedule.lr_at(step)
        for group in engine.optimizer.param_groups:
            group.update(lr=lr, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps,
                         weight_decay=o.weight_decay if group.get("decayed", True) else 0.0)
        engine.clip_grad = o.clip_grad
        return lr

    def record(self) -> dict:
        """The checkpoint's extension: what each stage with keys of its own trains with."""
        return {s.name: s.record() for s in self.stages if s.own_keys}

    def describe(self) -> list[str]:
        """``--check``'s lines: the stages with keys of their own."""
        return [s.describe() for s in self.stages if s.own_keys]

    def changed_since(self, recorded: dict, resumed: int) -> list[str]:
        """Start-up notes for a resume after step ``resumed`` from a checkpoint that recorded ``recorded``: each
        begun stage whose optimizer or schedule is not what the checkpoint's run trained it with."""
        notes = []
        for s in self.stages:
            if s.first_step > resumed or s.last_step <= resumed:
                continue  # not begun, or over: nothing trained with the old values goes on
            was = recorded.get(s.name)
            now = s.record() if s.own_keys else None
            if was is not None and now is not None and was != now:
                keys = sorted(k for part in ("optimizer", "schedule") for k in now[part]
                              if was.get(part, {}).get(k) != now[part][k])
                notes.append(f"stage {s.name!r}: its optimizer or schedule differs from the checkpoint's "
                             f"({', '.join(keys) or 'reset_state'}): steps {resumed + 1}-{s.last_step} follow the "
                             f"config")
            elif (was is None) != (now is None) and recorded is not None:
                notes.append(f"stage {s.name!r}: its own optimizer keys were {'added' if was is None else 'removed'} "
                             f"since the checkpoint: steps {resumed + 1}-{s.last_step} follow the config")
        return notes


def reset_state(optimizer) -> None:
    """AdamW as new: every moment and step count zeroed in place (sharded tensors stay as they are)."""
    for state in optimizer.state.values():
        for value in state.values():
            if hasattr(value, "zero_"):
                value.zero_()
