"""One run per folder, kept whole: pruning by step number, metrics without duplicate steps or torn
tails, fresh starts refused where a run exists, checkpoints of another model refused, and every
such mistake printed once, as one line, before any process group."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from runtime.checkpoint.run_folder import run_lock
from runtime.checkpoint.store import CheckpointManager
from runtime.config.load import load_config
from runtime.observe.metrics import MetricsLogger
from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import error_lines, metrics, torchrun, train_one, worker_stderr


def tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def losses(rows):
    return [r["loss"] for r in rows]


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    """One process, one stage, 4 steps, checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("ref") / "run"
    cfg = small_config(run.parent, run, dp=1, steps=4, interval=2, single_stage=True)
    train_one(cfg, shards)
    return run, metrics(run)


def copy_of(reference, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    return run


def make_checkpoints(folder, names, latest):
    for name in names:
        (folder / name).mkdir(parents=True)
        (folder / name / "metadata.json").write_text("{}")
    (folder / "latest").write_text(latest + "\n")


def test_prune_sorts_by_step_number_and_keeps_latest(tmp_path):
    a = tmp_path / "a"
    make_checkpoints(a, ["step-997000", "step-998000", "step-999000", "step-1000000"], latest="step-1000000")
    CheckpointManager(a, keep_last=3, is_writer=True)._prune(keep="step-1000000")
    assert sorted(p.name for p in a.iterdir()) == ["latest", "step-1000000", "step-998000", "step-999000"]
    # newer step folders than the one just written (and named by latest): it is kept all the same
    b = tmp_path / "b"
    make_checkpoints(b, ["step-000010", "step-000020", "step-000030", "step-000005"], latest="step-000005")
    CheckpointManager(b, keep_last=2, is_writer=True)._prune(keep="step-000005")
    assert sorted(p.name for p in b.iterdir()) == ["latest", "step-000005", "step-000020", "step-000030"]


def test_metrics_keep_one_line_per_step_and_drop_a_torn_tail(tmp_path):
    lines = [{"step": s, "loss": float(s)} for s in (1, 2, 3)] + [{"step": s, "loss": 10.0 + s} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 3, "lo')
    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=False)
    logger.truncate_after(2)
    assert metrics(tmp_path) == [{"step": 1, "loss": 11.0}, {"step": 2, "loss": 12.0}]  # the rerun's lines
    logger.truncate_after(0)
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert not [p.name for p in tmp_path.iterdir() if p.name != "metrics.jsonl"]  # no temporary file left


def test_tensorboard_missing_is_said_once(tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name == "torch.utils.tensorboard":
            raise ModuleNotFoundError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=True)
    assert logger.tb is None
    assert capsys.readouterr().out.splitlines() == [
        "note: TensorBoard events are off: the tensorboard package is not installed "
        "(pip install -e '.[tensorboard]' in the checkout, or set logging.tensorboard: false)"]


def test_crash_before_the_first_checkpoint_then_rerun(reference, shards, tmp_path):
    """Killed at step 1 (no checkpoint yet) with half a line written: the rerun logs each step once."""
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=4, interval=2, single_stage=True)
    killed = train_one(cfg, shards, env={"NANOSET_FAULT_KILL_AT_STEP": "1"}, check=False)
    assert killed.returncode != 0 and [r["step"] for r in metrics(run)] == [1]
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "stage": "pretr')  # killed mid-write
    train_one(cfg, shards)
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert losses(rows) == losses(reference[1])


