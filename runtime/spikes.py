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

import json
import math
from collections import deque
from pathlib import Path

import numpy as np

from nanoset.atomic import atomic_write_text
from runtime.config.overrides import suggested_command
from runtime.config.schema import Config, SpikeArgs
from runtime.metrics import append_jsonl
from runtime.sample_losses import SampleLosses

SPIKES_FILE = "spikes.jsonl"


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
        if not self.enabled or not self.path.is_file():
            return
        rows = {r["step"]: json.dumps(r) for r in read_rows(self.path) if r["step"] <= step}
        atomic_write_text(self.path, "".join(rows[s] + "\n" for s in sorted(rows)))

    def append(self, step: int, stage: str, loss: float, z: float, samples: list[dict]) -> None:
        if self.enabled:
            append_jsonl(self.path, {"step": step, "stage": stage, "loss": loss, "z": z, "samples": samples})


def read_rows(path: Path) -> list[dict]:
    """The rows of a spikes.jsonl, torn lines left out."""
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows
