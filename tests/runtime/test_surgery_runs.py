"""Data surgery in training: skipped steps update nothing, a resume with surgery is exact, and ``nanoset train
--rewind-to`` rewinds, records, trains on and does not rewind twice."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from nanoset import open_dataset
from runtime.checkpoint.record import read_metadata
from runtime.cli.explain import explain_step
from runtime.config.load import load_config
from runtime.data import DataPlan
from runtime.data.order.surgery import SURGERY_KEY, documents_of, parse_document, surgery_of
from runtime.startup import start_up
from tests.runtime.test_nonfinite_steps import POISONED
from tests.support.configs import small_config
from tests.support.harness import error_lines, metrics, train_one


def saved_state(checkpoint: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's weights and AdamW state, flat: ``model.NAME`` and ``optimizer.NAME.{step,exp_avg,...}``."""
    out = tmp / f"{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint, out)
    saved = torch.load(out, weights_only=False)
    return {f"{part}.{k}": v for part in ("model", "optimizer") for k, v in saved[part].items()}


def web_documents(config: Path, shards: Path, step: int) -> list[str]:
    """The web documents step ``step`` of the run without surgery reads, as FOLDER:DOC (absolute folders)."""
    cwd = os.getcwd()
    os.chdir(shards)
    try:
        plan = DataPlan(load_config(config))
        rows = explain_step(plan, step)
    finally:
        os.chdir(cwd)
    web = [r for r in rows if r["dataset"].endswith("web")]
    return sorted({f"{shards / r['dataset']}:{d}" for r in web for d in r["documents"]})


def test_skipped_steps_read_the_data_but_update_nothing(shards, tmp_path):
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=6, interval=2, single_stage=True, checkpoints={"keep_last": 4},
                       surgery={"skip_steps": ["3:4"]})
    base_cfg = small_config(tmp_path, tmp_path / "base", dp=1, steps=6, interval=2, single_stage=True,
                            name="base.yaml")
    train_one(cfg, cwd=shards)
    train_one(base_cfg, cwd=shards)
    rows, base = metrics(run), metrics(tmp_path / "base")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["data_hash"] for r in rows] == [r["data_hash"] for r in base]  # the order goes on as if trained
    assert [r["lr"] for r in rows] == [r["lr"] for r in base]  # and the learning-rate schedule
    assert [r["weights"] for r in rows] == [r["weights"] for r in base]  # every row: the weights drawn with
    for r in rows[2:4]:
        assert (r["skipped"], r["loss"], r["grad_norm"], r["stage"]) == ("surgery", None, None, "pretrain")
    assert [r["loss"] for r in rows[:2]] == [r["loss"] for r in base[:2]]
    two, four = (saved_state(run / "checkpoints" / f"step-00000{s}", tmp_path) for s in (2, 4))
    assert two.keys() == four.keys() and all(torch.equal(two[k], four[k]) for k in two)  # weights and Adam's steps
    steps = [v for k, v in four.items() if k.endswith(".step")]
    assert steps and all(float(v) == 2.0 for v in steps)
    meta = read_metadata(run / "checkpoints" / "step-000004")
    assert meta.step_skipped is False and meta.extensions[SURGERY_KEY] == {"skip_steps": ["3:4"], "exclusions": []}


def test_a_resume_with_surgery_continues_exactly(shards, tmp_path):
    docs_cfg = small_config(tmp_path, tmp_path / "probe", dp=1, steps=8, single_stage=True, name="probe.yaml")
    docs = web_documents(docs_cfg, shards, 6)
    surgery = {"skip_steps": ["3:3"], "exclude_documents": docs, "exclude_from_step": 2}
    whole = small_config(tmp_path, tmp_path / "whole", dp=1, steps=8, interval=4, single_stage=True,
                         name="whole.yaml", surgery=surgery)
    cut = small_config(tmp_path, tmp_path / "cut", dp=1, steps=8, interval=4, single_stage=True, name="cut.yaml",
                       surgery=surgery)
    train_one(whole, cwd=shards)
    killed = train_one(cut, cwd=shards, env={"NANOSET_FAULT_KILL_AT_STEP": "6"}, check=False)
    assert killed.returncode != 0
    resumed = train_one(cut, cwd=shards)
    assert f"resumed from {tmp_path / 'cut' / 'checkpoints' / 'step-000004'} at step 4" in resumed.stdout
    a, b = metrics(tmp_path / "whole"), metrics(tmp_path / "cut")
    assert [r["step"] for r in b] == list(range(1, 9))
    assert [(r["loss"], r["data_hash"], r["skipped"]) for r in a] == [(r["loss"], r["data_hash"], r["skipped"])
                                                                       for r in b]
    assert a[2]["skipped"] == "surgery"


