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

# Training as runtime.train does, with the steps in $NAN_STEPS made non-finite on the last pipeline stage (a
# diverging run): with NAN_KIND=loss (the default) the loss is NaN (its gradients are NaN too), with NAN_KIND=grad
# the loss stays finite and one gradient is infinite. With $SCALARS, TensorBoard is a recorder writing each scalar
# to that file (one JSON list per line).
POISONED = f"""
import json, os, sys, types
sys.path.insert(0, {str(ROOT)!r})
if os.environ.get("SCALARS"):
    class SummaryWriter:
        def __init__(self, folder):
            self.out = open(os.environ["SCALARS"], "a")
        def add_scalar(self, tag, value, step):
            self.out.write(json.dumps([tag, value, step]) + "\\n")
            self.out.flush()
        def close(self):
            self.out.close()
    sys.modules["torch.utils.tensorboard"] = types.SimpleNamespace(SummaryWriter=SummaryWriter)
import runtime.engine as engine
nan_steps = {{int(s) for s in os.environ["NAN_STEPS"].split(",")}}
kind = os.environ.get("NAN_KIND", "loss")
calls = [0]
train_step, loss, clip = engine.Engine.train_step, engine.Engine._loss, engine.clip_grad_norm_
def counted(self, *a, **k):
    calls[0] += 1
    return train_step(self, *a, **k)
def poisoned(self, logits, target):
    out = loss(self, logits, target)
    return out * float("nan") if kind == "loss" and calls[0] in nan_steps else out
def infinite_gradient(params, *a, **k):
    if kind == "grad" and calls[0] in nan_steps:
        next(p for p in params if p.grad is not None).grad.view(-1)[0] = float("inf")
    return clip(params, *a, **k)
engine.Engine.train_step, engine.Engine._loss, engine.clip_grad_norm_ = counted, poisoned, infinite_gradient
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


def test_a_finite_loss_with_an_infinite_gradient_is_skipped_and_tensorboard_gets_no_nan(shards, tmp_path):
    """Only the gradient norm is not finite: the step is skipped (no update) and logged with its finite loss,
    `grad_norm` null and `skipped` true; TensorBoard gets its loss but no grad_norm, and never a NaN or inf."""
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=4, interval=2, single_stage=True,
                       logging={"tensorboard": True})
    script = tmp_path / "poisoned.py"
    script.write_text(POISONED)
    scalars_file = tmp_path / "scalars.jsonl"
    proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                          cwd=shards, env={**os.environ, "NAN_STEPS": "3,4", "NAN_KIND": "grad",
                                           "SCALARS": str(scalars_file)})
    assert proc.returncode == 0, proc.stderr
    rows = metrics(run)
    assert [(r["step"], r["skipped"], r["grad_norm"] is None) for r in rows] == [
        (1, False, False), (2, False, False), (3, True, True), (4, True, True)]
    assert all(math.isfinite(r["loss"]) for r in rows)  # the loss was finite: kept
    assert "step      3/4 | pretrain | loss " in proc.stdout and "(skipped: not finite, no update)" in proc.stdout
    scalars = [json.loads(line) for line in scalars_file.read_text().splitlines()]
    assert all(math.isfinite(value) for _, value, _ in scalars)
    by_step = {step: {tag for tag, _, s in scalars if s == step} for step in (1, 2, 3, 4)}
    assert "grad_norm" in by_step[2] and "grad_norm" not in by_step[3] | by_step[4]
    assert "loss" in by_step[3] and "loss" in by_step[4]
    ckpts = run / "checkpoints"
    two, four = weights(ckpts / "step-000002"), weights(ckpts / "step-000004")
    assert all(torch.equal(two[k], four[k]) for k in two)  # steps 3 and 4 changed no weight


def test_skipped_steps_in_a_row_are_counted_across_a_resume(shards, tmp_path):
    """Steps 5 and 6 skipped, the run killed after step 7 (its checkpoint: step 6), step 7 non-finite again after
    the resume: 3 in a row, past max_skipped_steps 2. The count restarted at 0 on resume, so the run trained on."""
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=10, interval=2, single_stage=True,
                       optimizer={"max_skipped_steps": 2})
    script = tmp_path / "poisoned.py"
    script.write_text(POISONED)
    env = {**os.environ, "NAN_STEPS": "5,6", "NANOSET_FAULT_KILL_AT_STEP": "7"}
    killed = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                            cwd=shards, env=env)
    assert killed.returncode == -9, killed.stderr
    six = json.loads((run / "checkpoints" / "step-000006" / "metadata.json").read_text())
    assert (six["step_skipped"], six["skipped_in_a_row"]) == (True, 2)
    env = {**os.environ, "NAN_STEPS": "1"}  # the resumed run's first step: step 7
    proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                          cwd=shards, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"resumed from {run}/checkpoints/step-000006 at step 6" in proc.stdout
    assert error_lines(proc.stderr) == [
        f"error: steps 5-7: 3 steps in a row had a non-finite loss or gradient norm and were skipped "
        f"(optimizer.max_skipped_steps 2); the run has diverged: the newest checkpoint of a finite step is "
        f"{run}/checkpoints/step-000004: resume from it (checkpoints.resume: {run}/checkpoints/step-000004) with a "
        f"lower optimizer.learning_rate"]
