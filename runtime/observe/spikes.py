"""Loss spikes (``surgery.spike``): which steps are spikes, and the log of their samples, ``spikes.jsonl``.

A step is a spike when its loss exceeds the mean of the window by ``zscore`` standard deviations. The
window holds the losses of the last ``window`` trained steps of the current stage: it restarts at a stage
boundary (a new stage changes the loss by design), a step is judged only once it is full, a standard
deviation of 0 flags nothing, and a spike's own loss enters it (a lasting change of level stops being a
spike after a few steps). Every rank judges the same global loss, so every rank decides the same; the
window is saved in checkpoints, so a resumed run judges as the uninterrupted one would.

Each row of ``spikes.jsonl`` is ``{"step", "stage", "loss", "z", "samples": [...]}``, the samples of the
step highest mean token loss first, each ``{"position", "dataset", "sample", "documents", "loss",
"label_tokens"}`` (``loss``: the mean over its label tokens; null without any).
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

import numpy as np

from runtime.config.overrides import suggested_command
from runtime.config.schema import Config, SpikeArgs
from runtime.data.order.plan import DataPlan
from runtime.data.order.provenance import explain_step
from runtime.observe.observer import StepObserver, TrainedStep
from runtime.observe.step_log import append_row, cut_after
from runtime.sample_losses import SampleLosses

SPIKES_FILE = "spikes.jsonl"
SPIKE_WINDOW = "spike_window"  # the checkpoint's key of the detector's window of recent losses


class SpikeDetector:
    """The window of recent losses of the current stage and the verdict on the step just judged (``last``)."""

    def __init__(self, args: SpikeArgs, config: Config | None = None) -> None:
        self.args = args
        self.arguments = (config or Config).arguments  # the run's config: the spike's line suggests a command on it
        self.stage: str | None = None
        self.losses: deque[float] = deque(maxlen=args.window)
        self.last: tuple[float, float, float] | None = None  # (z, mean, std) of the step just judged, if a spike

    def threshold(self, stage: str) -> float | None:
        """The loss above which the next step of ``stage`` is a spike: the window's mean + ``zscore`` standard
        deviations (population), from earlier steps only, so that the engine can skip on the device; None while
        the window is not full or flat."""
        if stage != self.stage:
            self.stage = stage
            self.losses.clear()
        if len(self.losses) < self.args.window:
            return None
        window = np.asarray(self.losses, dtype=np.float64)
        std = float(window.std())
        return float(window.mean()) + self.args.zscore * std if std > 0 else None

    def judge(self, stage: str, loss: float) -> float | None:
        """The z-score of a finite ``loss`` of ``stage`` when it is above the threshold (a spike), else None; the
        loss enters the window. The same comparison as the engine's ``skip_above``: both decide alike."""
        limit = self.threshold(stage)
        self.last = None
        if limit is not None and loss > limit:
            window = np.asarray(self.losses, dtype=np.float64)
            mean, std = float(window.mean()), float(window.std())
            self.last = ((loss - mean) / std, mean, std)
        self.losses.append(loss)
        return self.last[0] if self.last is not None else None

    @property
    def skips(self) -> bool:
        """Whether a spike's update is skipped (``action: skip``)."""
        return self.args.action == "skip"

    def forget_verdict(self) -> None:
        """Before a step: no verdict until it is judged (a non-finite step is not)."""
        self.last = None

    def state_dict(self) -> dict:
        return {"stage": self.stage, "losses": list(self.losses)}

    def load_state_dict(self, state: dict) -> None:
        self.stage = state.get("stage")
        self.losses = deque(state.get("losses", []), maxlen=self.args.window)

    def describe(self, step: int, stage: str, loss: float) -> str:
        """The console line of the spike just judged."""
        z, mean, std = self.last
        what = "update skipped (surgery.spike.action: skip)" if self.skips else "logged"
        return (f"spike at step {step} ({stage!r}): loss {loss:.4f} is {z:.1f} standard deviations above the mean "
                f"{mean:.4f} of the last {self.args.window} steps; {what}; its samples: {SPIKES_FILE}, or "
                f"{suggested_command(self.arguments, 'explain', '--suspects', step)}")


def ranked_samples(samples: SampleLosses, identities: list[dict] | None) -> list[dict]:
    """The samples of a step, highest mean token loss first; ``identities``: per global position its
    ``dataset``, ``sample`` and ``documents`` (``explain``'s rows), None when the batches were a user's."""
    per_token = samples.per_token()
    out = []
    for p in samples.ranked():
        who = identities[p] if identities is not None else {}
        loss = float(per_token[p])
        out.append({"position": p, "dataset": who.get("dataset"), "sample": who.get("sample"),
                    "documents": who.get("documents"), "loss": loss if math.isfinite(loss) else None,
                    "label_tokens": int(samples.label_tokens[p])})
    return out


class SpikeLog:
    """``run_dir/spikes.jsonl``, written by global rank 0 (``enabled``)."""

    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self.path = Path(run_dir) / SPIKES_FILE
        self.enabled = enabled

    def truncate_after(self, step: int) -> None:
        """On every start: only the rows of steps ≤ ``step`` (the resumed one), one each (a torn tail dropped)."""
        if self.enabled:
            cut_after(self.path, step)

    def append(self, step: int, stage: str, loss: float, z: float, samples: list[dict]) -> None:
        if self.enabled:
            append_row(self.path, {"step": step, "stage": stage, "loss": loss, "z": z, "samples": samples})


class SpikeWatch(StepObserver):
    """The step observer of spikes: judges each finite trained step (``surgery.spike``; without it ``detector`` is
    None and only the log is cut on a start), adds ``spike_z`` (and ``skipped: "spike"``) to its row, and logs a
    spike's samples, named by the data order when the batches are the config's (``from_config``)."""

    checkpoint_key = SPIKE_WINDOW

    def __init__(self, config: Config, plan: DataPlan, log: SpikeLog, from_config: bool) -> None:
        args = config.surgery.spike
        self.detector = SpikeDetector(args, config) if args is not None else None
        self.plan, self.log, self.from_config = plan, log, from_config

    @property
    def skips(self) -> bool:
        """Whether a spike's update is skipped (``action: skip``)."""
        return self.detector is not None and self.detector.skips

    def skip_above(self, stage: str) -> float | None:
        """The loss above which the engine skips the next step's update (``action: skip``), None for none."""
        return self.detector.threshold(stage) if self.skips else None

    def start(self, resumed_step: int) -> None:
        self.log.truncate_after(resumed_step)

    def after_step(self, step: TrainedStep) -> None:
        """A non-finite step is not judged and does not enter the window."""
        result, detector = step.result, self.detector
        if detector is None or result is None:
            return
        detector.forget_verdict()
        if not (math.isfinite(result.loss) and math.isfinite(result.grad_norm)):
            return
        z = detector.judge(step.stage.name, result.loss)
        if z is None:
            return
        step.row["spike_z"] = z
        if result.skipped:
            step.row["skipped"] = "spike"
        if self.log.enabled:
            identities = explain_step(self.plan, step.step) if self.from_config else None
            samples = ranked_samples(result.samples, identities) if result.samples is not None else []
            self.log.append(step.step, step.stage.name, result.loss, z, samples)
            step.lines.append(detector.describe(step.step, step.stage.name, result.loss))  # after the step's line

    def state_dict(self) -> dict | None:
        return self.detector.state_dict() if self.detector is not None else None

    def load_state_dict(self, state: dict) -> None:
        if self.detector is not None and state:  # the window goes on as if never interrupted
            self.detector.load_state_dict(state)
