"""Resuming an earlier checkpoint of a run (a rewind) moves what the run had done after it aside, never
deleting it: its later checkpoints and its metrics stay in ``<run_dir>/rewound-<time>/``, a branch that can be
trained on as a run of its own; ``latest`` names the resumed checkpoint from the start."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nanoset.errors import ConfigError, RunFolderError
from runtime.checkpoint.run_folder import branch_folder, rewind
from runtime.config.load import load_config
from runtime.startup import plan_start
from tests.support.configs import TWO_STAGE, build, merged, small_config
from tests.support.harness import error_lines, metrics, train_one


def test_a_rewind_moves_the_later_checkpoints_and_metrics_aside(shards, tmp_path):
    run = tmp_path / "run"
    first = small_config(tmp_path, run, dp=1, steps=8, interval=2, single_stage=True, checkpoints={"keep_last": 4})
    train_one(first, cwd=shards)
    before = metrics(run)
    earlier = run / "checkpoints" / "step-000004"
    again = small_config(tmp_path, run, dp=1, steps=8, interval=2, single_stage=True, name="rewind.yaml",
                         checkpoints={"keep_last": 4, "resume": str(earlier)})
    assert check_start(first, shards) == f"start: resumes from {run / 'checkpoints' / 'step-000008'} (step 8): " \
                                         f"nothing left to train"
    assert check_start(again, shards) == (  # --check says what the rewind will move, and moves nothing
        f"start: rewinds to {earlier} (step 4): trains steps 5-8; the 2 later checkpoint(s) (step-000006, step-000008) "
        f"are moved to {run}/rewound-<UTC time>/checkpoints, and a copy of metrics.jsonl made in "
        f"{run}/rewound-<UTC time>")
    assert not list(run.glob("rewound-*"))
    # killed after step 5, before the rewound run's first checkpoint: `latest` named step-000008, moved away, so
    # `resume: latest` (and explain, export) failed
    killed = train_one(again, cwd=shards, env={"NANOSET_FAULT_KILL_AT_STEP": "5"}, check=False)
    assert killed.returncode != 0
    (aside,) = run.glob("rewound-*")
    assert f"rewound to step 4 ({earlier}): the run's later checkpoints were moved to {aside / 'checkpoints'}, and " \
           f"a copy of metrics.jsonl made in {aside}" in killed.stdout
    assert (run / "checkpoints" / "latest").read_text() == "step-000004\n"
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["latest", "step-000006", "step-000008"]
    assert (aside / "checkpoints" / "latest").read_text() == "step-000008\n"  # the branch resumes by itself
    assert [json.loads(line) for line in (aside / "metrics.jsonl").read_text().splitlines()] == before
    resumed = train_one(first, cwd=shards)  # resume: latest
    assert f"resumed from {earlier} at step 4" in resumed.stdout
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == [
        "step-000002", "step-000004", "step-000006", "step-000008"]
    after = metrics(run)
    assert [r["step"] for r in after] == list(range(1, 9))
    assert [r["loss"] for r in after] == [r["loss"] for r in before]  # steps 5-8 trained again, the same

    # a checkpoint of the rewound branch: refused before start-up in one line saying how to go back to it (it was
    # "holds a run"; with replace_run the run folder, branch included, was moved aside and the load failed)
    branch = aside / "checkpoints" / "step-000008"
    for replace in (False, True):
        back = small_config(tmp_path, run, dp=1, steps=8, interval=2, single_stage=True, name="back.yaml",
                            checkpoints={"keep_last": 4, "resume": str(branch), "replace_run": replace})
        proc = train_one(back, cwd=shards, check=False)
        assert proc.returncode == 1 and error_lines(proc.stderr) == [
            f"error: checkpoints.resume: {branch}: a checkpoint of a branch that a rewind moved aside ({aside}), not "
            f"one of this run's ({run / 'checkpoints'}); to go back to that branch, train it as a run of its own: "
            f"general.run_dir: {aside} and checkpoints.resume: {branch}"], proc.stderr
        assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) == sorted(
            ["checkpoints", "metrics.jsonl", aside.name])  # nothing moved
    # what it says works: the branch as a run folder of its own, resumed at its step 8 and trained on to 10
    branch_cfg = small_config(tmp_path, aside, dp=1, steps=10, interval=2, single_stage=True, name="branch.yaml",
                              checkpoints={"keep_last": 4, "resume": str(branch)})
    on = train_one(branch_cfg, cwd=shards)
    assert f"resumed from {branch} at step 8" in on.stdout
    assert [r["step"] for r in metrics(aside)] == list(range(1, 11))
    assert [r["loss"] for r in metrics(aside)][:8] == [r["loss"] for r in before]


def _run_with_checkpoints(tmp_path: Path, steps: list[int], latest: int, checkpoints_path: Path | None = None):
    """A config whose run folder holds complete ``step-N`` folders (a metadata.json each), ``latest`` and
    metrics; nothing is trained."""
    run = tmp_path / "run"
    c = build(merged(TWO_STAGE, general={"project": "t", "run": "r", "run_dir": str(run)},
                     checkpoints={"checkpoints_path": str(checkpoints_path) if checkpoints_path else None}))
    folder = checkpoints_path or run / "checkpoints"
    for s in steps:
        (folder / f"step-{s:06d}").mkdir(parents=True)
        (folder / f"step-{s:06d}" / "metadata.json").write_text(json.dumps({"step": s}))
    (folder / "latest").write_text(f"step-{latest:06d}\n")
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, latest + 1)))
    return c, run, folder


def test_a_rewind_that_fails_has_already_pointed_latest_at_the_resumed_checkpoint(tmp_path, monkeypatch):
    c, run, folder = _run_with_checkpoints(tmp_path, [3, 6, 9, 12], latest=12)

    def full_disk(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copy2", full_disk)  # the metrics copy fails before anything moves
    with pytest.raises(RunFolderError) as e:
        rewind(c, folder / "step-000006", 6)
    assert str(e.value).startswith(f"{folder}: rewinding to step 6: moving the 2 later checkpoints (step-000009, "
                                   f"step-000012) to {run}/rewound-")
    assert str(e.value).endswith("/checkpoints failed (No space left on device); nothing was moved; fix the cause "
                                 "and rerun")
    assert (folder / "latest").read_text() == "step-000006\n"
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl"]  # no empty rewound-* left
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-000003", "step-000006", "step-000009",
                                                        "step-000012"]


@pytest.mark.skipif(not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat("/tmp").st_dev,
                    reason="needs /dev/shm on another filesystem than /tmp")
def test_a_rewind_with_checkpoints_on_another_filesystem_moves_them_there(tmp_path):
    """checkpoints_path on another filesystem than run_dir: the rename into <run_dir>/rewound-* failed with EXDEV (a
    traceback, an empty rewound folder); the checkpoints go aside on their own filesystem, never copied."""
    shm = Path(os.environ.get("NANOSET_TEST_OTHER_FS", "/dev/shm")) / f"nanoset-test-{os.getpid()}-{tmp_path.name}"
    try:
        c, run, folder = _run_with_checkpoints(tmp_path, [3, 6, 9, 12], latest=12, checkpoints_path=shm / "ck")
        assert branch_folder(c, run / "rewound-T") == folder / "rewound-T"  # what --check names, before it moves
        rewound = rewind(c, folder / "step-000006", 6)
        (aside,) = run.glob("rewound-*")
        assert rewound.folder == aside and rewound.checkpoints == folder / aside.name
        assert rewound.describe() == (f"the run's later checkpoints were moved to {folder / aside.name} (on their own "
                                      f"filesystem), and a copy of metrics.jsonl made in {aside}")
        assert sorted(p.name for p in aside.iterdir()) == ["metrics.jsonl"]
        assert sorted(p.name for p in (folder / aside.name).iterdir()) == ["latest", "step-000009", "step-000012"]
        assert sorted(p.name for p in folder.iterdir()) == ["latest", aside.name, "step-000003", "step-000006"]
        assert (folder / "latest").read_text() == "step-000006\n"
        # its checkpoints are the branch's: resuming one says both folders of the branch
        cfg = tmp_path / "back.yaml"
        data = merged(TWO_STAGE, general={"project": "t", "run": "r", "run_dir": str(run)},
                      checkpoints={"checkpoints_path": str(folder), "resume": str(folder / aside.name / "step-000012"),
                                   "replace_run": True})
        cfg.write_text(yaml.safe_dump(data))
        with pytest.raises(ConfigError) as e:
            plan_start(load_config(cfg))
        assert str(e.value) == (
            f"checkpoints.resume: {folder / aside.name / 'step-000012'}: a checkpoint of a branch that a rewind moved "
            f"aside ({folder / aside.name}), not one of this run's ({folder}); to go back to that branch, train it as "
            f"a run of its own: general.run_dir: {aside}, checkpoints.checkpoints_path: {folder / aside.name} and "
            f"checkpoints.resume: {folder / aside.name / 'step-000012'}")
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_a_checkpoint_copied_into_the_run_folder_is_refused_before_replace_run_moves_it(tmp_path):
    c, run, folder = _run_with_checkpoints(tmp_path, [3, 6], latest=6)
    (run / "saved").mkdir()
    shutil.copytree(folder / "step-000003", run / "saved" / "step-000003")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(merged(TWO_STAGE, general={"project": "t", "run": "r", "run_dir": str(run)},
                                         checkpoints={"resume": str(run / "saved" / "step-000003"),
                                                      "replace_run": True})))
    with pytest.raises(ConfigError) as e:
        plan_start(load_config(cfg))
    assert str(e.value) == (f"checkpoints.resume: {run / 'saved' / 'step-000003'}: lies inside this run's folder "
                            f"{run} but is not one of its checkpoints ({folder}); move it out of the run folder first, "
                            f"or resume one of the run's own checkpoints")


def check_start(config, cwd) -> str:
    """The first line of ``nanoset train --check``: where the run starts."""
    proc = subprocess.run([sys.executable, "-m", "nanoset.cli", "train", "--config", str(config), "--check"], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[0]