def test_fresh_start_in_a_run_folder_is_refused_unless_replaced(reference, shards, tmp_path):
    run = copy_of(reference, tmp_path)
    before = tree(run)
    cfg = small_config(tmp_path, run, dp=1, steps=3, interval=2, single_stage=True, checkpoints={"resume": None})
    proc = train_one(cfg, shards, check=False)
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        f"error: {run}: holds a run ({run}/metrics.jsonl, {run}/checkpoints) and this config starts fresh; set "
        f"checkpoints.resume: latest to continue it, checkpoints.replace_run: true to move it aside, or another "
        f"general.run_dir"]
    assert tree(run) == before  # nothing touched
    cfg = small_config(tmp_path, run, dp=1, steps=3, interval=2, single_stage=True,
                       checkpoints={"resume": None, "replace_run": True})
    proc = train_one(cfg, shards)
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert f"the previous run was moved to {old}" in proc.stdout
    assert tree(old) == before
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3] and losses(rows)[:2] == losses(reference[1])[:2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000002", "step-000003"]


def test_replace_run_through_a_symlinked_run_dir(reference, shards, tmp_path):
    """run_dir is a link: the old run (the link's target) is moved aside and the new one written through
    the link (was: FileExistsError traceback after start-up, the link left dangling)."""
    real = copy_of(reference, tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real)
    before = tree(real)
    cfg = small_config(tmp_path, link, dp=1, steps=2, interval=2, single_stage=True,
                       checkpoints={"resume": None, "replace_run": True})
    train_one(cfg, shards)
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert tree(old) == before and link.is_symlink() and link.resolve() == real
    assert [r["step"] for r in metrics(real)] == [1, 2]
    assert sorted(p.name for p in (real / "checkpoints").iterdir()) == ["latest", "step-000002"]


def test_a_kill_while_deleting_a_checkpoint_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    """Pruning (or replacing a checkpoint of the same step) renames the folder before deleting it: a kill
    midway leaves a stale temporary folder, removed on the next start, never a step-N folder whose
    metadata.json outlived its shards."""
    import runtime.checkpoint.store as checkpoint
    from runtime.checkpoint.layout import saved_checkpoints

    folder = tmp_path / "checkpoints"
    make_checkpoints(folder, ["step-000002", "step-000004", "step-000006"], latest="step-000006")
    for name in ("step-000002", "step-000004", "step-000006"):
        (folder / name / "__0_0.distcp").write_bytes(b"shard")
    real_rmtree = shutil.rmtree

    def killed_midway(path, ignore_errors=False):
        if (path / "__0_0.distcp").exists():
            (path / "__0_0.distcp").unlink()
            raise KeyboardInterrupt  # the process dies here
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_midway)
    manager = CheckpointManager(folder, keep_last=2, is_writer=True)
    with pytest.raises(KeyboardInterrupt):
        manager._prune(keep="step-000006")
    assert [p.name for p in saved_checkpoints(folder)] == ["step-000004", "step-000006"]
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    manager.clean_stale()
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-000004", "step-000006"]


def test_checkpoint_of_another_model_is_refused_once(reference, shards, tmp_path):
    run = copy_of(reference, tmp_path)
    cfg = small_config(tmp_path, run, dp=2, steps=4, interval=2, single_stage=True,
                       model={"num_hidden_layers": 4, "intermediate_size": 128})
    proc = torchrun(cfg, 2, cwd=shards, check=False)
    assert proc.returncode != 0
    assert error_lines(proc.stderr) == [
        f"error: checkpoints.resume: {run}/checkpoints/step-000004: saved with another model: model.num_hidden_layers "
        f"2 → 4, model.intermediate_size 64 → 128; use the checkpoint's model section in the config, or set "
        f"checkpoints.resume to another checkpoint"]
    assert "Traceback" not in worker_stderr(proc.stderr) and "/runtime/" not in worker_stderr(proc.stderr)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