def test_a_dataset_folder_copied_to_another_path_resumes_exactly_with_its_recorded_surgery(shards, tmp_path):
    """The data and its recorded surgery are named by content: a run whose folders moved (the old path gone) resumes
    bit for bit, the exclusion recorded by its checkpoint included, though the config no longer names it."""
    probe = small_config(tmp_path, tmp_path / "probe", dp=1, steps=6, single_stage=True, name="probe.yaml")
    surgery = {"exclude_documents": web_documents(probe, shards, 5)[:3], "exclude_from_step": 2}
    surgery["exclude_documents"] = [f"shards/web:{d.rsplit(':', 1)[1]}" for d in surgery["exclude_documents"]]
    whole = small_config(tmp_path, tmp_path / "whole", dp=1, steps=6, interval=3, single_stage=True,
                         name="whole.yaml", surgery=surgery)
    cut = small_config(tmp_path, tmp_path / "cut", dp=1, steps=6, interval=3, single_stage=True, name="cut.yaml",
                       surgery=surgery)
    moved = small_config(tmp_path, tmp_path / "cut", dp=1, steps=6, interval=3, single_stage=True, name="moved.yaml")
    first, second = tmp_path / "first", tmp_path / "second"
    for name in ("web", "code"):
        shutil.copytree(shards / "shards" / name, first / "shards" / name)
    train_one(whole, cwd=shards)
    assert train_one(cut, cwd=first, env={"NANOSET_FAULT_KILL_AT_STEP": "5"}, check=False).returncode != 0
    first.rename(second)  # the folders the checkpoint and its surgery were recorded with are gone
    resumed = train_one(moved, cwd=second)
    assert f"resumed from {tmp_path / 'cut' / 'checkpoints' / 'step-000003'} at step 3" in resumed.stdout
    a, b = metrics(tmp_path / "whole"), metrics(tmp_path / "cut")
    assert [r["step"] for r in b] == list(range(1, 7))
    assert [(r["loss"], r["data_hash"]) for r in a] == [(r["loss"], r["data_hash"]) for r in b]
    web = "fingerprint:" + open_dataset(second / "shards" / "web").fingerprint
    recorded = read_metadata(tmp_path / "cut" / "checkpoints" / "step-000006").extensions[SURGERY_KEY]
    docs = sorted(int(d.rsplit(":", 1)[1]) for d in surgery["exclude_documents"])
    assert recorded["exclusions"] == [{"from_step": 2, "documents": {web: docs}}]
    os.chdir(second)
    plan = start_up(load_config(moved), lock=False).plan  # explain's order there: the recorded exclusion in force
    assert [plan.data_hash(s) for s in range(1, 7)] == [r["data_hash"] for r in a]


