"""A stage's own optimizer and schedule: its learning rate per step, counted from its first step; fresh AdamW state
with reset_state; a resume inside the stage equal to the uninterrupted run; the rules and the resume notes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import yaml

from nanoset.errors import ConfigError
from runtime.stage_optimizer import RECORD_KEY, StageOptimizers, reset_state
from tests.support import ROOT
from tests.support.configs import TWO_STAGE, build, merged, small_config
from tests.support.harness import metrics, train_one

SFT = {"optimizer": {"learning_rate": 1e-3, "weight_decay": 0.0, "reset_state": True},
       "lr_scheduler": {"warmup_steps": 2, "decay_style": "linear", "min_lr": 1e-4}}


def with_stage_keys(data: dict, boundary: int, steps: int, **keys) -> dict:
    data["tokens"]["train_steps"] = steps
    data["lr_scheduler"]["warmup_steps"] = 2
    data["data_stages"][1].update(start_training_step=boundary, **keys)
    return data


def run_lr(step: int) -> float:
    """The run's schedule of the fixture config over 10 steps: warm-up 2 to 3e-3, cosine to 3e-4 at step 10."""
    if step <= 2:
        return 3e-3 * step / 2
    return 3e-4 + 2.7e-3 * 0.5 * (1 + math.cos(math.pi * (step - 2) / 8))


def test_a_stage_schedule_counts_from_its_first_step_and_the_rest_is_the_run_s():
    config = build(with_stage_keys(merged(TWO_STAGE), 7, 10, **SFT))
    lrs = [StageOptimizers(config).lr_at(s) for s in range(1, 11)]
    # warm-up over its steps 7-8 to its own peak, then linear to its min_lr at its last step (10)
    assert lrs[6:] == pytest.approx([5e-4, 1e-3, 5.5e-4, 1e-4], rel=1e-12, abs=0)
    assert lrs[:6] == pytest.approx([run_lr(s) for s in range(1, 7)], rel=1e-12, abs=0)
    stage = StageOptimizers(config).at(9).optimizer
    # the keys the stage does not give are the top level's
    assert (stage.learning_rate, stage.weight_decay, stage.adam_beta2, stage.clip_grad) == (1e-3, 0.0, 0.95, 1.0)


def test_a_stage_with_only_other_keys_keeps_the_run_s_schedule():
    config = build(with_stage_keys(merged(TWO_STAGE), 7, 10, optimizer={"weight_decay": 0.0}))
    optimizers = StageOptimizers(config)
    assert [optimizers.lr_at(s) for s in range(1, 11)] == [run_lr(s) for s in range(1, 11)]
    assert optimizers.describe() == [
        "optimizer: stage 'anneal' (steps 7-10): the run's schedule; weight_decay 0, betas (0.9, 0.95), eps 1e-08, "
        "clip_grad 1"]