def test_resume_from_a_torn_checkpoint_is_one_line_naming_an_earlier_one(reference, shards, tmp_path):
    """DCP's CheckpointException (a BaseException) on a torn shard was a traceback from every rank."""
    run = copy_of(reference, tmp_path)
    ckpts = run / "checkpoints"
    (ckpts / "step-000004" / "__0_0.distcp").write_bytes(b"torn")
    cfg = small_config(tmp_path, run, dp=1, steps=6, interval=2, single_stage=True)
    proc = train_one(cfg, shards, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {ckpts / 'step-000004'}: the DCP files are unreadable (") and line.endswith(
        f"); set checkpoints.resume: {ckpts / 'step-000002'} (an earlier checkpoint) and rerun")
    (ckpts / "step-000002" / ".metadata").unlink()
    cfg = small_config(tmp_path, run, dp=1, steps=6, interval=2, single_stage=True,
                       checkpoints={"resume": str(ckpts / "step-000002")})
    proc = train_one(cfg, shards, check=False)
    assert proc.returncode == 1 and proc.stderr == (
        f"error: {ckpts / 'step-000002'}: the DCP files are unreadable (.metadata is missing); no earlier checkpoint "
        f"is there: start over (checkpoints.resume: null, checkpoints.replace_run: true)\n")
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


def test_the_hint_for_a_damaged_checkpoint_names_the_newest_earlier_one(tmp_path):
    from runtime.checkpoint.layout import earlier_checkpoints_hint

    make_checkpoints(tmp_path, ["step-000002", "step-000004", "step-000010", "best"], latest="step-000010")
    (tmp_path / "step-000008").mkdir()  # incomplete (no metadata.json): never suggested
    assert earlier_checkpoints_hint(tmp_path / "step-000010") == (
        f"set checkpoints.resume: {tmp_path / 'step-000004'} (an earlier checkpoint) and rerun")
    assert earlier_checkpoints_hint(tmp_path / "step-000002") == (
        "no earlier checkpoint is there: start over (checkpoints.resume: null, checkpoints.replace_run: true)")
    assert earlier_checkpoints_hint(tmp_path / "best") == "set checkpoints.resume to another checkpoint and rerun"


def test_a_torn_rng_file_of_another_rank_stops_every_rank_with_one_line(shards, tmp_path):
    """Only rank 1 reads rng-rank1.pt: its failure is shared, so rank 0 does not train on alone into a hang."""
    run = tmp_path / "run"
    train = small_config(tmp_path, run, dp=2, steps=2, interval=2, single_stage=True)
    torchrun(train, 2, cwd=shards)
    (run / "checkpoints" / "step-000002" / "rng-rank1.pt").write_bytes(b"torn")
    proc = torchrun(small_config(tmp_path, run, dp=2, steps=4, interval=2, single_stage=True), 2, cwd=shards,
                    check=False)
    assert proc.returncode != 0 and "Traceback" not in worker_stderr(proc.stderr)
    (line,) = error_lines(proc.stderr)
    assert line.startswith(f"error: {run}/checkpoints/step-000002: unreadable RNG file rng-rank1.pt (")
    assert line.endswith("); no earlier checkpoint is there: start over (checkpoints.resume: null, "
                         "checkpoints.replace_run: true)")
    assert [r["step"] for r in metrics(run)] == [1, 2]


@pytest.mark.parametrize("case", ["missing-path", "dangling-latest", "layers-pp2", "not-a-checkpoint",
                                  "run-dir-in-a-file", "latest-typo", "past-train-steps", "checkpoints-path-in-proc"])
def test_user_mistakes_are_one_line_before_start_up(reference, shards, tmp_path, case):
    run = tmp_path / "run"
    if case == "latest-typo":
        cfg = small_config(tmp_path, run, checkpoints={"resume": "lastest"})
        expected = ("error: checkpoints.resume: lastest: no such folder (latest | PATH of a step-N folder | null); "
                    "did you mean 'latest'?")
    elif case == "past-train-steps":  # was: exit 0 after "done: step 4/2", nothing trained
        run = copy_of(reference, tmp_path)
        (run / "metrics.jsonl").unlink()
        cfg = small_config(tmp_path, run, steps=2, single_stage=True)
        expected = (f"error: checkpoints.resume: {run}/checkpoints/step-000004: at step 4, past tokens.train_steps 2; "
                    f"raise tokens.train_steps or set checkpoints.resume to an earlier checkpoint")
    elif case == "not-a-checkpoint":  # a metadata.json that is no training record (was: AttributeError traceback)
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "metadata.json").write_text("[1]")
        cfg = small_config(tmp_path, run, checkpoints={"resume": str(tmp_path / "other")})
        expected = (f"error: {tmp_path}/other/metadata.json: not a training checkpoint's metadata (TypeError: a JSON "
                    f"list, not an object); give a step-N folder that a run saved")
    elif case == "run-dir-in-a-file":  # was: FileExistsError traceback from rank 0 after start-up
        (tmp_path / "file").write_text("")
        run = tmp_path / "file" / "run"
        cfg = small_config(tmp_path, run)
        expected = (f"error: general.run_dir: {run}: {tmp_path}/file is not a folder; choose another "
                    f"general.run_dir")
    elif case == "checkpoints-path-in-proc":  # os.access says yes to root: was a bare [Errno 2] at the first save
        cfg = small_config(tmp_path, run, checkpoints={"checkpoints_path": "/proc/nope/x"})
        expected = ("error: checkpoints.checkpoints_path: /proc/nope/x: " + (
            "cannot create a folder in /proc (No such file or directory); choose another checkpoints.checkpoints_path"
            if os.geteuid() == 0 else "cannot write in /proc; choose another checkpoints.checkpoints_path or make it "
                                      "writable"))
    elif case == "missing-path":
        cfg = small_config(tmp_path, run, checkpoints={"resume": str(tmp_path / "nope" / "step-000040")})
        expected = (f"error: checkpoints.resume: {tmp_path}/nope/step-000040: no such folder "
                    f"(latest | PATH of a step-N folder | null)")
    elif case == "dangling-latest":
        make_checkpoints(run / "checkpoints", ["step-000020", "step-000030"], latest="step-000040")
        cfg = small_config(tmp_path, run)
        expected = (f"error: checkpoints.resume: latest: {run}/checkpoints/latest names step-000040, which is missing "
                    f"or incomplete (checkpoints there: step-000020, step-000030); set checkpoints.resume to the path "
                    f"of one of them")
    else:
        cfg = small_config(tmp_path, run, dp=1, parallelism={"pp": 2}, model={"num_hidden_layers": 1})
        expected = f"error: {cfg}: model.num_hidden_layers 1 < 2 pipeline stages (parallelism.pp 2)"
    proc = torchrun(cfg, 2, cwd=shards, check=False)
    assert proc.returncode != 0
    assert error_lines(proc.stderr) == [expected]
    assert "Traceback" not in worker_stderr(proc.stderr) and "/runtime/" not in worker_stderr(proc.stderr)
    assert not (run / "metrics.jsonl").exists()


