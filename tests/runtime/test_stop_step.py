"""The step a stop signal ends the run after: the step in progress when it came (was: two steps later, once the
step's line had been printed), in a run of one process and of two."""

from __future__ import annotations

import signal

from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import metrics, torchrun

# the real runtime.train main; the signal is sent to this process while step AT trains: in its forward or backward
# (before the step's numbers are reduced; WHEN "step"), in its optimizer update ("update") or while its metrics line
# is written ("line")
SIGNAL_IN_STEP = f'''
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
import torch
import torch.distributed as dist
from runtime.engine import Engine
from runtime.observe.metrics import MetricsLogger
AT, SIG, RANK, WHEN = int(os.environ["AT"]), int(os.environ["SIG"]), int(os.environ["TO_RANK"]), os.environ["WHEN"]
calls = {{"step": 0, "update": 0}}
step, update, log = Engine.train_step, torch.optim.Adam.step, MetricsLogger.log

def signal_at(when):
    if when == WHEN and dist.get_rank() == RANK:
        os.kill(os.getpid(), SIG)

def train_step(self, *a, **k):
    calls["step"] += 1
    if calls["step"] == AT:
        signal_at("step")
    return step(self, *a, **k)

def update_step(self, *a, **k):
    calls["update"] += 1
    if calls["update"] == AT:
        signal_at("update")
    return update(self, *a, **k)

def log_row(self, row, *a, **k):
    if row["step"] == AT:
        signal_at("line")
    return log(self, row, *a, **k)

Engine.train_step, torch.optim.AdamW.step, MetricsLogger.log = train_step, update_step, log_row
from runtime.train import main
sys.exit(main())
'''


def stopped_run(shards, tmp_path, nproc: int, at: int, sig: signal.Signals, to_rank: int = 0, when: str = "step"):
    script = tmp_path / "signal_in_step.py"
    script.write_text(SIGNAL_IN_STEP)
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=nproc, steps=8, interval=0, single_stage=True)
    env = {"AT": str(at), "SIG": str(int(sig)), "TO_RANK": str(to_rank), "WHEN": when}
    proc = torchrun(cfg, nproc, cwd=shards, script=script, env=env, check=False)
    return run, proc


def test_one_process_stops_after_the_step_the_signal_came_in(shards, tmp_path):
    run, proc = stopped_run(shards, tmp_path, 1, at=3, sig=signal.SIGTERM)
    assert proc.returncode == 1 and f"exitcode  : {128 + signal.SIGTERM} (pid" in proc.stderr, proc.stderr
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    assert f"stopped by SIGTERM after step 3: checkpoint {run / 'checkpoints' / 'step-000003'}; " in proc.stdout
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000003"


def test_one_process_stops_after_the_step_even_for_a_signal_in_its_update(shards, tmp_path):
    run, proc = stopped_run(shards, tmp_path, 1, at=2, sig=signal.SIGUSR1, when="update")
    assert [r["step"] for r in metrics(run)] == [1, 2], proc.stderr
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000002"


def test_two_ranks_stop_after_the_step_one_of_them_got_the_signal_in(shards, tmp_path):
    run, proc = stopped_run(shards, tmp_path, 2, at=2, sig=signal.SIGUSR1, to_rank=1)
    assert f"exitcode  : {128 + signal.SIGUSR1} (pid" in proc.stderr, proc.stderr
    assert [r["step"] for r in metrics(run)] == [1, 2]
    assert "stopped by SIGUSR1 (sent to another rank) after step 2: " in proc.stdout
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000002"


def test_two_ranks_stop_after_the_next_step_for_a_signal_after_the_reduction(shards, tmp_path):
    """Past the step's one reduction the ranks can learn of a signal only in the next step's."""
    run, proc = stopped_run(shards, tmp_path, 2, at=2, sig=signal.SIGUSR1, to_rank=1, when="line")
    assert [r["step"] for r in metrics(run)] == [1, 2, 3], proc.stderr
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000003"