def nanoset_train(*args, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "nanoset.cli", "train", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"nanoset train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def test_rewind_to_rewinds_records_trains_on_and_runs_again_without_rewinding(shards, tmp_path):
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=8, interval=2, single_stage=True, checkpoints={"keep_last": 4})
    train_one(cfg, cwd=shards)
    before = metrics(run)
    docs = web_documents(cfg, shards, 7)
    listed = tmp_path / "report.txt"
    listed.write_text("\n".join(docs) + "\n")
    surgery = ["--rewind-to", 4, "--skip-steps", "6:6", "--exclude-documents", listed]

    check = nanoset_train("--config", cfg, *surgery, "--check", cwd=shards).stdout.splitlines()
    assert not [line for line in check if line.startswith("--set")]  # none given: the rewind's own resume is not one
    start = [line for line in check if line.startswith("start: ")]
    assert start == [f"start: rewinds to {run / 'checkpoints' / 'step-000004'} (step 4): trains steps 5-8; the 2 later "
                     f"checkpoint(s) (step-000006, step-000008) are moved to {run}/rewound-<UTC time>/checkpoints, and "
                     f"a copy of metrics.jsonl made in {run}/rewound-<UTC time>"]
    lines = [line for line in check if line.startswith("surgery: ")]
    assert lines[:3] == ["surgery: skips steps 6 (read, not trained)", f"surgery: excises {len(docs)} document(s) "
                         f"from step 5", "surgery: stage 'pretrain': 1 step(s) skipped"]
    assert len(lines) == 4 and lines[3].startswith(f"surgery: stage 'pretrain': shards/web: {len(docs)} document(s) "
                                                   f"excluded, ")
    assert not list(run.glob("rewound-*")) and not (run / "surgery.json").exists()  # --check changes nothing

    done = nanoset_train("--config", cfg, *surgery, cwd=shards)
    (aside,) = run.glob("rewound-*")
    assert done.stdout.splitlines()[0] == (
        f"rewound to {run / 'checkpoints' / 'step-000004'} (step 4), surgery recorded in {run / 'surgery.json'}; "
        f"the run's later checkpoints were moved to {aside / 'checkpoints'}, and a copy of metrics.jsonl made in "
        f"{aside}")
    web = "fingerprint:" + open_dataset(shards / "shards" / "web").fingerprint  # the dataset, wherever it is
    by_folder = {web: [int(d.rsplit(":", 1)[1]) for d in docs]}
    assert json.loads((run / "surgery.json").read_text()) == {"rewinds": [
        {"rewind_to": 4, "skip_steps": ["6:6"], "exclude_documents": by_folder,
         "datasets": {web: str(shards / "shards" / "web")}}]}
    after = metrics(run)
    assert [r["step"] for r in after] == list(range(1, 9)) and after[:4] == before[:4]
    assert after[5]["skipped"] == "surgery" and after[5]["loss"] is None
    os.chdir(shards)
    plan = start_up(load_config(cfg), lock=False).plan  # the run's own order: the recorded surgery in force
    assert [r["data_hash"] for r in after] == [plan.data_hash(s) for s in range(1, 9)]
    excluded = {tuple(d.rsplit(":", 1)) for d in docs}
    for step in range(5, 9):
        held = {(str(shards / r["dataset"]), str(doc)) for r in explain_step(plan, step) for doc in r["documents"]}
        assert not held & excluded, step
    recorded = read_metadata(run / "checkpoints" / "step-000008").extensions[SURGERY_KEY]
    assert recorded["exclusions"] == [{"from_step": 5, "documents": by_folder}]
    assert recorded["datasets"] == {web: str(shards / "shards" / "web")}  # shown only

    again = nanoset_train("--config", cfg, *surgery, cwd=shards)
    assert again.stdout.splitlines() == [
        f"surgery of --rewind-to 4 already recorded in {run / 'surgery.json'}: resuming the latest checkpoint",
        f"done: {run / 'checkpoints' / 'step-000008'} is at step 8 = tokens.train_steps: nothing left to train, no "
        f"worker started (raise tokens.train_steps to train on)"]
    assert len(list(run.glob("rewound-*"))) == 1

    hits = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(cfg), "--documents", str(listed),
                           "--json"], capture_output=True, text=True, cwd=shards, check=True)
    assert {h["step"] for h in json.loads(hits.stdout)} <= {1, 2, 3, 4}  # excised from step 5: listed before only

    late = nanoset_train("--config", cfg, "--rewind-to", 6, "--skip-steps", "5:6", cwd=shards, check=False)
    assert error_lines(late.stderr) == ["error: --skip-steps 5:6: starts at or before the step rewound to (6), which "
                                        "is trained already; skip steps after 6, or rewind to an earlier checkpoint"]
    missing = nanoset_train("--config", cfg, "--rewind-to", 5, "--skip-steps", "7:7", cwd=shards, check=False)
    assert error_lines(missing.stderr) == [f"error: --rewind-to 5: {run / 'checkpoints'} has no complete checkpoint "
                                           f"of step 5 (its checkpoints: step-000002, step-000004, step-000006, "
                                           f"step-000008); rewind to one of them"]