def test_rng_state_loads_with_weights_only(tmp_path):
    """The per-rank RNG file holds tensors, lists and numbers only: ``torch.load(weights_only=True)``."""
    import random

    import numpy as np
    import torch

    from runtime.checkpoint.store import _rng_state, _set_rng_state

    torch.manual_seed(3), np.random.seed(4), random.seed(5), np.random.standard_normal()  # a cached gaussian too
    torch.save(_rng_state(), tmp_path / "rng.pt")
    expected = (torch.rand(3).tolist(), np.random.standard_normal(3).tolist(), random.random())
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    _set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (torch.rand(3).tolist(), np.random.standard_normal(3).tolist(), random.random()) == expected


def test_the_stop_message_says_how_to_resume(tmp_path, capsys):
    """After a preemption, "rerun the same command" is true only with resume: latest (null would start
    over or be refused, a path would rewind to it)."""
    from pathlib import Path
    from types import SimpleNamespace

    from runtime.trainer import Trainer, TrainSummary

    for resume, how in (("latest", "rerun the same command"), (None, "set checkpoints.resume: latest and rerun"),
                        ("/elsewhere/step-000002", "set checkpoints.resume: latest and rerun")):
        trainer = SimpleNamespace(config=SimpleNamespace(checkpoints=SimpleNamespace(resume=resume)),
                                  metrics=MetricsLogger(tmp_path, enabled=True, tensorboard=False))
        summary = TrainSummary(4, checkpoint=Path("run/checkpoints/step-000004"), stopped_by_signal=True)
        Trainer._print_summary(trainer, summary, "SIGTERM")
        assert capsys.readouterr().out == (f"stopped by SIGTERM after step 4: checkpoint run/checkpoints/step-000004; "
                                           f"{how} to resume\n")


