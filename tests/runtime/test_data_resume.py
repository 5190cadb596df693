"""Resuming with another config: the past comes from the checkpoint's record, never recomputed.

Plan-level tests with exact window identities; the end-to-end test runs the trainer twice (one process
each) and matches its metrics' data_hash with ``runtime.explain --checkpoint``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from runtime.checkpoint.record import read_metadata
from runtime.config import ConfigError
from runtime.config.load import load_config
from runtime.data import DataPlan, training_metadata
from runtime.data.order.record import TrainingMetadata
from tests.support.configs import make_config, small_config
from tests.support.harness import metrics, train_one


@pytest.fixture(autouse=True)
def in_shards(shards, monkeypatch):
    monkeypatch.chdir(shards)


def stages(first_weights=(0.7, 0.3), seed=None, second="shards/web"):
    """pretrain (web+code, steps 1-10), then web alone (steps 11-20): web's draws must continue."""
    data = {"dataset": {"dataset_folder": ["shards/web", "shards/code"], "dataset_weights": list(first_weights)}}
    if seed is not None:
        data["seed"] = seed
    return [{"name": "pretrain", "start_training_step": 1, "data": data},
            {"name": "more", "start_training_step": 11, "data": {"dataset": {"dataset_folder": second}}}]


def config(g, allow=False, **kw):
    c = make_config(dp=1, accum=1, mbs=g, train_steps=20, seq=128, stages=kw.pop("stages", stages()), **kw)
    c.checkpoints.allow_data_change = allow
    return c


def record(plan, step):
    """What a checkpoint after ``step`` records of the data, through JSON as on disk."""
    return TrainingMetadata.from_json(json.loads(json.dumps(training_metadata(plan, step).to_json())))


def windows(plan, steps):
    """(dataset folder, window) of every sample of ``steps``, in order."""
    out = []
    for t in steps:
        _, loc = plan.global_batch(t)
        out += [(plan.folders[d], s) for d, s in zip(loc.dataset.tolist(), loc.sample.tolist())]
    return out


def test_new_batch_size_at_a_stage_boundary_continues_every_dataset(tmp_path):
    before = DataPlan(config(8))
    ckpt = record(before, 10)
    seen = windows(before, range(1, 11))
    web = before.permutation(before.stages[1].dataset_ids[0], 0)
    assert sum(f.endswith("web") for f, _ in seen) == 56  # 80 samples at 0.7
    naive = DataPlan(config(4))  # recomputing stage 1 with the new G: web's draws restart at 28
    assert len(set(windows(naive, range(11, 21))) & set(seen)) == 28
    resumed = naive.resumed_from(tmp_path / "step-10", ckpt)
    after = windows(resumed, range(11, 21))
    assert not set(after) & set(seen) and len(set(after)) == 40
    assert [s for _, s in after] == web(np.arange(56, 96)).tolist()  # draws 56.. of web's epoch-0 order
    assert windows(resumed, range(1, 11)) == seen  # the past as trained (G = 8)
    assert resumed.stages[0].global_batch_size == 8 and resumed.stages[1].global_batch_size == 4
    again = record(resumed, 14).to_json()  # the next checkpoint keeps the record of the past
    assert [p["global_batch_size"] for s in again["data_stages"] for p in s["parts"]] == [8, 4]
    assert again["consumed_train_samples"] == 80 + 16