def test_a_second_earlier_rewind_keeps_what_the_first_excised_out_of_the_steps_it_trains_again(shards, tmp_path):
    """--rewind-to 4 excluding A, then --rewind-to 2 excluding B: neither trains after step 2, as in the run that
    excluded both from step 3; explain says what trained."""
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=6, interval=2, single_stage=True, checkpoints={"keep_last": 4})
    cwd = os.getcwd()
    os.chdir(shards)
    try:
        config = load_config(cfg)
        web = [f for f in DataPlan(config).folders if f.endswith("web")][0]
        b = {f"{web}:{d}" for r in explain_step(DataPlan(config), 6) if r["dataset"].endswith("web")
             for d in r["documents"]}
        with_b = DataPlan(config, surgery=surgery_of([], documents_of([parse_document(t, "b") for t in b]), 3, "b"))
        a = {f"{web}:{d}" for step in (3, 4) for r in explain_step(with_b, step) if r["dataset"].endswith("web")
             for d in r["documents"]} - b  # what steps 3-4 read once B is out
    finally:
        os.chdir(cwd)
    assert a and b
    (tmp_path / "a.txt").write_text("\n".join(sorted(a)) + "\n")
    (tmp_path / "b.txt").write_text("\n".join(sorted(b)) + "\n")
    both = small_config(tmp_path, tmp_path / "both", dp=1, steps=6, interval=2, single_stage=True, name="both.yaml",
                        surgery={"exclude_documents": sorted(a | b), "exclude_from_step": 3})
    train_one(cfg, cwd=shards)
    train_one(both, cwd=shards)
    nanoset_train("--config", cfg, "--rewind-to", 4, "--exclude-documents", tmp_path / "a.txt", cwd=shards)
    second = ["--rewind-to", 2, "--exclude-documents", tmp_path / "b.txt"]
    check = nanoset_train("--config", cfg, *second, "--check", cwd=shards).stdout.splitlines()
    assert f"surgery: excises {len(a | b)} document(s) from step 3" in check
    nanoset_train("--config", cfg, *second, cwd=shards)
    rows, expected = metrics(run), metrics(tmp_path / "both")
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert [(r["loss"], r["data_hash"]) for r in rows] == [(r["loss"], r["data_hash"]) for r in expected]
    os.chdir(shards)
    plan = start_up(load_config(cfg), lock=False).plan
    assert [plan.data_hash(s) for s in range(1, 7)] == [r["data_hash"] for r in rows]


def test_a_run_of_non_finite_steps_around_skipped_ones_names_its_real_first_step(shards, tmp_path):
    """Surgery's skips neither count toward optimizer.max_skipped_steps nor end a run of non-finite steps; the
    error names the run's first non-finite step (4), not the step that many steps back (6)."""
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=10, interval=2, single_stage=True,
                       optimizer={"max_skipped_steps": 2}, surgery={"skip_steps": ["5:6"]})
    script = tmp_path / "poisoned.py"
    script.write_text(POISONED)
    proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                          cwd=shards, env={**os.environ, "NAN_STEPS": "4,5,6"})  # engine calls: steps 4, 7, 8
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        "error: steps 4-8: 3 steps in a row had a non-finite loss or gradient norm and were skipped (steps 5-6, "
        "skipped by surgery, between them not counted) (optimizer.max_skipped_steps 2)"), lines
    assert [(r["step"], r["skipped"]) for r in metrics(run)] == [
        (1, False), (2, False), (3, False), (4, True), (5, "surgery"), (6, "surgery"), (7, True), (8, True)]


def test_explain_applies_a_surgery_only_the_checkpoints_record(shards, tmp_path, monkeypatch, capsys):
    """Trained with an exclusion in the config, which is then removed: the checkpoint keeps it (a resume applies
    it), and explain without --checkpoint finds it in the run's latest checkpoint: its data_hash per step is
    metrics.jsonl's, not the unexcised order's."""
    from runtime.cli.explain import explain

    run = tmp_path / "run"
    probe = small_config(tmp_path, tmp_path / "probe", dp=1, steps=4, single_stage=True, name="probe.yaml")
    surgery = {"exclude_documents": web_documents(probe, shards, 3), "exclude_from_step": 2}
    cfg = small_config(tmp_path, run, dp=1, steps=4, interval=2, single_stage=True, surgery=surgery)
    train_one(cfg, cwd=shards)
    removed = small_config(tmp_path, run, dp=1, steps=4, interval=2, single_stage=True, name="removed.yaml")
    monkeypatch.chdir(shards)
    trained = [r["data_hash"] for r in metrics(run)]
    unexcised = [DataPlan(load_config(removed)).data_hash(s) for s in range(1, 5)]
    assert unexcised[0] == trained[0] and unexcised[2] != trained[2]  # step 3 read the excised documents
    assert explain(str(removed), None, None, True, steps="1:4") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [next(r["data_hash"] for r in rows if r["step"] == s) for s in range(1, 5)] == trained
