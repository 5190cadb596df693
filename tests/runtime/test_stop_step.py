"""The step a stop signal ends the run after: the step in progress when it came (was: two steps later, once the
step's line had been printed), in a run of one process and of two."""

from __future__ import annotations

import signal

from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import metrics, torchrun

# the real runtime.train main; the signal is sent to this process while step AT trains (in its forward or backward,
# before the step's numbers are reduced) or, with AFTER_REDUCTION, while its metrics line is written
SIGNAL_IN_STEP = f'''
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
import torch.distributed as dist
from runtime.engine import Engine
from runtime.metrics import MetricsLogger
AT, SIG, RANK, AFTER_REDUCTION = int(os.environ["AT"]), int(os.environ["SIG"]), int(os.environ["TO_RANK"]), \\
    os.environ.get("AFTER_REDUCTION") == "1"
calls = {{"n": 0}}
step = Engine.train_step
log = MetricsLogger.log

def train_step(self, *a, **k):
    calls["n"] += 1
    if calls["n"] == AT and not AFTER_REDUCTION and dist.get_rank() == RANK:
        os.kill(os.getpid(), SIG)
    return step(self, *a, **k)

def log_row(self, row, *a, **k):
    if row["step"] == AT and AFTER_REDUCTION and dist.get_rank() == RANK:
        os.kill(os.getpid(), SIG)
    return log(self, row, *a, **k)

Engine.train_step, MetricsLogger.log = train_step, log_row
from runtime.train import main
sys.exit(main())
'''


def stopped_run(shards, tmp_path, nproc: int, at: int, sig: signal.Signals, to_rank: int = 0,
                after_reduction: bool = False):
    script = tmp_path / "signal_in_step.py"
    script.write_text(SIGNAL_IN_STEP)
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=nproc, steps=8, interval=0, single_stage=True)
    env = {"AT": str(at), "SIG": str(int(sig)), "TO_RANK": str(to_rank), "AFTER_REDUCTION": str(int(after_reduction))}
    proc = torchrun(cfg, nproc, cwd=shards, script=script, env=env, check=False)
    return run, proc


def test_one_process_stops_after_the_step_the_signal_came_in(shards, tmp_path):
    run, proc = stopped_run(shards, tmp_path, 1, at=3, sig=signal.SIGTERM)
    assert proc.returncode == 1 and f"exitcode  : {128 + signal.SIGTERM} (pid" in proc.stderr, proc.stderr
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    assert f"stopped by SIGTERM after step 3: checkpoint {run / 'checkpoints' / 'step-000003'}; " in proc.stdout
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000003"


def test_one_process_stops_after_the_step_even_for_a_signal_after_its_reduction(shards, tmp_path):
    run, proc = stopped_run(shards, tmp_path, 1, at=2, sig=signal.SIGUSR1, after_reduction=True)
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
    run, proc = stopped_run(shards, tmp_path, 2, at=2, sig=signal.SIGUSR1, to_rank=1, after_reduction=True)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3], proc.stderr
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000003"
