"""Checkpoints written in the background: the same losses as written in the loop, a resume from them exact, the
previous checkpoint still `latest` after a kill during a background write, and each checkpointing step's row
carrying how long the loop was blocked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import metrics, train_one

# the real runtime.train main; the background write of step 6's checkpoint kills the process
KILLED_IN_BACKGROUND_WRITE = f'''
import os, signal, sys, threading
sys.path.insert(0, {str(ROOT)!r})
from torch.distributed.checkpoint import FileSystemWriter
write = FileSystemWriter.write_data

def write_and_die(self, plan, planner):
    if "step-000006" in str(self.path):
        assert threading.current_thread() is not threading.main_thread()
        os.kill(os.getpid(), signal.SIGKILL)
    return write(self, plan, planner)

FileSystemWriter.write_data = write_and_die
from runtime.train import main
sys.exit(main())
'''


def config(folder, run, background: bool):
    folder.mkdir(exist_ok=True)
    return small_config(folder, run, dp=1, steps=8, interval=3, single_stage=True,
                        checkpoints={"async_save": background})


def training(rows):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows if "val" not in r]


@pytest.fixture(scope="module")
def in_the_loop(shards, tmp_path_factory):
    """Written in the loop (async_save: false): 8 steps, checkpoints at 3, 6 and 8."""
    run = tmp_path_factory.mktemp("sync") / "run"
    train_one(config(run.parent, run, background=False), shards)
    return metrics(run)


def test_background_checkpoints_give_the_same_losses_and_resume_exactly(in_the_loop, shards, tmp_path):
    run = tmp_path / "run"
    cfg = config(tmp_path, run, background=True)
    killed = train_one(cfg, shards, env={"NANOSET_FAULT_KILL_AT_STEP": "7"}, check=False)
    assert killed.returncode == -signal.SIGKILL
    again = train_one(cfg, shards)
    assert "resumed from" in again.stdout
    rows = metrics(run)
    assert training(rows) == training(in_the_loop)
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000008"
    for sync, background in zip(in_the_loop, rows):
        blocked = [r.get("checkpoint_blocking_s") for r in (sync, background)]
        if sync["step"] in (3, 6, 8):  # every checkpointing step's row, written in the loop or in the background
            assert all(isinstance(b, float) and b >= 0 for b in blocked), (sync, background)
        else:
            assert blocked == [None, None]
    assert "written in the background in" in again.stdout


def test_a_kill_during_the_background_write_leaves_the_previous_checkpoint_latest(in_the_loop, shards, tmp_path):
    script = tmp_path / "killed_in_write.py"
    script.write_text(KILLED_IN_BACKGROUND_WRITE)
    run = tmp_path / "run"
    cfg = config(tmp_path, run, background=True)
    killed = subprocess.run([sys.executable, str(script), "--config", str(cfg)], cwd=shards, capture_output=True,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # killed by the write itself, in its thread
    checkpoints = run / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step-000003"
    assert not (checkpoints / "step-000006").exists()
    again = train_one(cfg, shards)
    assert f"resumed from {checkpoints / 'step-000003'} at step 3" in again.stdout
    assert training(metrics(run)) == training(in_the_loop)
