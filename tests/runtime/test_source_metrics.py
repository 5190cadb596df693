"""Per-source metrics: every training row's ``sources`` agree with the step's loss and label tokens and with
``explain``, are the same in every layout, survive a resume with another dp size, and reach TensorBoard."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import yaml

from runtime.cli.explain import explain_step
from runtime.config.load import load_config
from runtime.data import DataPlan
from runtime.data.order.provenance import document_steps
from runtime.observe.metrics import MetricsLogger, short_names, source_metrics
from tests.support.configs import make_config, small_config
from tests.support.harness import metrics, torchrun, train_one

SCHEDULE = [{"step": 1, "weights": [0.9, 0.1]}, {"step": 4, "weights": [0.2, 0.8]}]
LAYOUTS = {"dp1-accum4": ({"dp": 1}, 4, 1), "dp2-accum2": ({"dp": 2}, 2, 2), "tp2": ({"dp": 1, "tp": 2}, 4, 2),
           "cp2": ({"dp": 1, "cp": 2}, 4, 2), "pp2": ({"dp": 1, "pp": 2, "pp_engine": "1f1b"}, 4, 2)}


def layout_config(folder, run, name, **kw):
    """Six steps of G = 4 (micro-batches of one sample): a scheduled web+code stage (steps 1-4), then sft."""
    parallelism, accum, _ = LAYOUTS[name]
    cfg = small_config(folder, run, dp=parallelism["dp"], accum=accum, steps=6, boundary=5, interval=3,
                       name=f"{name}.yaml", tokens={"micro_batch_size": 1}, parallelism=parallelism, **kw)
    data = load_config(cfg).to_dict()
    data["data_stages"][0]["data"]["dataset"]["dataset_weights"] = SCHEDULE
    cfg.write_text(yaml.safe_dump(data))
    return cfg


@pytest.fixture(scope="module")
def runs(shards, tmp_path_factory):
    """The same run uninterrupted as dp=1 × accum 4, dp=2 × accum 2, tp=2 (tp rank 0 reads and broadcasts the
    source ids too) and cp=2 (each cp rank sums its part of the sequences; the rows count once), and as pp=2
    killed after step 4 (its checkpoint: step 3) then resumed as dp=2 × 2."""
    root = tmp_path_factory.mktemp("sources")
    out = {}
    for name in ("dp1-accum4", "dp2-accum2", "tp2", "cp2"):
        cfg = layout_config(root, root / name, name)
        if LAYOUTS[name][2] == 1:
            train_one(cfg, cwd=shards)  # a world of one needs no launcher
        else:
            torchrun(cfg, LAYOUTS[name][2], cwd=shards)
        out[name] = metrics(root / name)
    cfg = layout_config(root, root / "pp2", "pp2")
    killed = torchrun(cfg, 2, cwd=shards, env={"NANOSET_FAULT_KILL_AT_STEP": "4"}, check=False)
    assert killed.returncode != 0
    resumed = torchrun(layout_config(root, root / "pp2", "dp2-accum2"), 2, cwd=shards)
    assert "resumed from" in resumed.stdout and "at step 3" in resumed.stdout
    out["pp2, then dp2"] = metrics(root / "pp2")
    here = os.getcwd()
    try:  # the configs' folders are relative to the shards' parent
        os.chdir(shards)
        out["plan"] = DataPlan(load_config(cfg))
    finally:
        os.chdir(here)
    return out


def test_sources_add_up_to_the_step_and_equal_explain(runs, shards, monkeypatch):
    monkeypatch.chdir(shards)
    plan = runs["plan"]
    for row in runs["dp1-accum4"]:
        sources = row["sources"]
        stage = plan.stage_for_step(row["step"])
        assert list(sources) == [plan.datasets[d].folder.split("/")[-1] for d in stage.dataset_ids]  # web, code
        explained = explain_step(plan, row["step"])
        for name, s in sources.items():
            mine = [r for r in explained if r["source"] == name]
            assert s["samples"] == len(mine) and s["label_tokens"] == sum(r["loss_tokens"] for r in mine)
            assert (s["loss"] is None) == (s["label_tokens"] == 0)
        assert sum(s["samples"] for s in sources.values()) == 4
        assert sum(s["label_tokens"] for s in sources.values()) == row["label_tokens"]
        weighted = sum(s["loss"] * s["label_tokens"] for s in sources.values() if s["loss"] is not None)
        assert weighted / row["label_tokens"] == pytest.approx(row["loss"], rel=1e-6)  # float32 sums vs float64
    mix = [row["sources"]["web"]["samples"] for row in runs["dp1-accum4"][:4]]
    assert mix == [4, 2, 2, 1]  # the schedule: web 0.9 → 0.2 over steps 1-4 (cumulative 3.6, 6.27, 8.0, 8.8)


@pytest.mark.parametrize("name", ["dp2-accum2", "tp2", "cp2", "pp2, then dp2"])
def test_sources_are_the_same_in_every_layout_and_after_a_resume_with_another_dp(runs, name):
    reference, rows = runs["dp1-accum4"], runs[name]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert [r["data_hash"] for r in rows] == [r["data_hash"] for r in reference]
    for row, ref in zip(rows, reference):
        assert list(row["sources"]) == list(ref["sources"])
        for folder, s in row["sources"].items():
            r = ref["sources"][folder]
            assert (s["samples"], s["label_tokens"]) == (r["samples"], r["label_tokens"])
            assert s["loss"] == (None if r["loss"] is None else pytest.approx(r["loss"], abs=1e-4))


def test_source_metrics_are_strict_json():
    row = source_metrics(["a", "b", "c"], [(3, 90, 180.0), (1, 0, 0.0), (2, 10, math.nan)])
    assert row == {"a": {"samples": 3, "label_tokens": 90, "loss": 2.0}, "b": {"samples": 1, "label_tokens": 0,
                                                                            "loss": None},
                   "c": {"samples": 2, "label_tokens": 10, "loss": None}}
    assert json.loads(json.dumps(row, allow_nan=False)) == row


def test_short_names_are_unique_in_the_run():
    names = short_names({"shards/web": "shards/web", "/data/a/web": "/data/a/web", "/data/b/web": "/data/b/web",
                         "code": "code", "/x/code": "/x/code", "cache/chat-1": "/hf/chat.jsonl",
                         "cache/chat-2": "/hf/chat.jsonl"})
    assert names == {"shards/web": "shards/web", "/data/a/web": "a/web", "/data/b/web": "b/web", "code": "code",
                     "/x/code": "x/code", "cache/chat-1": "chat.jsonl", "cache/chat-2": "chat.jsonl-2"}


class Board:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))


def test_tensorboard_gets_loss_and_mix_per_source(tmp_path):
    logger = MetricsLogger(tmp_path, True, tensorboard=False)
    logger.tb = Board()
    logger.source_names = {"shards/web": "web", "shards/code": "code"}
    sources = source_metrics(["shards/web", "shards/code"], [(3, 30, 60.0), (1, 0, 0.0)])
    logger.log({"step": 7, "stage": "s", "loss": 2.0, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1.0,
                "data_wait_ms": 0.0, "sources": sources})
    per_source = [s for s in logger.tb.scalars if "/" in s[0]]
    assert per_source == [("loss/web", 2.0, 7), ("mix/web", 0.75, 7), ("samples/web", 3, 7),
                          ("label_tokens/web", 30, 7), ("mix/code", 0.25, 7), ("samples/code", 1, 7),
                          ("label_tokens/code", 0, 7)]
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["sources"]["shards/code"]["loss"] is None


def test_a_hugging_face_stage_is_keyed_like_explain_and_named_by_its_source(shards, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    from runtime.data.hf_datasets import resolve_stage_folders
    from tests.support import TOKENIZER

    monkeypatch.chdir(shards)
    datasets.Dataset.from_dict({"text": [f"row {i} of the set" for i in range(64)]}).save_to_disk(str(tmp_path / "qa"))
    stages = [{"name": "mix", "start_training_step": 1, "data": {"dataset": {"dataset_folder": ["shards/web"]}}},
              {"name": "hf", "start_training_step": 3, "data": {"dataset": {
                  "hf_dataset_or_datasets": str(tmp_path / "qa")}}}]
    c = make_config(train_steps=4, seq=16, stages=stages, tokenizer={"tokenizer_name_or_path": str(TOKENIZER)})
    c.general.cache_dir = str(tmp_path / "cache")
    plan = DataPlan(c, resolve_stage_folders(c))
    first = explain_step(plan, 3)[0]
    cached = first["dataset"]
    assert cached.startswith(str(tmp_path / "cache" / "qa-"))
    assert plan.source_names() == {"shards/web": "shards/web", cached: str(tmp_path / "qa")}
    assert short_names(plan.source_names()) == {"shards/web": "web", cached: "qa"}
    # --document takes the source too: its tokenized copy is what the run read
    hits = document_steps(plan, [(str(tmp_path / "qa"), first["documents"][0])])
    assert {(h["step"], h["position"], h["dataset"]) for h in hits} >= {(3, 0, cached)}


def test_a_source_id_outside_the_stage_is_a_clear_error():
    from runtime.engine import Engine

    engine = Engine.__new__(Engine)  # _sources reads nothing of the engine but the device copy
    engine.device = torch.device("cpu")
    batch = {"source_ids": torch.tensor([0, 2])}
    with pytest.raises(ValueError, match=r"batch key 'source_ids' holds \[0, 2\]; each row's source must index the "
                                         r"stage's 2 datasets"):
        engine._sources([batch], 2)
    assert engine._sources([{"label_ids": torch.zeros(2)}], 2) is None  # a custom loader without source ids
    assert engine._sources([batch], 3).tolist() == [0, 2]


ZERO_AT_STEP_2 = [{"step": 1, "weights": [1, 2, 2]}, {"step": 2, "weights": [1, 2, 0]}]
ZERO_AT_STEP_5 = [{"step": 1, "weights": [1, 2, 2]}, {"step": 4, "weights": [1, 2, 2]},
                  {"step": 5, "weights": [1, 2, 0]}]


def zero_weight_config(folder, weights, steps):
    """One stage of web, code and sft on ``weights``, G = 4 (dp 1, micro-batches of 2, 2 a step)."""
    cfg = small_config(folder, folder / "run", dp=1, accum=2, steps=steps, single_stage=True,
                       name=f"zero-{steps}.yaml")
    data = yaml.safe_load(cfg.read_text())
    data["data_stages"][0]["data"]["dataset"] = {"dataset_folder": ["shards/web", "shards/code", "shards/sft"],
                                                 "dataset_weights": weights}
    cfg.write_text(yaml.safe_dump(data))
    return cfg


def explained_folders(cfg, steps, cwd):
    proc = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(cfg), "--steps", steps, "--json"],
                          capture_output=True, text=True, check=True, cwd=cwd)
    out = {}
    for row in json.loads(proc.stdout):
        out.setdefault(row["step"], []).append(row["dataset"])
    return out


def test_a_dataset_at_weight_zero_is_in_no_sample_and_no_source_of_its_steps(shards, tmp_path):
    """Three datasets whose third is at weight 0 from step 2 (then from step 5): `explain` lists it at step 1
    only (steps 1-4 only), and the run's metrics.jsonl gives it no sample from step 2 on."""
    cfg = zero_weight_config(tmp_path, ZERO_AT_STEP_2, 4)
    folders = explained_folders(cfg, "1:4", shards)
    assert [folders[s].count("shards/sft") for s in range(1, 5)] == [1, 0, 0, 0]
    assert [len(folders[s]) for s in range(1, 5)] == [4] * 4
    train_one(cfg, cwd=shards)
    rows = metrics(tmp_path / "run")
    assert [r["sources"]["sft"]["samples"] for r in rows] == [1, 0, 0, 0]
    assert [sum(s["samples"] for s in r["sources"].values()) for r in rows] == [4] * 4
    later = explained_folders(zero_weight_config(tmp_path, ZERO_AT_STEP_5, 10), "1:10", shards)
    assert [later[s].count("shards/sft") for s in range(1, 11)] == [1, 2, 2, 1, 0, 0, 0, 0, 0, 0]
