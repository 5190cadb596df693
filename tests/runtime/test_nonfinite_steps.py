"""A step whose loss or gradient norm is not finite is skipped, never applied: the weights stay finite, the
step still counts (data consumed, learning rate schedule on), every rank skips the same steps, metrics stay
JSON, pruning keeps the newest checkpoint of a finite step, and too many in a row stop the run in one line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import torch
import yaml

from runtime.config import LRSchedulerArgs
from runtime.lr_schedule import LRSchedule
from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import error_lines, metrics, torchrun, train_one

# Training as runtime.train does, with the loss of the steps in $NAN_STEPS made NaN on the last pipeline stage
# (a diverging run): its gradients are NaN too.
POISONED = f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
import runtime.engine as engine
nan_steps = {{int(s) for s in os.environ["NAN_STEPS"].split(",")}}
calls = [0]
train_step, loss = engine.Engine.train_step, engine.Engine._loss
def counted(self, *a, **k):
    calls[0] += 1
    return train_step(self, *a, **k)
def poisoned(self, logits, target):
    out = loss(self, logits, target)
    return out * float("nan") if calls[0] in nan_steps else out
engine.Engine.train_step, engine.Engine._loss = counted, poisoned
from runtime.train import main
sys.exit(main())
"""


def weights(checkpoint):
    from torch.distributed.checkpoint import FileSystemReader, load

    meta = FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    state = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in meta.items() if k.startswith("model.")}
    load(state, checkpoint_id=str(checkpoint), no_dist=True)
    return state


def test_non_finite_steps_are_skipped_on_every_pipeline_rank(shards, tmp_path):
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, accum=2, steps=8, interval=2, single_stage=True,
                       parallelism={"pp": 2}, checkpoints={"keep_last": 1})
    script = tmp_path / "poisoned.py"
    script.write_text(POISONED)
    torchrun(cfg, 2, cwd=shards, script=script, env={"NAN_STEPS": "3,4,7,8"})
    rows = [r for r in metrics(run) if "val" not in r]
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert [r["skipped"] for r in rows] == [False, False, True, True, False, False, True, True]
    text = (run / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON: null
    for r in rows:
        assert (r["loss"] is None) == r["skipped"] and (r["grad_norm"] is None) == r["skipped"]
        assert r["loss"] is None or math.isfinite(r["loss"])
    config = yaml.safe_load(cfg.read_text())
    schedule = LRSchedule(LRSchedulerArgs(**config["lr_scheduler"]), config["optimizer"]["learning_rate"], 8)
    assert [r["lr"] for r in rows] == [schedule.lr_at(s) for s in range(1, 9)]  # the schedule went on
    ckpts = run / "checkpoints"
    # keep_last 1 keeps the latest (step 8, skipped) and the newest of a step that trained (step 6)
    assert sorted(p.name for p in ckpts.glob("step-*")) == ["step-000006", "step-000008"]
    assert json.loads((ckpts / "step-000008" / "metadata.json").read_text())["step_skipped"] is True
    six, eight = weights(ckpts / "step-000006"), weights(ckpts / "step-000008")
    assert all(torch.equal(six[k], eight[k]) for k in six)  # steps 7 and 8 changed no weight
    assert all(torch.isfinite(t).all() for t in eight.values())


def test_too_many_skipped_steps_in_a_row_stop_the_run_in_one_line(shards, tmp_path):
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=10, interval=2, single_stage=True,
                       optimizer={"max_skipped_steps": 2})
    script = tmp_path / "poisoned.py"
    script.write_text(POISONED)
    proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                          cwd=shards, env={**os.environ, "NAN_STEPS": "3,5,6,7,8,9,10"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert error_lines(proc.stderr) == [
        f"error: steps 5-7: 3 steps in a row had a non-finite loss or gradient norm and were skipped "
        f"(optimizer.max_skipped_steps 2); the run has diverged: the newest checkpoint of a finite step is "
        f"{run}/checkpoints/step-000004: resume from it (checkpoints.resume: {run}/checkpoints/step-000004) with a "
        f"lower optimizer.learning_rate"]
    assert [r["step"] for r in metrics(run)] == list(range(1, 8))
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-000002", "step-000004",
                                                                            "step-000006"]
    # the advice works: resuming from the good checkpoint with a finite loss trains on
    train_one(small_config(tmp_path, run, dp=1, steps=10, interval=2, single_stage=True, name="resume.yaml",
                           checkpoints={"resume": str(run / "checkpoints" / "step-000004")}), cwd=shards)
