"""Spikes and their suspects: the window rule, the config's checks, and whole runs in which a weight schedule brings
random text into a stage trained on one repeated document — the spike is logged with the random samples first
(also after a resume), ``action: skip`` leaves its update out and trains on, and ``explain --suspects`` gives the
same samples from the log and recomputed from the checkpoint before, ending with the excision command."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from runtime.config import ConfigError
from runtime.config.schema import SpikeArgs
from runtime.observe.spikes import SpikeDetector
from tests.runtime.test_nonfinite_steps import weights
from tests.support import ROOT
from tests.support.configs import TINY, build, merged
from tests.support.datasets import write_datatrove
from tests.support.harness import error_lines, metrics, train_one


def test_a_step_is_judged_against_a_full_window_that_its_own_loss_enters():
    d = SpikeDetector(SpikeArgs(zscore=2.0, window=3))
    assert [d.judge("a", x) for x in (1.0, 2.0, 3.0)] == [None, None, None]  # the window fills first
    assert d.judge("a", 4.0) == pytest.approx(2.0 / math.sqrt(2 / 3))  # mean 2, std √(2/3): z 2.449
    assert d.last[1:] == pytest.approx((2.0, math.sqrt(2 / 3)))
    assert d.judge("a", 4.5) is None  # [2, 3, 4]: z 1.84
    assert d.judge("a", 10.0) == pytest.approx((10 - 23 / 6) / np.std([3, 4, 4.5]))  # a new level: a spike ...
    assert d.judge("a", 10.0) is None  # ... once: [4, 4.5, 10] holds it (z 1.41)
    assert d.state_dict() == {"stage": "a", "losses": [4.5, 10.0, 10.0]}


def test_a_flat_window_flags_nothing_and_a_new_stage_starts_a_new_window():
    d = SpikeDetector(SpikeArgs(zscore=1.0, window=2))
    assert [d.judge("a", x) for x in (1.0, 1.0, 5.0)] == [None, None, None]  # std 0
    assert d.judge("b", 100.0) is None and d.state_dict() == {"stage": "b", "losses": [100.0]}
    again = SpikeDetector(SpikeArgs(zscore=1.0, window=2))
    again.load_state_dict({"stage": "b", "losses": [100.0, 101.0]})
    assert again.judge("b", 103.0) == pytest.approx(5.0)  # mean 100.5, std 0.5: resumed as if never stopped


def test_the_threshold_is_known_before_the_step_and_judging_agrees_with_it():
    d = SpikeDetector(SpikeArgs(zscore=1.0, window=2, action="skip"))
    assert d.threshold("a") is None and d.skips
    assert [d.judge("a", x) for x in (1.0, 2.0)] == [None, None]
    assert d.threshold("a") == 2.0  # mean 1.5 + 1 · std 0.5: what the engine compares the next loss with
    assert d.judge("a", 2.0) is None  # not above it
    assert d.threshold("a") is None  # [2, 2] is flat
    assert d.judge("a", 5.0) is None and d.threshold("a") == 5.0  # [2, 5]: 3.5 + 1.5
    assert d.judge("a", 5.5) == pytest.approx(4 / 3) and d.last[1:] == (3.5, 1.5)
    d.forget_verdict()
    assert d.last is None and d.threshold("b") is None and d.state_dict() == {"stage": "b", "losses": []}


@pytest.mark.parametrize("spike, message", [
    ({"zscore": 0}, "surgery.spike.zscore: must be > 0, got 0.0"),
    ({"zscore": float("nan")}, "surgery.spike.zscore: must be > 0, got nan"),
    ({"window": 1}, "surgery.spike.window: must be ≥ 2, got 1"),
    ({"window": 2.5}, "surgery.spike.window: expected an integer, got 2.5"),
    ({"action": "drop"}, "surgery.spike.action: 'drop' is not one of ['log', 'skip']"),
    ({"z": 3}, "surgery.spike.z: unknown key; valid keys: zscore, window, action"),
])
def test_bad_spike_settings_are_one_line_each(spike, message):
    with pytest.raises(ConfigError) as e:
        build(merged(TINY, surgery={"spike": spike}))
    assert str(e.value) == message


def test_a_window_no_stage_can_fill_is_one_line():
    """TINY trains 3 steps in one stage: a window of 3 is never full before a step, so nothing would be judged."""
    with pytest.raises(ConfigError) as e:
        build(merged(TINY, surgery={"spike": {"window": 3}}))
    assert str(e.value) == ("surgery.spike.window: 3, but the longest stage has 3 steps, so no step would be judged "
                            "(a step is judged once the window is full); give a window below 3")
    assert build(merged(TINY, surgery={"spike": {"window": 2}})).surgery.spike.window == 2  # step 3 is judged


def spike_config(root, action: str, **checkpoints) -> str:
    """16 steps of G = 4 on one document repeated; the schedule brings in random text at step 13 (half of the
    batch from then on). The window of 4 and z-score of 3 are small enough for 12 steps of a tiny model."""
    d = merged(TINY, general={"project": "t", "run": action, "seed": 7, "run_dir": str(root / f"run-{action}")},
               tokens={"sequence_length": 16, "micro_batch_size": 2, "batch_accumulation_per_replica": 2,
                       "train_steps": 16},
               checkpoints={"checkpoint_interval": 12, **checkpoints}, logging={"tensorboard": False},
               data_stages=[{"name": "easy", "start_training_step": 1, "data": {"num_loading_workers": 0, "dataset": {
                   "dataset_folder": [str(root / "easy"), str(root / "random")],
                   "dataset_weights": [{"step": 1, "weights": [1, 0]}, {"step": 12, "weights": [1, 0]},
                                       {"step": 13, "weights": [0.5, 0.5]}]}}}],
               surgery={"spike": {"zscore": 3.0, "window": 4, "action": action}})
    path = root / f"{action}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


@pytest.fixture(scope="module")
def spiked(tmp_path_factory):
    """The log run killed after step 13 (its checkpoint: step 12) and resumed; the skip run, a checkpoint a step."""
    root = tmp_path_factory.mktemp("spikes")
    write_datatrove(root / "easy", [[list(range(10, 42)) + [0] for _ in range(60)]])
    rng = np.random.default_rng(0)
    write_datatrove(root / "random", [[rng.integers(1, 128, 40).tolist() + [0] for _ in range(60)]])
    log = spike_config(root, "log")
    killed = train_one(log, cwd=root, env={"NANOSET_FAULT_KILL_AT_STEP": "13"}, check=False)
    assert killed.returncode != 0 and "spike at step 13" in killed.stdout
    resumed = train_one(log, cwd=root)
    assert "resumed from" in resumed.stdout and "at step 12" in resumed.stdout
    skip = spike_config(root, "skip", checkpoint_interval=1, keep_last=20)
    return {"root": root, "log": log, "resumed": resumed, "skip": skip, "skipped": train_one(skip, cwd=root)}


def test_the_spike_is_logged_with_the_random_samples_first_also_after_a_resume(spiked):
    root = spiked["root"]
    rows = (root / "run-log" / "spikes.jsonl").read_text().splitlines()
    assert len(rows) == 1  # the killed run's row of step 13 was replaced by the resumed run's
    row = json.loads(rows[0])
    assert (row["step"], row["stage"]) == (13, "easy") and row["z"] > 3
    assert [s["dataset"] for s in row["samples"]] == [str(root / "random")] * 2 + [str(root / "easy")] * 2
    assert sorted(s["position"] for s in row["samples"]) == [0, 1, 2, 3]
    assert [s["label_tokens"] for s in row["samples"]] == [16] * 4
    losses = [s["loss"] for s in row["samples"]]
    assert losses == sorted(losses, reverse=True) and losses[1] > 4 > 3.5 > losses[2]  # ln 128 = 4.85: unlearnt
    assert sum(losses) / 4 == pytest.approx(row["loss"], rel=1e-6)  # equal label tokens: the mean of the means
    steps = metrics(root / "run-log")
    assert row["loss"] == steps[12]["loss"] and steps[12]["spike_z"] == row["z"]
    assert [r["step"] for r in steps if "spike_z" in r] == [13]  # a lasting change of level is one spike
    assert [r["skipped"] for r in steps] == [False] * 16
    line = ("spike at step 13 ('easy'): loss {:.4f} is {:.1f} standard deviations above the mean".format(row["loss"],
                                                                                                         row["z"]))
    assert line in spiked["resumed"].stdout and "; logged; its samples: spikes.jsonl" in spiked["resumed"].stdout
    lines = spiked["resumed"].stdout.splitlines()
    at = next(i for i, text in enumerate(lines) if text.startswith("step     13/16 | easy | loss"))
    assert lines[at + 1].startswith(line)  # the spike's line follows its step's


def test_action_skip_leaves_the_spikes_update_out_and_trains_on(spiked):
    root = spiked["root"]
    steps = metrics(root / "run-skip")
    assert [r["skipped"] for r in steps] == [False] * 12 + ["spike"] + [False] * 3
    assert "(skipped: a spike, no update)" in spiked["skipped"].stdout
    assert "update skipped (surgery.spike.action: skip)" in spiked["skipped"].stdout
    assert "done: step 16/16" in spiked["skipped"].stdout
    ckpts = root / "run-skip" / "checkpoints"
    w12, w13, w14 = (weights(ckpts / f"step-0000{s}") for s in (12, 13, 14))
    assert all(torch.equal(w12[k], w13[k]) for k in w12)  # step 13 changed no weight
    assert any(not torch.equal(w13[k], w14[k]) for k in w13)  # step 14 trained
    assert [json.loads(r)["step"] for r in (root / "run-skip" / "spikes.jsonl").read_text().splitlines()] == [13]


def explain(root, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoset.cli", "explain", *map(str, args)], capture_output=True,
                          text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)


def test_suspects_from_the_log_and_recomputed_from_the_checkpoint_agree(spiked):
    root, log = spiked["root"], spiked["log"]
    logged = explain(root, "--config", log, "--suspects", 13, "--json")
    ckpt = root / "run-log" / "checkpoints" / "step-000012"
    recomputed = explain(root, "--config", log, "--suspects", 13, "--json", "--checkpoint", ckpt)
    assert logged.returncode == recomputed.returncode == 0, logged.stderr + recomputed.stderr
    a, b = json.loads(logged.stdout), json.loads(recomputed.stdout)
    row = json.loads((root / "run-log" / "spikes.jsonl").read_text())
    assert a == row["samples"]
    key = ("position", "dataset", "sample", "documents", "label_tokens")
    assert [[s[k] for k in key] for s in a] == [[s[k] for k in key] for s in b]
    # the same float32 forward (with and without autograd), summed in float64
    assert [s["loss"] for s in b] == pytest.approx([s["loss"] for s in a], rel=1e-5)
    text = explain(root, "--config", log, "--suspects", 13)
    assert text.returncode == 0, text.stderr
    out = text.stdout.splitlines()
    excise = root / "run-log" / "suspects-step-13.txt"
    assert out[-1] == f"  nanoset train --config {log} --rewind-to 12 --exclude-documents {excise}"
    expected = [f"{root / 'random'}:{d}" for s in a[:2] for d in s["documents"]]
    assert excise.read_text().splitlines() == list(dict.fromkeys(expected))  # the two above the step's loss
    assert out[0].startswith(f"step 13 ('easy'): loss {row['loss']:.4f}, z {row['z']:.1f}; 4 samples")
    top1 = explain(root, "--config", log, "--suspects", 13, "--top", 1)
    assert top1.returncode == 0 and excise.read_text().splitlines() == [f"{root / 'random'}:{d}"
                                                                       for d in a[0]["documents"]]


def test_suspects_of_a_step_not_logged_or_from_the_wrong_checkpoint_are_one_line(spiked):
    root, log = spiked["root"], spiked["log"]
    run = root / "run-log"
    cases = [
        (("--suspects", 14), f"error: --suspects 14: {run}/spikes.jsonl has no row of step 14 (steps logged: 13); "
                             f"recompute them with --checkpoint, the checkpoint of step 13"),
        (("--suspects", 14, "--checkpoint", run / "checkpoints" / "step-000012"),
         f"error: --checkpoint {run}/checkpoints/step-000012 is of step 12; --suspects 14 recomputes from the "
         f"checkpoint of step 13 (the weights step 14 trained from)"),
        (("--suspects", 17), "error: --suspects 17: outside [1, tokens.train_steps=16]"),
        (("--suspects", 13, "--top", 0), "error: --top 0: give a number of samples ≥ 1"),
    ]
    for args, line in cases:
        proc = explain(root, "--config", log, *args)
        assert proc.returncode == 1 and error_lines(proc.stderr) == [line] and "Traceback" not in proc.stderr, args


def test_the_suggested_commands_run_as_printed_on_the_same_config_and_rewind_to_a_checkpoint_that_exists(
        tmp_path, capsys):
    """A spike's line and --suspects' rewind name the config file and every --set (not checkpoints.resume: each
    command chooses its own checkpoint), quoted for the shell; the rewind goes to the latest checkpoint before the
    step (5, where the run has checkpoints 5 and 10 and the suspects are of step 8), or there is none to go to."""
    from runtime.cli.suspects import print_suspects
    from runtime.config.load import load_config

    path = tmp_path / "my run.yaml"
    path.write_text(yaml.safe_dump(merged(TINY, general={"run_dir": str(tmp_path / "run")})))
    config = load_config(path, ["tokens.train_steps=12", "checkpoints.resume=latest", "general.seed=3"])
    sets = "--set tokens.train_steps=12 --set general.seed=3"
    detector = SpikeDetector(SpikeArgs(zscore=1.0, window=2), config)
    detector.last = (4.0, 1.0, 0.5)
    assert detector.describe(8, "s", 3.0).endswith(f"nanoset explain --config '{path}' {sets} --suspects 8")
    row = {"step": 8, "stage": "s", "loss": 2.0, "z": 4.0, "samples": [
        {"loss": 3.0, "label_tokens": 16, "dataset": "shards/web", "sample": 3, "documents": [7]},
        {"loss": 1.0, "label_tokens": 16, "dataset": "shards/web", "sample": 4, "documents": [9]}]}
    assert print_suspects(config, row, "spikes.jsonl", None, False) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        f"{tmp_path}/run/checkpoints has no checkpoint before step 8 to rewind to: exclude them from step 1 in a new "
        f"run (surgery.exclude_documents_file)")
    for step in (5, 10):
        saved = tmp_path / "run" / "checkpoints" / f"step-{step:06d}"
        saved.mkdir(parents=True)
        (saved / "metadata.json").write_text("{}")
    (tmp_path / "run" / "checkpoints" / "step-000007").mkdir()  # incomplete: no metadata.json
    assert print_suspects(config, row, "spikes.jsonl", None, False) == 0
    out = capsys.readouterr().out.splitlines()
    excise = tmp_path / "run" / "suspects-step-8.txt"
    assert out[-2].endswith("to excise them from step 6 on (the latest checkpoint before step 8 is of step 5):")
    assert out[-1] == f"  nanoset train --config '{path}' {sets} --rewind-to 5 --exclude-documents {excise}"
    assert excise.read_text() == "shards/web:7\n"
