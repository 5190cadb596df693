"""A checkpoint written in the version-1 format (``data_fixtures/checkpoint-v1``, made by
``tools/make_checkpoint_fixture.py`` before the record had a version) resumes, exports and explains as it did."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.support import FIXTURES, ROOT, TOKENIZER
from tests.support.harness import metrics, train_one

FIXTURE = FIXTURES / "checkpoint-v1"
RECORDED = json.loads((FIXTURE / "fixture.json").read_text())


@pytest.fixture()
def v1_run(shards, tmp_path) -> tuple[Path, Path]:
    """The fixture checkpoint as the checkpoints folder of a run in ``tmp_path/run`` (``latest`` naming it), its
    record moved to this session's copy of the data (the same tokens: the same content fingerprints); the config."""
    old = RECORDED["data_root"]
    checkpoints = tmp_path / "run" / "checkpoints"
    shutil.copytree(FIXTURE / RECORDED["checkpoint"], checkpoints / RECORDED["checkpoint"])
    (checkpoints / "latest").write_text(RECORDED["checkpoint"] + "\n")
    meta = checkpoints / RECORDED["checkpoint"] / "metadata.json"
    text = meta.read_text().replace(f"{old}/tokenizer/", f"{TOKENIZER}/").replace(f"{old}/shards/", f"{shards}/shards/")
    meta.write_text(text)
    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    config["general"]["run_dir"] = str(tmp_path / "run")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, checkpoints / RECORDED["checkpoint"]


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


def test_a_version_1_checkpoint_resumes_and_trains_on_to_the_uninterrupted_losses(v1_run, shards):
    config, checkpoint = v1_run
    proc = train_one(config, cwd=shards)
    assert f"resumed from {checkpoint} at step 3" in proc.stdout
    rows = metrics(config.parent / "run")
    assert [r["step"] for r in rows] == [4, 5, 6] and [r["stage"] for r in rows] == ["pretrain", "anneal", "anneal"]
    expected = RECORDED["losses"][3:]
    if torch.__version__ == RECORDED["torch"]:  # the build that made the fixture: CPU float32 arithmetic repeats
        assert [r["loss"] for r in rows] == expected
    else:  # another build may order float32 reductions differently: ~1e-7 relative per op over 3 AdamW steps
        assert [r["loss"] for r in rows] == pytest.approx(expected, abs=1e-4)


def test_a_version_1_checkpoint_exports_and_explains(v1_run, shards, tmp_path):
    config, checkpoint = v1_run
    out = tmp_path / "hf"
    proc = _python("-m", "runtime.export", str(checkpoint.parent), str(out), cwd=shards)
    assert proc.returncode == 0, proc.stderr
    hf = json.loads((out / "config.json").read_text())
    assert (hf["hidden_size"], hf["num_hidden_layers"], hf["tie_word_embeddings"], hf["eos_token_id"]) == (16, 2, True,
                                                                                                          0)
    assert json.loads((out / "nanoset_export.json").read_text())["step"] == 3
    assert (out / "tokenizer.json").read_bytes() == (TOKENIZER / "tokenizer.json").read_bytes()
    resumed = _python("-m", "runtime.explain", "--config", str(config), "--checkpoint", str(checkpoint), "--step", "4",
                      "--json", cwd=shards)
    fresh = _python("-m", "runtime.explain", "--config", str(config), "--step", "4", "--json", cwd=shards)
    assert resumed.returncode == 0 and fresh.returncode == 0, resumed.stderr + fresh.stderr
    rows = json.loads(resumed.stdout)
    assert rows == json.loads(fresh.stdout)  # the record's past is the config's
    assert [(Path(r["dataset"]).name, r["sample"], r["epoch"]) for r in rows] == [
        ("web", 4412, 0), ("web", 7228, 0), ("web", 995, 0), ("code", 3727, 0)]
