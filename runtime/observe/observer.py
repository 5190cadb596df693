"""The step observers: what the trainer calls after every step, in its order, to judge, log and decide on it.

Each observer sees a step as a ``TrainedStep`` (its number, stage, learning rate, the engine's result, its time) and
may add fields to the step's metrics row (``row``) for the observers after it. ``start`` runs on every start once the
checkpoint is loaded (a log keeps the steps up to the resumed one); an observer with a ``checkpoint_key`` keeps its
state in the checkpoint under that key, so that a resumed run observes as the uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.data.order.plan import StagePlan
    from runtime.engine import StepResult


@dataclass
class TrainedStep:
    """One step, as its observers see it."""

    step: int
    stage: StagePlan
    lr: float
    result: StepResult | None  # None: a step surgery skips (read, never trained)
    seconds: float  # the step's own time (data, forward, backward, update; validation and saves left out)
    data_wait: float  # of which waiting for the data
    row: dict = field(default_factory=dict)  # fields the observers add to the step's metrics row
    lines: list[str] = field(default_factory=list)  # console lines the observers print after the step's own line


class StepObserver:
    """An observer of every step; each method does nothing unless the observer needs it."""

    checkpoint_key: str | None = None  # the checkpoint extension keeping ``state_dict`` (None: no state)

    def start(self, resumed_step: int) -> None:
        """On every start (``resumed_step``: 0 when fresh): drop what the steps about to be trained again logged."""

    def after_step(self, step: TrainedStep) -> None:
        """Observe ``step``; raise to stop the run."""

    def state_dict(self) -> dict | None:
        """What the checkpoint keeps under ``checkpoint_key`` (None: nothing)."""
        return None

    def load_state_dict(self, state: dict) -> None:
        """The state a checkpoint kept, on resuming from it."""
