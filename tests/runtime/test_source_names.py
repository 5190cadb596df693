"""Source names: ``dataset_folder: {name: folder}`` names a stage's sources in the metrics rows, the console, W&B
scalars and explain; without names each is its folder's last component, made unique, never an absolute path."""

from __future__ import annotations

import yaml

from nanoset.errors import ConfigError
from runtime.config.load import load_config
from runtime.data.order.plan import DataPlan
from runtime.data.order.provenance import explain_step
from runtime.data.order.source_names import folder_names, source_names
from runtime.observe.metrics import scalars
from tests.support.configs import small_config
from tests.support.harness import error_lines, metrics, train_one


def named_config(tmp_path, folders, **kw):
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, steps=2, single_stage=True, interval=10, **kw)
    d = yaml.safe_load(cfg.read_text())
    d["data_stages"][0]["data"]["dataset"] = {"dataset_folder": folders, "dataset_weights": [0.7, 0.3]}
    cfg.write_text(yaml.safe_dump(d, sort_keys=False))
    return cfg


def test_unnamed_sources_are_their_folders_last_component_made_unique():
    assert folder_names(["/data/a/web", "/data/b/web", "shards/code/", "s3://bucket/c4", "web"]) == {
        "/data/a/web": "web", "/data/b/web": "web-2", "shards/code/": "code", "s3://bucket/c4": "c4", "web": "web-3"}
    assert folder_names(["/x/code"], taken={"code"}) == {"/x/code": "code-2"}  # past the names the config gives


def test_names_follow_the_mapping_in_rows_console_explain_and_wandb(shards, tmp_path, monkeypatch):
    cfg = named_config(tmp_path, {"webtext": "shards/web", "python": "shards/code"})
    monkeypatch.chdir(shards)
    plan = DataPlan(load_config(cfg))
    assert source_names(plan) == {"shards/web": "webtext", "shards/code": "python"}  # order kept
    assert plan.stages[0].weights_at(1) == [0.7, 0.3]  # the weights follow the mapping's order
    rows = explain_step(plan, 1)
    assert {(r["dataset"], r["source"]) for r in rows} <= {("shards/web", "webtext"), ("shards/code", "python")}
    proc = train_one(cfg, shards)
    train = [r for r in metrics(tmp_path / "run") if "loss" in r]
    assert [list(r["sources"]) for r in train] == [["webtext", "python"]] * 2
    assert [r["weights"] for r in train] == [{"webtext": 0.7, "python": 0.3}] * 2
    assert "datasets webtext: shards/web (0.7), python: shards/code (0.3)" in proc.stdout
    assert {k for k in scalars(train[0], {}) if k.startswith("mix/")} == {
        "mix/webtext", "mix/python", "mix/weight/webtext", "mix/weight/python"}


def test_a_bad_source_name_is_one_line(tmp_path):
    cfg = named_config(tmp_path, {"a/b": "shards/web", "code": "shards/code"})
    try:
        load_config(cfg)
    except ConfigError as e:
        assert str(e).endswith("data_stages[0] (pretrain).data.dataset.dataset_folder: 'a/b' is not a source name; "
                               "give a name without '/' (e.g. web)")
    else:
        raise AssertionError("a name with '/' was accepted")


def test_a_bad_source_name_stops_the_run_before_it_starts(shards, tmp_path):
    cfg = named_config(tmp_path, {"": "shards/web", "code": "shards/code"})
    proc = train_one(cfg, shards, check=False)
    assert proc.returncode == 1 and error_lines(proc.stderr) == [
        f"error: {cfg}: data_stages[0] (pretrain).data.dataset.dataset_folder: '' is not a source name; give a name "
        f"without '/' (e.g. web)"]