def test_a_second_launch_of_a_running_run_is_refused(shards, tmp_path):
    """The same run started twice at once (submitted twice, or requeued while it still runs) would write
    metrics and checkpoints into one folder from two jobs: the second is refused in one line."""
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=4, interval=2, single_stage=True)
    slow = tmp_path / "slow.py"
    slow.write_text("import sys, time\nfrom runtime.engine import Engine\nstep = Engine.train_step\n"
                    "Engine.train_step = lambda self, *a, **k: time.sleep(2) or step(self, *a, **k)\n"
                    "from runtime.train import main\nsys.exit(main())\n")
    first = subprocess.Popen([sys.executable, str(slow), "--config", str(cfg)], cwd=shards, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        while not (run / "metrics.jsonl").is_file():
            assert first.poll() is None, first.communicate()
            time.sleep(0.1)
        second = train_one(cfg, shards, check=False)
        assert second.returncode == 1 and second.stderr.splitlines() == [
            f"error: {run}: another run is training in this folder ({os.uname().nodename} pid {first.pid}); wait for "
            f"it to end or stop it, or choose another general.run_dir"]
    finally:
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]
    train_one(cfg, shards)  # once it has ended, the same command runs (nothing left to train)


def test_a_run_folder_without_file_locks_still_starts(tmp_path, monkeypatch):
    """Only a lock held by another process refuses a start: on a filesystem without locks (ENOSYS) the run
    starts unlocked rather than being refused forever."""
    import errno
    import fcntl

    from runtime.startup import plan_start

    def no_locks(*args):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    config = load_config(small_config(tmp_path, tmp_path / "run", dp=1, single_stage=True))
    start = plan_start(config)
    assert (start.checkpoint, start.lock, start.replace_old_run) == (None, None, False)


def test_paths_with_a_tilde_are_in_the_home_folder(tmp_path, monkeypatch):
    """YAML leaves `~` alone: run_dir: ~/runs/x made a folder named `~` in the working directory."""
    import yaml

    from runtime.checkpoint.layout import checkpoints_folder

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = small_config(tmp_path, "~/runs/x", single_stage=True, general={"cache_dir": "~/cache"},
                       checkpoints={"checkpoints_path": "~/ck", "resume": "~/ck/step-000002"})
    config = load_config(cfg)
    home = tmp_path / "home"
    found = (config.general.run_path, checkpoints_folder(config), config.general.cache_dir, config.checkpoints.resume)
    assert found == (home / "runs" / "x", home / "ck", str(home / "cache"), str(home / "ck" / "step-000002"))
    cfg.write_text(yaml.safe_dump(config.to_dict()))  # as a checkpoint's metadata records it
    assert load_config(cfg).general.run_path == home / "runs" / "x"
    from runtime.config import ModelArgs

    assert ModelArgs(init_from_hf="~/models/llama").init_from_hf == str(home / "models" / "llama")


def test_only_the_reporter_prints_and_its_node_mates_wait_for_torchrun(monkeypatch, capsys):
    """A rank that exits first gets the reporter killed by torchrun, maybe before it prints (seen under load):
    the reporter's node mates wait for torchrun to stop them; ranks of other nodes print nothing."""
    from runtime import train

    slept: list[float] = []
    monkeypatch.setattr(train.time, "sleep", slept.append)
    train.report_once(ValueError("x: bad"), reporter=True)
    assert (slept, capsys.readouterr().err) == ([], "error: x: bad\n")
    train.report_once(ValueError("x: bad"), reporter=False, reporters_node=False)
    assert (slept, capsys.readouterr().err) == ([], "")
    train.report_once(ValueError("x: bad"), reporter=False)  # still alive after the grace time: say it
    assert (slept, capsys.readouterr().err) == ([train.REPORT_GRACE_S], "error: x: bad\n")


