"""How far the run is and how long it will take: the console's elapsed time and ETA, durations as the log
says them, and the tokens a run trains on.

The ETA comes from a moving average of step times that leaves validation and checkpoint saves out (the trainer
restarts a step's clock after them): a save every 100 steps must not make every ETA after it jump. It is per stage:
the measured time per token times each remaining stage's tokens per step and steps."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

ETA_WINDOW = 20  # steps averaged: enough to smooth the loader's jitter, few enough to follow a new stage


def clock(seconds: float) -> str:
    """``M:SS`` under an hour, ``H:MM:SS`` from one (``27:03:04`` past a day: hours keep counting)."""
    s = max(0, round(seconds))
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def duration(seconds: float) -> str:
    """A short span as validation and checkpoint lines say it: ``0.42 s``, ``12.3 s``, then ``M:SS``."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return clock(seconds)


@dataclass(frozen=True)
class StageSpan:
    """Steps ``[start, end)`` of a stage and the tokens each of its steps trains on."""

    name: str
    start: int
    end: int
    tokens_per_step: int


def stage_spans(plan) -> list[StageSpan]:
    """The stages of a ``DataPlan`` (its parts) as spans of steps with their tokens per step."""
    return [StageSpan(p.name, p.start_step, p.end_step, p.global_batch_size * p.sequence_length) for p in plan.stages]


class Progress:
    """The elapsed time since training began (in this process) and the time the remaining steps will take.

    With the run's ``stages``, the ETA is per stage: the measured rate (seconds per token over the last steps) times
    each remaining stage's tokens, so a later stage of 4× the tokens per step (a longer sequence length, a larger
    batch) takes 4× as long per step; without them, the mean step time times the steps left."""

    def __init__(self, train_steps: int, window: int = ETA_WINDOW,
                 now: Callable[[], float] = time.perf_counter, stages: list[StageSpan] | None = None) -> None:
        self.train_steps = train_steps
        self.now = now
        self.started = now()
        self.step_times: deque[float] = deque(maxlen=window)
        self.stages = stages or []

    def elapsed(self) -> float:
        return self.now() - self.started

    def _tokens(self, step: int) -> int:
        return next((s.tokens_per_step for s in self.stages if s.start <= step < s.end), 1)

    def step_done(self, step: int, seconds: float) -> str:
        """Record ``step``'s time (``seconds``, its evaluation and checkpoint left out) and say
        ``elapsed M:SS | eta M:SS``, with ``(STAGE M:SS, ...)`` per stage when more than one is left."""
        self.step_times.append(seconds / self._tokens(step))
        per_token = sum(self.step_times) / len(self.step_times)
        if not self.stages:
            return f"elapsed {clock(self.elapsed())} | eta {clock(per_token * (self.train_steps - step))}"
        left: dict[str, float] = {}
        for s in self.stages:
            steps = s.end - max(s.start, step + 1)
            if steps > 0:
                left[s.name] = left.get(s.name, 0.0) + per_token * steps * s.tokens_per_step
        each = f" ({', '.join(f'{name} {clock(t)}' for name, t in left.items())})" if len(left) > 1 else ""
        return f"elapsed {clock(self.elapsed())} | eta {clock(sum(left.values()))}{each}"


def tokens_to_train(plan, after_step: int) -> list[tuple[str, int]]:
    """Per stage (in order, by name) the tokens steps ``after_step + 1 ..`` will feed: steps × global batch ×
    sequence length (padding of packed samples included, as tokens/s counts them); stages with none left out."""
    out: dict[str, int] = {}
    for part in plan.stages:
        steps = part.end_step - max(part.start_step, after_step + 1)
        if steps > 0:
            out[part.name] = out.get(part.name, 0) + steps * part.global_batch_size * part.sequence_length
    return list(out.items())


def describe_tokens(plan, after_step: int, train_steps: int) -> str:
    """The start-up line: the tokens the run will train on, in which steps, and per stage."""
    stages = tokens_to_train(plan, after_step)
    total = sum(n for _, n in stages)
    if not stages:
        return f"tokens: none to train (step {after_step} of {train_steps} is done)"
    per_stage = f" ({', '.join(f'{name} {n:,}' for name, n in stages)})" if len(stages) > 1 else ""
    return f"tokens: {total:,} to train in steps {after_step + 1}-{train_steps}{per_stage}"