def test_explain_with_checkpoint_shows_the_resumed_data(tmp_path):
    before = DataPlan(config(8))
    ckpt = tmp_path / "step-000010"
    ckpt.mkdir()
    (ckpt / "metadata.json").write_text(json.dumps({"training": record(before, 10).to_json()}))  # a version 1 file
    new = tmp_path / "new.yaml"
    import yaml
    new.write_text(yaml.safe_dump(config(4).to_dict()))
    resumed = DataPlan(config(4)).resumed_from(ckpt, record(before, 10))
    out = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(new), "--checkpoint", str(ckpt),
                          "--step", "12", "--json"], capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    _, loc = resumed.global_batch(12)
    assert [r["sample"] for r in rows] == loc.sample.tolist() and {r["data_hash"] for r in rows} == {
        resumed.data_hash(12)}
    plain = json.loads(subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(new), "--step", "12",
                                       "--json"], capture_output=True, text=True, check=True).stdout)
    assert plain[0]["data_hash"] == DataPlan(config(4)).data_hash(12) != rows[0]["data_hash"]
    bad = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(new), "--checkpoint",
                          str(tmp_path), "--step", "12"], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.strip() == (
        f"error: --checkpoint {tmp_path}: no metadata.json; it is not a complete checkpoint (pass a step-N folder as "
        f"--checkpoint)")
    # a missing folder is said as runtime.evaluate and runtime.export say it (it was "no metadata.json" here)
    gone = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(new), "--checkpoint",
                           str(tmp_path / "nope"), "--step", "12"], capture_output=True, text=True)
    assert gone.returncode == 1 and gone.stderr == f"error: --checkpoint {tmp_path / 'nope'}: no such folder\n"
    # the checkpoints folder stands for its latest, as for evaluate and export
    (tmp_path / "latest").write_text("step-000010\n")
    latest = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(new), "--checkpoint",
                             str(tmp_path), "--step", "12", "--json"], capture_output=True, text=True, check=True)
    assert json.loads(latest.stdout) == rows


def test_changed_weights_of_a_finished_stage_are_refused_or_follow_the_record(tmp_path):
    ckpt = record(DataPlan(config(8)), 10)
    with pytest.raises(ConfigError) as e:
        DataPlan(config(8, stages=stages((0.5, 0.5)))).resumed_from("ckpt", ckpt)
    assert str(e.value) == (
        "ckpt: the data changed since this checkpoint: data_stages[0] (pretrain).data.dataset.dataset_weights is "
        "[0.5, 0.5], the checkpoint's [0.7, 0.3] (it trained steps 1-10); restore it, or set "
        "checkpoints.allow_data_change: true to keep the checkpoint's record for this finished stage")
    with pytest.raises(ConfigError, match=r"data_stages\[0\] \(pretrain\).data.seed is 7, the checkpoint's 42"):
        DataPlan(config(8, stages=stages(seed=7))).resumed_from("ckpt", ckpt)
    other_seed = config(8)
    other_seed.general.seed = 7  # the stage has no data.seed: the key the user changed is general.seed
    with pytest.raises(ConfigError, match=r"ckpt: the data changed since this checkpoint: general.seed \(the seed "
                                          r"of data_stages\[0\] \(pretrain\)\) is 7, the checkpoint's 42"):
        DataPlan(other_seed).resumed_from("ckpt", ckpt)
    followed = DataPlan(config(8, allow=True, stages=stages((0.5, 0.5)))).resumed_from("ckpt", ckpt)
    unchanged = DataPlan(config(8))
    assert followed.stages[0].weights == [0.7, 0.3]
    assert windows(followed, range(1, 21)) == windows(unchanged, range(1, 21))


def test_a_stage_that_has_begun_cannot_move_or_vanish():
    ckpt = record(DataPlan(config(8)), 12)
    moved = stages()
    moved[1]["start_training_step"] = 13
    with pytest.raises(ConfigError) as e:
        DataPlan(config(8, stages=moved)).resumed_from("ckpt", ckpt)
    assert str(e.value) == ("ckpt: data_stages[1] (more).start_training_step: 13 differs from step 11 where the "
                            "checkpoint began this stage; a stage that has begun cannot move")
    early = stages()
    early[1]["start_training_step"] = 6
    with pytest.raises(ConfigError, match=r"data_stages\[1\] \(more\).start_training_step: 6 differs from step 11"):
        DataPlan(config(8, stages=early)).resumed_from("ckpt", ckpt)
    renamed = stages()
    renamed[1]["name"] = "other"
    with pytest.raises(ConfigError, match="it trained stage 'more' from step 11, but data_stages has no stage of"):
        DataPlan(config(8, stages=renamed)).resumed_from("ckpt", ckpt)
    inserted = stages() + [{"name": "late", "start_training_step": 15,
                            "data": {"dataset": {"dataset_folder": "shards/sft"}}}]
    inserted[2]["start_training_step"] = 12
    with pytest.raises(ConfigError, match=r"data_stages\[2\] \(late\).start_training_step: 12 is not after the "
                                          r"checkpoint's step 12.*start it at step 13 or later"):
        DataPlan(config(8, stages=inserted)).resumed_from("ckpt", ckpt)
    later = stages() + [{"name": "late", "start_training_step": 15,
                         "data": {"dataset": {"dataset_folder": "shards/sft"}}}]
    assert [s.name for s in DataPlan(config(8, stages=later)).resumed_from("ckpt", ckpt).stages] == [
        "pretrain", "more", "late"]  # a stage that has not begun may be added