def test_reset_state_gives_the_update_of_a_fresh_optimizer():
    """Three updates, then the stage's first step resets: its update equals a new AdamW's on the same weights."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(4, 3))
    config = build(with_stage_keys(merged(TWO_STAGE), 7, 10, **SFT))
    optimizers = StageOptimizers(config)
    used = torch.optim.AdamW([{"params": [weight], "weight_decay": 0.1, "decayed": True}], lr=1e-3, fused=True)
    engine = SimpleNamespace(optimizer=used, clip_grad=None)
    for step in range(4, 7):
        optimizers.apply(engine, step)
        weight.grad = torch.randn(4, 3)
        used.step()
    fresh_weight = torch.nn.Parameter(weight.detach().clone())
    fresh = torch.optim.AdamW([fresh_weight], lr=5e-4, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    assert optimizers.apply(engine, 7) == 5e-4 and engine.clip_grad == 1.0
    grad = torch.randn(4, 3)
    weight.grad, fresh_weight.grad = grad.clone(), grad.clone()
    used.step()
    fresh.step()
    assert torch.equal(weight, fresh_weight)
    assert float(used.state[weight]["step"]) == 1.0


def test_reset_state_zeroes_every_moment_in_place():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p], fused=True)
    p.grad = torch.ones(2)
    opt.step()
    exp_avg = opt.state[p]["exp_avg"]
    reset_state(opt)
    assert exp_avg is opt.state[p]["exp_avg"] and exp_avg.tolist() == [0.0, 0.0]
    assert float(opt.state[p]["step"]) == 0.0 and opt.state[p]["exp_avg_sq"].tolist() == [0.0, 0.0]


@pytest.mark.parametrize(("keys", "error"), [
    ({"lr_scheduler": {"warmup_steps": 5}}, "data_stages[1] (anneal): warmup_steps 5 > the stage's 4 steps"),
    ({"optimizer": {"learning_rate": 1e-4}}, "data_stages[1] (anneal): min_lr 0.0003 > learning_rate 0.0001"),
    ({"optimizer": {"adam_beta2": 1.0}}, "data_stages[1] (anneal).optimizer.adam_beta2: must be in [0, 1), got 1.0"),
])
def test_a_stage_s_keys_are_checked_before_start_up(keys, error):
    with pytest.raises(ConfigError) as e:
        build(with_stage_keys(merged(TWO_STAGE), 7, 10, **keys))
    assert str(e.value).startswith(error), str(e.value)


def test_a_resume_with_other_stage_values_says_so():
    config = build(with_stage_keys(merged(TWO_STAGE), 7, 10, **SFT))
    recorded = StageOptimizers(config).record()
    changed = build(with_stage_keys(merged(TWO_STAGE), 7, 10, optimizer={**SFT["optimizer"], "learning_rate": 2e-3},
                                    lr_scheduler=SFT["lr_scheduler"]))
    assert StageOptimizers(changed).changed_since(recorded, 8) == [
        "stage 'anneal': its optimizer or schedule differs from the checkpoint's (learning_rate, peak_lr): steps "
        "9-10 follow the config"]
    assert StageOptimizers(changed).changed_since(recorded, 6) == []  # not begun: nothing to say
    assert StageOptimizers(config).changed_since(recorded, 8) == []


def stage_run(folder, run, shards, env=None, check=True):
    folder.mkdir(exist_ok=True)
    cfg = small_config(folder, run, dp=1, steps=10, boundary=7, interval=3)
    data = yaml.safe_load(cfg.read_text())
    data["data_stages"][1].update(SFT)
    cfg.write_text(yaml.safe_dump(data))
    return train_one(cfg, shards, env=env, check=check)


def test_a_resume_inside_the_stage_equals_the_uninterrupted_run(shards, tmp_path):
    """Checkpoints at 3, 6 and 9; the stage (own schedule, reset_state) starts at 7. Killed after step 10's
    training, the run resumes from step 9, inside the stage: the same losses and learning rates."""
    stage_run(tmp_path / "a", tmp_path / "a" / "run", shards)
    whole = metrics(tmp_path / "a" / "run")
    assert [r["lr"] for r in whole] == pytest.approx([run_lr(s) for s in range(1, 7)] + [5e-4, 1e-3, 5.5e-4, 1e-4],
                                                     rel=1e-12, abs=0)
    run = tmp_path / "b" / "run"
    killed = stage_run(tmp_path / "b", run, shards, env={"NANOSET_FAULT_KILL_AT_STEP": "10"}, check=False)
    assert killed.returncode != 0
    record = yaml.safe_load((run / "checkpoints" / "step-000009" / "metadata.json").read_text())
    assert record["extensions"][RECORD_KEY]["anneal"]["schedule"]["first_step"] == 7
    assert record["extensions"][RECORD_KEY]["anneal"]["reset_state"] is True
    stage_run(tmp_path / "b", run, shards)
    resumed = metrics(run)
    assert [(r["step"], r["loss"], r["lr"]) for r in resumed] == [(r["step"], r["loss"], r["lr"]) for r in whole]


def test_check_shows_the_stage_s_optimizer(shards, tmp_path):
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, steps=10, boundary=7)
    data = yaml.safe_load(cfg.read_text())
    data["data_stages"][1].update(SFT)
    cfg.write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "nanoset.cli", "train", "--config", str(cfg), "--check"], cwd=shards,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ("optimizer: stage 'anneal' (steps 7-10): lr 0.001 (warm-up 2, linear to 0.0001); weight_decay 0, betas "
            "(0.9, 0.95), eps 1e-08, clip_grad 1; optimizer state reset at its first step") in proc.stdout.splitlines()