def test_checkpoint_mistakes_advise_what_the_command_takes(shards, tmp_path):
    """A checkpoints folder whose `latest` names a checkpoint that is gone, given to each command that takes a
    checkpoint: `nanoset export`, `explain --checkpoint` and `evaluate --checkpoint` users were told to "set
    checkpoints.resume to one of them" (a config key of the trainer), with three different line starts. Each line
    starts with how the checkpoint was named and advises in those terms (the trainer's: test above)."""
    folder = tmp_path / "run" / "checkpoints"
    make_checkpoints(folder, ["step-000020", "step-000030"], latest="step-000040")
    cfg = small_config(tmp_path, tmp_path / "other", dp=1, single_stage=True)
    d = yaml.safe_load(cfg.read_text())
    d["validation"] = {"datasets": {"v": "shards/sft"}}
    cfg.write_text(yaml.safe_dump(d))
    problem = (f"{folder}/latest names step-000040, which is missing or incomplete (checkpoints there: step-000020, "
               f"step-000030)")
    commands = {
        "export": ([str(folder), str(tmp_path / "hf")],
                   f"checkpoint {folder}: {problem}; give the path of one of them as the checkpoint"),
        "explain": (["--config", str(cfg), "--checkpoint", str(folder), "--step", "1"],
                    f"--checkpoint {folder}: {problem}; pass the path of one of them as --checkpoint"),
        "evaluate": (["--config", str(cfg), "--checkpoint", str(folder)],
                     f"--checkpoint {folder}: {problem}; pass the path of one of them as --checkpoint"),
    }
    for command, (args, line) in commands.items():
        proc = subprocess.run([sys.executable, "-m", f"runtime.{command}", *args], capture_output=True, text=True,
                              cwd=shards, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        assert (proc.returncode, proc.stderr) == (1, f"error: {line}\n"), command
    assert not (tmp_path / "hf").exists()


HOLD_LOCK = """
import sys, time
sys.path.insert(0, {root!r})
from runtime.config.load import load_config
from runtime.checkpoint.run_folder import run_lock
held = run_lock(load_config({cfg!r}))
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_run_sharing_the_checkpoints_folder_is_refused_while_the_first_trains(shards, tmp_path):
    """Two runs with their own run_dir but one checkpoints.checkpoints_path: the lock was on run_dir only, so the
    second resumed the first's in-flight `latest` and both wrote (and replaced, and pruned) step-N folders in one
    folder: each run's summary then named checkpoints holding the other's weights."""
    from nanoset.errors import RunFolderError
    from runtime.startup import plan_start

    shared = tmp_path / "shared-checkpoints"
    cfg_a = small_config(tmp_path, tmp_path / "a", dp=1, name="a.yaml", checkpoints={"checkpoints_path": str(shared)})
    cfg_b = small_config(tmp_path, tmp_path / "b", dp=1, name="b.yaml", checkpoints={"checkpoints_path": str(shared)})
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK.format(root=str(ROOT), cfg=str(cfg_a))],
                              stdout=subprocess.PIPE, text=True, cwd=shards)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderError) as e:
            plan_start(load_config(cfg_b))
        assert str(e.value) == (f"{shared}: another run is training with this checkpoints folder "
                                f"({os.uname().nodename} pid {holder.pid}); wait for it to end or stop it, or choose "
                                f"another checkpoints.checkpoints_path")
    finally:
        holder.kill()
        holder.wait()
    held = run_lock(load_config(cfg_b))  # once the first is gone, the second takes both locks
    assert held is not None and len(held.files) == 2
    held.close()