def test_batch_size_changed_mid_stage_is_refused_or_continues_without_repeats():
    before = DataPlan(config(8))
    ckpt = record(before, 5)
    with pytest.raises(ConfigError) as e:
        DataPlan(config(4)).resumed_from("ckpt", ckpt)
    assert str(e.value) == (
        "ckpt: global batch size changed mid-stage (8 → 4) in stage 'pretrain'; keep dp · micro_batch_size · "
        "batch_accumulation_per_replica = 8; restore it, or set checkpoints.allow_data_change: true to continue "
        "the stage from step 6 with the new values")
    resumed = DataPlan(config(4, allow=True)).resumed_from("ckpt", ckpt)
    assert [(p.name, p.start_step, p.end_step, p.global_batch_size) for p in resumed.stages] == [
        ("pretrain", 1, 6, 8), ("pretrain", 6, 11, 4), ("more", 11, 21, 4)]
    seen = windows(before, range(1, 6))
    rest = windows(resumed, range(6, 21))
    assert len(set(seen + rest)) == len(seen + rest) == 40 + 20 + 40  # nothing repeats
    web = before.stages[0].dataset_ids[0]
    assert resumed.stages[1].draw_offsets.tolist() == [28, 12]  # what steps 1-5 drew (40 samples at 0.7/0.3)
    assert resumed.stages[2].draw_offsets.tolist() == [28 + 14]  # then 20 samples: 14 of web
    assert resumed.stages[2].dataset_ids == [web]
    naive = DataPlan(config(4, allow=True))  # recounting 5 steps × the new G would repeat 14 web and 6 code windows
    assert len(set(windows(naive, range(6, 11))) & set(seen)) == 20


def test_changed_dataset_content_of_a_stage_that_has_begun(tmp_path, shards):
    import shutil
    copy = tmp_path / "web"
    shutil.copytree(shards / "shards" / "web", copy)
    c = config(8, stages=stages(second=str(copy)))
    ckpt = record(DataPlan(c), 12)
    assert ckpt.data_stages[1].parts[0].datasets == [os.path.realpath(copy)]  # the folder the stage reads
    manifest = json.loads((copy / "nanoset.json").read_text())
    manifest["shards"][0]["sha256"]["ds"] = "0" * 64
    (copy / "nanoset.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=f"ckpt: the data changed since this checkpoint: {copy} has other content "
                                          r"\(fingerprint \w+ → \w+\) \(it trained steps 11-12\)"):
        DataPlan(c).resumed_from("ckpt", ckpt)
    c.checkpoints.allow_data_change = True
    # as recorded: the copy of web went on from the 56 windows of it that steps 1-10 drew (10 × 8 × 0.7)
    assert DataPlan(c).resumed_from("ckpt", ckpt).stages[1].draw_offsets.tolist() == [56]


def test_trainer_resumed_with_a_new_batch_size_matches_explain(shards, tmp_path):
    """Run G=4 to the end of stage 1 (checkpoint at step 4), resume with G=2: metrics' data_hash of the
    resumed steps equals `explain --checkpoint`, and stage 2 never repeats a stage-1 window."""
    import yaml

    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, accum=2, steps=8, boundary=5, interval=4)
    d = yaml.safe_load(cfg.read_text())
    d["data_stages"][1]["data"]["dataset"] = {"dataset_folder": "./shards/web"}  # the same folder, spelled otherwise
    d["data_stages"][1]["sequence_length"] = 32
    cfg.write_text(yaml.safe_dump(d))
    killed = train_one(cfg, cwd=shards, env={"NANOSET_FAULT_KILL_AT_STEP": "5"}, check=False)
    assert killed.returncode != 0
    d["tokens"]["batch_accumulation_per_replica"] = 1
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(d))
    train_one(new, cwd=shards)
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 9))
    ckpt = run / "checkpoints" / "step-000004"
    for step in range(5, 9):
        out = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(new), "--checkpoint",
                              str(ckpt), "--step", str(step), "--json"], capture_output=True, text=True, cwd=shards,
                             check=True)
        assert {r["data_hash"] for r in json.loads(out.stdout)} == {rows[step - 1]["data_hash"]}
    first = DataPlan(load_config(cfg))
    resumed = DataPlan(load_config(new)).resumed_from(ckpt, read_metadata(ckpt).training)
    stage1, stage2 = windows(first, range(1, 5)), windows(resumed, range(5, 9))
    web = str(shards / "shards" / "web")
    assert len(stage2) == 8 and {f for f, _ in stage2} == {web} and not set(stage1) & set(stage2)
    web_drawn = sum(f == web for f, _ in stage1)
    assert resumed.stages[1].draw_offsets.tolist() == [web_drawn]
    assert [r["data_hash"] for r in rows[:4]] == [first.data_hash(t) for t in range(1, 5)]


