"""Honest validation data: ``validation.holdout`` documents never train and are their own validation set; a
validation folder that is also training data is one warning line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import yaml

from nanoset import open_dataset
from runtime.data.order.holdout import HOLDOUT_FILE, holdout_documents, holdout_lines
from runtime.data.order.permutation import FeistelPermutation
from runtime.data.order.provenance import document_steps
from runtime.startup import start_up
from tests.support.configs import small_config
from tests.support.harness import metrics, train_one


def holdout_config(tmp_path, **validation):
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, steps=4, single_stage=True, interval=10)
    d = yaml.safe_load(cfg.read_text())
    d["validation"] = {"holdout": 0.25, "samples": 4, "interval": 2, **validation}
    cfg.write_text(yaml.safe_dump(d))
    return cfg


def test_held_out_documents_are_drawn_with_the_data_seed_and_in_no_step(shards, tmp_path, monkeypatch):
    monkeypatch.chdir(shards)
    startup = start_up(holdout_config(tmp_path), lock=False)
    plan, config = startup.plan, startup.config
    held = startup.held_out
    assert list(held) == ["shards/web", "shards/code"]
    for folder, docs in held.items():
        reader = open_dataset(folder)
        k = max(1, round(0.25 * reader.num_documents))
        perm = FeistelPermutation(reader.num_documents, "holdout", config.stage_seed(config.data_stages[0]),
                                  reader.fingerprint)
        assert docs.tolist() == sorted(perm(np.arange(k)).tolist()) and len(docs) == k
        # excised from step 1 by the excision rule: no step of the run holds a token of them
        assert document_steps(plan, [(folder, int(d)) for d in docs]) == []
    # trained documents are still in steps (the check above can find documents)
    web = open_dataset("shards/web")
    others = [("shards/web", d) for d in range(web.num_documents) if d not in held["shards/web"]]
    assert document_steps(plan, others)
    # the holdout sets read the held-out documents alone, one after the other
    sets = {s.name: s for s in startup.validation_sets}
    assert list(sets) == ["web-holdout", "code-holdout"]
    (windows,) = sets["web-holdout"].windows(32)
    stream = np.concatenate([web.document(int(d)) for d in held["shards/web"]])
    assert windows.num_samples == (len(stream) - 1) // 32 > 0
    assert windows.tokens(np.array([0, windows.num_samples - 1])).tolist() == [
        stream[:33].tolist(), stream[(windows.num_samples - 1) * 32:windows.num_samples * 32 + 1].tolist()]
    # a later start of the same config holds out the same documents
    again = holdout_documents(config, plan)
    assert {f: d.tolist() for f, d in again.items()} == {f: d.tolist() for f, d in held.items()}


def test_a_holdout_run_validates_on_it_lists_it_and_warns_of_training_folders(shards, tmp_path, monkeypatch):
    cfg = holdout_config(tmp_path, datasets={"web": "shards/web", "sft": "shards/sft"})
    proc = train_one(cfg, shards)
    run = tmp_path / "run"
    monkeypatch.chdir(shards)
    held = start_up(cfg, lock=False).held_out
    text = (run / HOLDOUT_FILE).read_text()
    assert text == holdout_lines(held) and text.startswith(f"shards/web:{held['shards/web'][0]}\n")
    val = [r for r in metrics(run) if "val" in r]
    assert [r["step"] for r in val] == [2, 4]
    assert list(val[0]["val"]) == ["sft", "web", "web-holdout", "code-holdout"]
    assert all(v["tokens"] > 0 and v["sequence_length"] == 32 for r in val for v in r["val"].values())
    # runtime.evaluate on the final checkpoint: the same sets, the values the run logged at its last step
    out = subprocess.run([sys.executable, "-m", "runtime.evaluate", "--config", str(cfg), "--checkpoint",
                          str(run / "checkpoints"), "--json"], capture_output=True, text=True, cwd=shards,
                         timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    evaluated = json.loads(out.stdout)["val"]
    assert list(evaluated) == list(val[-1]["val"])
    for name, v in val[-1]["val"].items():
        assert evaluated[name]["tokens"] == v["tokens"] and abs(evaluated[name]["loss"] - v["loss"]) < 1e-5
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: validation.datasets.web: shards/web is also training data (shards/web): its loss "
                        "is not a held-out loss; validate on other data, or set validation.holdout: FRACTION to hold "
                        "documents of the training data out"]