def test_a_dataset_moved_elsewhere_resumes_where_its_content_is(shards, tmp_path, monkeypatch):
    """The same relative paths from another cwd, over a copy of the data (a node-local disk, another
    mount): the record's folders are matched by content fingerprint, the order is unchanged, and the old
    location is not needed (was: refused as changed data; with allow_data_change, the old folder reopened)."""
    import shutil

    first, second = tmp_path / "job1", tmp_path / "job2"
    shutil.copytree(shards / "shards", first / "shards")
    monkeypatch.chdir(first)
    before = DataPlan(config(8))
    ckpt = record(before, 14)
    shutil.move(first, second)
    monkeypatch.chdir(second)
    resumed = DataPlan(config(8)).resumed_from(tmp_path / "step-14", ckpt)
    assert [resumed.data_hash(t) for t in range(1, 21)] == [before.data_hash(t) for t in range(1, 21)]
    web, code = str(second / "shards" / "web"), str(second / "shards" / "code")
    assert sorted(resumed.folders) == [code, web]
    again = record(resumed, 16).to_json()["data_stages"]
    assert [p["datasets"] for s in again for p in s["parts"]] == [[web, code], [web]]


def scheduled(entries):
    """The pretrain stage (steps 1-10) blended by a schedule of (step, [web, code]) entries."""
    out = stages()
    out[0]["data"]["dataset"]["dataset_weights"] = [{"step": s, "weights": list(w)} for s, w in entries]
    return out


SCHEDULE = [(1, (0.9, 0.1)), (4, (0.5, 0.5)), (7, (0.2, 0.8)), (9, (0.5, 0.5))]


def counts_per_step(plan, steps):
    """(web, code) samples of each step's global batch."""
    out = []
    for t in steps:
        _, loc = plan.global_batch(t)
        out.append(np.bincount(loc.source, minlength=2).tolist())
    return out


def test_a_schedule_is_recorded_and_only_its_past_binds_a_resume():
    """A resume at step 6 lies in the segment 4-7: entries 1, 4 and 7 are its past (refused when changed, or
    followed with allow_data_change); entry 9 is its future and may change: steps 1-7 stay as trained."""
    before = DataPlan(config(8, stages=scheduled(SCHEDULE)))
    assert before.stages[0].blend.kind == "scheduled" and before.stages[1].blend.kind == "periodic"
    assert counts_per_step(before, [1, 4, 7, 10]) == [[7, 1], [4, 4], [2, 6], [4, 4]]
    ckpt = record(before, 5)
    part = ckpt.to_json()["data_stages"][0]["parts"][0]
    assert part["blend"] == "scheduled" and part["weights"] is None
    assert part["schedule"] == [{"step": s, "weights": list(w)} for s, w in SCHEDULE]
    assert ckpt.to_json()["data_stages"][1]["parts"] == []  # not begun
    future = SCHEDULE[:3] + [(9, (0.9, 0.1))]
    resumed = DataPlan(config(8, stages=scheduled(future))).resumed_from("ckpt", ckpt)
    assert len(resumed.stages) == 2  # no new part: the blend is causal
    assert windows(resumed, range(1, 8)) == windows(before, range(1, 8))  # steps 8, 9 interpolate towards entry 9
    assert counts_per_step(resumed, [10]) == [[7, 1]]
    assert record(resumed, 8).to_json()["data_stages"][0]["parts"][0]["schedule"][3]["weights"] == [0.9, 0.1]
    seen = windows(resumed, range(1, 21))
    assert len(set(seen)) == len(seen)  # nothing repeats
    past = SCHEDULE[:2] + [(7, (0.3, 0.7))] + SCHEDULE[3:]
    with pytest.raises(ConfigError) as e:
        DataPlan(config(8, stages=scheduled(past))).resumed_from("ckpt", ckpt)
    assert str(e.value).startswith(
        "ckpt: the data changed since this checkpoint: data_stages[0] (pretrain).data.dataset.dataset_weights is the "
        "schedule step 1 [0.9, 0.1] → step 4 [0.5, 0.5] → step 7 [0.3, 0.7] → step 9 [0.5, 0.5], the checkpoint's "
        "the schedule step 1 [0.9, 0.1] → step 4 [0.5, 0.5] → step 7 [0.2, 0.8] → step 9 [0.5, 0.5]; a resume at "
        "step 6 keeps the entries up to the first one after it (it trained steps 1-5)")
    followed = DataPlan(config(8, allow=True, stages=scheduled(past))).resumed_from("ckpt", ckpt)
    assert [(p.start_step, p.end_step) for p in followed.stages] == [(1, 6), (6, 11), (11, 21)]
    assert windows(followed, range(1, 6)) == windows(before, range(1, 6))
    # web's targets under the new entry 7 (0.3): 2.93 at step 6, 2.4 at step 7, from step 5's deviation (-0.4)
    assert counts_per_step(followed, [6, 7]) == [[3, 5], [2, 6]]
    assert counts_per_step(before, [6, 7]) == [[2, 6], [2, 6]]  # the old entry 7 (0.2): 2.4 then 1.6
    done = record(before, 12)  # the stage is finished: every entry is its past
    with pytest.raises(ConfigError, match=r"dataset_weights is the schedule .* \(it trained steps 1-10\)"):
        DataPlan(config(8, stages=scheduled(future))).resumed_from("ckpt", done)
    with pytest.raises(ConfigError, match=r"dataset_weights is \[0.7, 0.3\], the checkpoint's the schedule step 1"):
        DataPlan(config(8)).resumed_from("ckpt", ckpt)  # a constant list for a scheduled stage


def test_a_new_batch_size_mid_schedule_keeps_the_rule_across_the_resume():
    """G 8 → 4 at step 6 (allow_data_change): the second part carries the first part's deviation, so every
    step boundary of the stage stays within 1/2 of Σ G(t)·w(t), and nothing repeats."""
    from fractions import Fraction

    from runtime.data.order.scheduled_blend import WeightSchedule

    before = DataPlan(config(8, stages=scheduled(SCHEDULE)))
    resumed = DataPlan(config(4, allow=True, stages=scheduled(SCHEDULE))).resumed_from("ckpt", record(before, 5))
    assert [p.global_batch_size for p in resumed.stages] == [8, 4, 4]
    counts = np.cumsum(counts_per_step(resumed, range(1, 11)), axis=0)
    shares = WeightSchedule.from_entries(resumed.stages[0].schedule.to_json()).shares(np.arange(1, 11))
    batch = [8] * 5 + [4] * 5
    target = np.cumsum([[Fraction(g) * Fraction(w) for w in row] for g, row in zip(batch, shares.tolist())], axis=0)
    assert max(abs(float(t) - c) for t, c in zip(target.ravel(), counts.ravel())) <= 0.5 + 1e-9
    seen = windows(resumed, range(1, 21))
    assert len(set(seen)) == len(seen)


def test_elastic_dp_replays_a_scheduled_stage_exactly():
    one = DataPlan(make_config(dp=1, accum=4, mbs=2, train_steps=20, stages=scheduled(SCHEDULE)))
    two = DataPlan(make_config(dp=2, accum=2, mbs=2, train_steps=20, stages=scheduled(SCHEDULE)))
    resumed = two.resumed_from("ckpt", record(one, 5))
    assert windows(resumed, range(1, 21)) == windows(one, range(1, 21)) == windows(two, range(1, 21))
    assert [one.data_hash(t) for t in range(1, 21)] == [resumed.data_hash(t) for t in range(1, 21)]
