"""Cluster launches with real torchrun processes: two agents as two nodes on localhost, and
preemption by a real signal (SIGTERM to torchrun, SIGUSR1 to a single worker)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import error_lines, free_port, metrics, torchrun, worker_stderr

# the real runtime.train main, each step slowed down so that a signal reliably arrives mid-run
SLOW_TRAIN = f'''
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from runtime.engine import Engine
step = Engine.train_step
Engine.train_step = lambda self, *a, **k: time.sleep(0.4) or step(self, *a, **k)
from runtime.train import main
sys.exit(main())
'''
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def reference(two_stage_run):
    """One agent, two processes (dp=2), two stages, 12 steps, checkpoints every 3."""
    return two_stage_run.run_dir, two_stage_run.rows


def losses(rows):
    return [r["loss"] for r in rows]


def test_two_nodes_train_like_one(reference, shards, tmp_path):
    """Two torchrun agents on localhost, one process each, rendezvous over c10d: the same losses as one
    agent with two processes, and the shared run folder written once (by global rank 0)."""
    ref_run, ref_rows = reference
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run)
    port = free_port()
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-nodes",
         str(ROOT / "runtime" / "train.py"), "--config", str(cfg)],
        cwd=shards, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    outs = [a.communicate(timeout=600) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], outs
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert losses(rows) == losses(ref_rows)
    assert [r["data_hash"] for r in rows] == [r["data_hash"] for r in ref_rows]
    assert sum("done: step 12/12" in out for out, _ in outs) == 1  # one report, from global rank 0
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == sorted(p.name for p in (ref_run / "checkpoints").iterdir())
    assert sorted(p.name for p in (run / "checkpoints" / "step-000012").iterdir()) == sorted(
        p.name for p in (ref_run / "checkpoints" / "step-000012").iterdir())
    assert sorted(p.name for p in run.iterdir()) == [".nanoset-run.lock", "checkpoints", "metrics.jsonl"]


def start_slow(cfg: Path, tmp_path: Path, shards: Path, new_session: bool = False) -> subprocess.Popen:
    script = tmp_path / "slow_train.py"
    script.write_text(SLOW_TRAIN)
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(script), "--config", str(cfg)], cwd=shards, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=new_session)


def wait_for_step(run: Path, step: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").is_file() and len((run / "metrics.jsonl").read_text().splitlines()) >= step:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run never reached step {step}: {proc.communicate()}")


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return sorted(out)


def stopped_at(stdout: str, signal_name: str) -> int:
    (line,) = [line for line in stdout.splitlines() if line.startswith("stopped by ")]
    step = int(line.split(" after step ")[1].split(":")[0])
    assert line.startswith(f"stopped by {signal_name} after step {step}: checkpoint ") and line.endswith(
        f"step-{step:06d}; rerun the same command to resume"), line
    return step


def test_sigterm_to_torchrun_saves_once_and_resumes_bit_identically(reference, shards, tmp_path):
    _, ref_rows = reference
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run)
    proc = start_slow(cfg, tmp_path, shards)
    wait_for_step(run, 4, proc)
    proc.send_signal(signal.SIGTERM)  # torchrun forwards it to both workers
    out, err = proc.communicate(timeout=120)
    step = stopped_at(out, "SIGTERM")
    assert 4 <= step < 12, (out, err)
    # torchrun itself re-raises the signal after its workers exit (its own traceback); none from the workers
    assert "Traceback" not in worker_stderr(err) and "/runtime/" not in err
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == f"step-{step:06d}"
    assert [r["step"] for r in metrics(run)] == list(range(1, step + 1))
    rerun = start_slow(cfg, tmp_path, shards)  # the same command
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert f"resumed from {ckpts / f'step-{step:06d}'} at step {step}" in out
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert losses(rows) == losses(ref_rows)  # bit-identical to the uninterrupted run


def test_sigusr1_to_one_worker_stops_every_rank(shards, tmp_path):
    """Only one rank gets the signal: the ranks agree (MAX of their signals each step), both stop after the
    same step, save one checkpoint together and exit 128 + SIGUSR1 (torchrun reports it and exits 1)."""
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run)
    proc = start_slow(cfg, tmp_path, shards)
    wait_for_step(run, 2, proc)
    workers = children(proc.pid)
    assert len(workers) == 2
    os.kill(workers[-1], signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and f"exitcode  : {128 + signal.SIGUSR1} (pid" in err, err
    step = stopped_at(out, "SIGUSR1 (sent to another rank)" if "(sent to another rank)" in out else "SIGUSR1")
    assert 2 <= step < 12
    saved = run / "checkpoints" / f"step-{step:06d}"
    assert (run / "checkpoints" / "latest").read_text().strip() == saved.name
    assert {"rng-rank0.pt", "rng-rank1.pt", "metadata.json"} <= {p.name for p in saved.iterdir()}
    assert [r["step"] for r in metrics(run)] == list(range(1, step + 1))


def hold_like_a_loader_worker(ready) -> None:
    from runtime.control.preemption import ignore_in_loader_worker

    ignore_in_loader_worker()
    ready.set()
    time.sleep(60)


def test_a_loader_worker_outlives_outside_signals_but_not_its_parents_terminate():
    """SIGTERM/SIGUSR1 from elsewhere (Slurm) are ignored; SIGTERM from the parent (the DataLoader ending a
    worker that would not stop: ``Process.terminate``) still ends it, so a stuck worker never hangs the exit."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    worker = ctx.Process(target=hold_like_a_loader_worker, args=(ready,), daemon=True)
    worker.start()
    assert ready.wait(30)
    for sig in ("-TERM", "-USR1"):
        subprocess.run(["kill", sig, str(worker.pid)], check=True)  # another process sends it
    time.sleep(0.5)
    assert worker.is_alive()
    worker.terminate()
    worker.join(10)
    assert worker.exitcode == 128 + signal.SIGTERM


def test_sigterm_to_every_process_of_the_job_step(shards, tmp_path):
    """Slurm signals every process of the step: torchrun (which forwards it, so the ranks get it twice),
    the ranks and their loader workers. The workers ignore it; the ranks stop after one step with one
    checkpoint (was: "DataLoader worker (pid N) is killed by signal: Terminated" in the middle of the save)."""
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, single_stage=True)
    config = yaml.safe_load(cfg.read_text())
    config["data_stages"][0]["data"]["num_loading_workers"] = 1
    cfg.write_text(yaml.safe_dump(config))
    proc = start_slow(cfg, tmp_path, shards, new_session=True)
    wait_for_step(run, 3, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    step = stopped_at(out, "SIGTERM")
    assert 3 <= step < 12 and "DataLoader worker" not in err and "Traceback" not in worker_stderr(err), err
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step-{step:06d}"
    assert [r["step"] for r in metrics(run)] == list(range(1, step + 1))


SIGNAL_DURING_SAVE = f'''
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
import torch.distributed as dist
from runtime.checkpoint.store import CheckpointManager
save = CheckpointManager.save

def save_and_get_a_signal(self, engine, step, metadata, **kwargs):
    if step == 3 and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGUSR1)  # arrives while the checkpoint of step 3 is written
    return save(self, engine, step, metadata, **kwargs)

CheckpointManager.save = save_and_get_a_signal
from runtime.train import main
sys.exit(main())
'''


def test_a_signal_during_a_checkpoint_save_stops_on_that_checkpoint(shards, tmp_path):
    """The checkpoint being written when the signal comes is the one: no further step and no second save
    (was: one more step and another checkpoint, both inside the scheduler's grace time)."""
    script = tmp_path / "signal_in_save.py"
    script.write_text(SIGNAL_DURING_SAVE)
    run = tmp_path / "run"
    proc = torchrun(small_config(tmp_path, run, single_stage=True), 2, cwd=shards, script=script, check=False)
    assert proc.returncode == 1 and f"exitcode  : {128 + signal.SIGUSR1} (pid" in proc.stderr, proc.stderr
    assert stopped_at(proc.stdout, "SIGUSR1 (sent to another rank)") == 3  # rank 0 speaks: rank 1 got it
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000003"]
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]


def test_a_node_that_sees_other_data_is_refused(shards, tmp_path):
    """Two nodes started in different directories: the relative folder shards/web is another dataset on
    node 1. Each rank would read its rows of every batch from what it sees; instead both stop after
    start-up with one error (from global rank 0) naming the folders each sees."""
    import shutil

    other = tmp_path / "node1"
    shutil.copytree(shards / "shards" / "code", other / "shards" / "code")
    shutil.copytree(shards / "shards" / "sft", other / "shards" / "web")  # the same name, other content
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, single_stage=True)
    port = free_port()
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-views",
         str(ROOT / "runtime" / "train.py"), "--config", str(cfg)],
        cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node, cwd in ((0, shards), (1, other))]
    outs = [a.communicate(timeout=600) for a in agents]
    assert all(a.returncode != 0 for a in agents)
    errors = [line for _, err in outs for line in err.splitlines() if line.startswith("error:")]
    mine = [str(shards / "shards" / name) for name in ("web", "code")]
    theirs = [str(other / "shards" / name) for name in ("web", "code")]
    assert errors == [f"error: rank 1 sees other data than rank 0 (datasets {theirs} against {mine}); every node must "
                      f"see the same dataset folders: use absolute paths, or start every node in the same directory"]
    assert not (run / "metrics.jsonl").exists() or metrics(run) == []


def nanoset_train(*args, cwd: Path, env: dict | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nanoset.cli", "train", *map(str, args)], cwd=cwd, env=env or ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_nanoset_train_checks_once_and_says_a_mistake_in_one_line(shards, tmp_path):
    """torchrun runtime/train.py followed each worker's one line with ~40 lines of its own report (and argparse's
    usage once per rank); the launcher checks before any worker exists and prints the plan with --check."""
    cfg = small_config(tmp_path, tmp_path / "run")
    check = nanoset_train("--config", cfg, "--check", cwd=shards)
    out, err = check.communicate(timeout=120)
    assert check.returncode == 0 and err == "", err
    assert out.splitlines() == [
        "start: starts fresh at step 1 of 12",
        "stage 'pretrain': steps 1-7 (7 steps), sequence length 32, global batch 4: 28 samples, 896 tokens",
        "  shards/web (weight 0.7): 20 of its 10,639 samples, 640 tokens, 0.00 epochs",
        "  shards/code (weight 0.3): 8 of its 3,812 samples, 256 tokens, 0.00 epochs",
        "stage 'anneal': steps 8-12 (5 steps), sequence length 16, global batch 4: 20 samples, 320 tokens",
        "  shards/sft (weight 1): 20 of its 4,500 samples, 320 tokens, 0.00 epochs"]
    assert not (tmp_path / "run").exists()  # nothing started
    bad = small_config(tmp_path, tmp_path / "run", name="bad.yaml",
                       model={"vocab_size": 1000})
    proc = nanoset_train("--config", bad, cwd=shards)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and out == ""
    assert err == ("error: model.vocab_size 1000 < vocab size 1494 of the tokenizer of shards/web; raise "
                   "model.vocab_size to at least 1494\n")
    wrong = nanoset_train("--config", cfg, "--nproc-per-node", 3, cwd=shards)
    assert wrong.communicate(timeout=120)[1] == (  # our option, not torchrun's --nproc_per_node
        f"error: {cfg}: parallelism tp 1 × pp 1 × dp 2 = 2 processes, but --nproc-per-node 3 would start 3; give "
        f"--nproc-per-node 2 or leave it out\n")


def test_ctrl_c_to_nanoset_train_saves_and_exits_130_then_resumes_bit_identically(reference, shards, tmp_path):
    """Ctrl-C while training printed 277 lines of KeyboardInterrupt and gloo errors and saved nothing: the first
    one stops every rank after the step with one checkpoint (exit status 130), the rerun continues exactly."""
    _, ref_rows = reference
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run)
    proc = nanoset_train("--config", cfg, cwd=shards)
    wait_for_step(run, 2, proc)
    os.kill(proc.pid, signal.SIGINT)  # what a terminal sends to its foreground process (the workers: own sessions)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    step = stopped_at(out, "SIGINT")
    assert 2 <= step < 12 and (run / "checkpoints" / "latest").read_text().strip() == f"step-{step:06d}"
    rerun = nanoset_train("--config", cfg, cwd=shards)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert losses(metrics(run)) == losses(ref_rows)


def test_workers_whose_torchrun_agent_is_killed_stop_with_a_checkpoint(reference, shards, tmp_path):
    """torch starts each worker in its own session: kill -9 of the agent left them training unsupervised to the
    end. They notice their parent is gone, stop within a step with one checkpoint, release the run lock, and the
    rerun resumes bit-identically."""
    _, ref_rows = reference
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run)
    proc = start_slow(cfg, tmp_path, shards)
    wait_for_step(run, 2, proc)
    workers = children(proc.pid)
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    deadline = time.time() + 120
    while time.time() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.1)
    assert not any(Path(f"/proc/{w}").exists() for w in workers), "the workers went on without their agent"
    step = int((run / "checkpoints" / "latest").read_text().strip().removeprefix("step-"))
    assert 2 <= step < 12 and [r["step"] for r in metrics(run)] == list(range(1, step + 1))
    rerun = start_slow(cfg, tmp_path, shards)  # the lock was released: not "another run is training"
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert losses(metrics(run)) == losses(ref_rows)


# Imported by every process of a `nanoset train` started with launcher_env(); it changes the launcher's checks with
# "launcher_slow_startup S" (a marker file, then S seconds), else the workers only (they have LOCAL_RANK), as FAULT
# asks: "slow_step S", "slow_save S" (a marker file, then S seconds before a save),
# "slow_startup S" (a marker file, then S seconds before start-up's checks), "slow_startup_but_rank0 S" (the same
# but for rank 0, which goes on to wait for the others in init_process_group, after a marker), "exit_at_step N CODE"
# (rank 0 exits), "kill_at_step N RANK" (SIGKILL to rank RANK as its step N begins, as the out-of-memory killer),
# "error_at_step N" (a user error on every rank).
WORKER_FAULTS = '''
import os, time
fault = os.environ.get("FAULT", "").split()
if fault and fault[0] == "launcher_slow_startup" and "LOCAL_RANK" not in os.environ:
    import runtime.startup as startup
    start_up = startup.start_up
    def slow_start_up(*a, **k):
        open(os.environ["FAULT_MARKER"], "w").close()
        time.sleep(float(fault[1]))
        return start_up(*a, **k)
    startup.start_up = slow_start_up
elif fault and ("LOCAL_RANK" in os.environ or "FAULT_WORKER" in os.environ):
    kind, args = fault[0], fault[1:]
    marker = os.environ["FAULT_MARKER"]
    if kind in ("slow_step", "exit_at_step", "kill_at_step", "error_at_step"):
        import runtime.engine as engine
        step = engine.Engine.train_step
        calls = [0]
        def train_step(self, *a, **k):
            calls[0] += 1
            if kind == "slow_step":
                time.sleep(float(args[0]))
            elif kind == "exit_at_step" and calls[0] == int(args[0]) and os.environ.get("RANK", "0") == "0":
                os._exit(int(args[1]))
            elif kind == "kill_at_step" and calls[0] == int(args[0]) and os.environ["RANK"] == args[1]:
                import signal
                os.kill(os.getpid(), signal.SIGKILL)
            elif kind == "error_at_step" and calls[0] == int(args[0]):
                from nanoset.errors import ConfigError
                raise ConfigError("data.bogus: a user error found while training")
            return step(self, *a, **k)
        engine.Engine.train_step = train_step
    elif kind == "slow_save":
        import runtime.checkpoint.store as store
        save = store.CheckpointManager.save
        def slow_save(self, *a, **k):
            open(marker, "w").close()
            time.sleep(float(args[0]))
            return save(self, *a, **k)
        store.CheckpointManager.save = slow_save
    elif kind == "slow_startup_but_rank0" and os.environ.get("RANK", "0") == "0":  # waits on the others' store
        import torch.distributed as dist
        init = dist.init_process_group
        def init_process_group(*a, **k):
            open(f"{marker}.pg", "w").close()
            return init(*a, **k)
        dist.init_process_group = init_process_group
    elif kind.startswith("slow_startup"):
        import runtime.startup as startup
        start_up = startup.start_up
        def slow_start_up(*a, **k):
            open(f"{marker}.{os.environ['RANK']}", "w").close()
            time.sleep(float(args[0]))
            return start_up(*a, **k)
        startup.start_up = slow_start_up
'''


INTERRUPTED_TWICE = ("error: interrupted twice: stopped at once, without saving what was in progress; rerun the same "
                     "command to resume from the latest checkpoint\n")


def launcher_env(tmp_path: Path, fault: str, worker: bool = False) -> dict:
    """The environment of a `nanoset train` whose workers get ``fault`` (see WORKER_FAULTS); ``worker``: of a
    process started without a launcher, which gets it itself."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(WORKER_FAULTS)
    return {**ENV, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "FAULT": fault,
            "FAULT_MARKER": str(tmp_path / "marker"), **({"FAULT_WORKER": "1"} if worker else {})}


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while not path.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)


def gone(pids: list[int], within_s: float = 30) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.05)
    return not any(Path(f"/proc/{p}").exists() for p in pids)


def test_a_second_ctrl_c_to_nanoset_train_stops_the_workers_at_once(shards, tmp_path):
    """The first Ctrl-C asks for a checkpoint after the step; a second one while the workers save kills them at once
    (was: forwarded as SIGTERM, which the workers took for the same stop, and the line said SIGTERM)."""
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, interval=0)
    proc = nanoset_train("--config", cfg, cwd=shards, env=launcher_env(tmp_path, "slow_save 120"))
    wait_for_step(run, 1, proc)
    (worker,) = children(proc.pid)
    os.kill(proc.pid, signal.SIGINT)
    wait_for(tmp_path / "marker", proc)  # the worker is saving the checkpoint of its step
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)  # not the 120 s of the save
    assert proc.returncode == 130
    assert err == INTERRUPTED_TWICE
    assert "stopped by" not in out and gone([worker], within_s=5)
    assert not (run / "checkpoints").exists() or list((run / "checkpoints").iterdir()) == []


def test_a_second_ctrl_c_to_a_single_process_run_exits_at_once(shards, tmp_path):
    """Without a launcher (python -m runtime.train), the process itself answers the second Ctrl-C."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "runtime.train", "--config",
                             str(small_config(tmp_path, run, dp=1, interval=0))], cwd=shards,
                            env=launcher_env(tmp_path, "slow_save 120", worker=True), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for_step(run, 1, proc)
    proc.send_signal(signal.SIGINT)
    wait_for(tmp_path / "marker", proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (130, INTERRUPTED_TWICE) and "stopped by" not in out


def test_a_worker_killed_by_a_signal_is_one_line_and_128_plus_the_signal(shards, tmp_path):
    run = tmp_path / "run"
    proc = nanoset_train("--config", small_config(tmp_path, run, dp=1), cwd=shards,
                         env={**ENV, "NANOSET_FAULT_KILL_AT_STEP": "2"})
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGKILL, err
    (line,) = err.splitlines()
    pid = line.split("(pid ")[1].split(")")[0]
    assert pid.isdigit() and line == (f"error: worker rank 0 (pid {pid}) was killed by SIGKILL (often the "
                                      f"out-of-memory killer); rerun the same command to resume from the latest "
                                      f"checkpoint")


def step_lines(stdout: str) -> list[str]:
    """The run's console lines, each step's cut to its number (its figures vary with the machine's speed), without
    the start-up's size lines and the checkpoint lines (tests/runtime/test_console.py checks them)."""
    return [line.split(" |")[0] if line.startswith("step ") else line for line in stdout.splitlines()
            if not line.startswith(("model: ", "tokens: ", "checkpoint "))]


def check_broken_collective_traceback(run: Path, rank: int, step: int) -> None:
    """The traceback file a survivor wrote: the line that says what happened, then the traceback of gloo's error."""
    text = (run / "tracebacks" / f"rank-{rank}.txt").read_text()
    first, blank, *rest = text.splitlines()
    assert re.fullmatch(rf"rank {rank} \(pid \d+\) after step {step}: a collective operation failed, most likely "
                        rf"because another rank ended first \(the launcher's line, or torchrun's report, names it\)",
                        first) and blank == "", text
    assert rest[0] == "Traceback (most recent call last):" and "gloo/transport/" in rest[-1], text


@pytest.mark.parametrize("killed", [1, 0])
def test_a_worker_killed_mid_run_is_one_line_from_the_launcher_and_the_rerun_resumes_exactly(reference, shards,
                                                                                               tmp_path, killed):
    """SIGKILL (the out-of-memory killer) of one of two workers at step 5: the other's collective breaks. Was: 65
    lines of its gloo traceback before the launcher's line, and rank 0, surviving, could say "note: SIGTERM after the
    last step: the run finishes ... (the final checkpoint, the Hugging Face export)" mid-run. Now one line naming the
    killed rank, the signal and the survivor's traceback file; the rerun resumes from step 3, bit-identically."""
    _, ref_rows = reference
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run)
    proc = nanoset_train("--config", cfg, cwd=shards, env=launcher_env(tmp_path, f"kill_at_step 5 {killed}"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGKILL, err
    survivor = 1 - killed
    pid = err.split("(pid ")[1].split(")")[0]
    assert pid.isdigit() and err == (
        f"error: worker rank {killed} (pid {pid}) was killed by SIGKILL (often the out-of-memory killer); rank "
        f"{survivor} ended with it (its broken collective's traceback: {run / 'tracebacks' / f'rank-{survivor}.txt'}); "
        f"rerun the same command to resume from the latest checkpoint\n")
    lines = step_lines(out)
    assert lines[0].startswith("stage 'pretrain' at step 1 ") and lines[1:] == [f"step {i:6d}/12" for i in range(1, 5)]
    check_broken_collective_traceback(run, survivor, 4)
    rerun = nanoset_train("--config", cfg, cwd=shards)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert f"resumed from {run / 'checkpoints' / 'step-000003'} at step 3" in out.splitlines()
    assert losses(metrics(run)) == losses(ref_rows)


def test_a_worker_killed_under_plain_torchrun_leaves_no_traceback_and_no_false_note(shards, tmp_path):
    """Plain torchrun: the surviving rank 0 neither prints its broken collective's traceback nor says the run
    finishes its final checkpoint; torchrun's own report names the killed rank and the survivor's traceback file."""
    run = tmp_path / "run"
    proc = torchrun(small_config(tmp_path, run), 2, cwd=shards, env=launcher_env(tmp_path, "kill_at_step 5 1"),
                    check=False)
    assert proc.returncode == 1, proc.stderr
    lines = step_lines(proc.stdout)
    assert lines[0].startswith("stage 'pretrain' at step 1 ") and lines[1:] == [f"step {i:6d}/12" for i in range(1, 5)]
    assert proc.stderr.count("Traceback (most recent call last)") == 1  # torchrun's own, before its report
    assert "[rank0]" not in proc.stderr and "exitcode  : -9 (pid" in proc.stderr
    assert ("traceback : rank 0: a collective operation failed after step 4, most likely because another rank ended "
            "(RuntimeError: ") in proc.stderr
    assert f"its traceback: {run / 'tracebacks' / 'rank-0.txt'}\n" in proc.stderr
    check_broken_collective_traceback(run, 0, 4)


SIGNAL_AFTER_A_FAILED_STEP = f'''
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from runtime.engine import Engine
from runtime.trainer import Trainer
step, release = Engine.train_step, Trainer._release_loader
calls = []
def train_step(self, *a, **k):
    calls.append(1)
    if len(calls) == 3:
        raise RuntimeError("a bug in step 3")
    return step(self, *a, **k)
def release_and_get_a_signal(self):
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the failed run unwinds
    return release(self)
Engine.train_step, Trainer._release_loader = train_step, release_and_get_a_signal
from runtime.train import main
sys.exit(main())
'''


def test_a_stop_signal_while_a_failed_run_unwinds_says_nothing_false(shards, tmp_path):
    """runtime.train's main in one process: a step that raised, then a SIGTERM while the run unwinds — the loop's
    end was marked in a ``finally`` as after the last step, and the run said it would finish its final checkpoint
    and export. Now: the bug's traceback and its status 1, nothing else."""
    script = tmp_path / "signal_after_a_failure.py"
    script.write_text(SIGNAL_AFTER_A_FAILED_STEP)
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, single_stage=True, checkpoints={"export_hf": True})
    proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                          cwd=shards, env=ENV, timeout=300)
    assert proc.returncode == 1
    assert step_lines(proc.stdout)[1:] == ["step      1/12", "step      2/12"]
    lines = proc.stderr.splitlines()  # (torch.distributed prefixes a traceback's lines with the rank)
    assert lines[0] == "[rank0]: Traceback (most recent call last):" and lines[-1] == (
        "[rank0]: RuntimeError: a bug in step 3") and "note:" not in proc.stdout, proc.stderr


def test_a_workers_own_exit_status_passes_through_nanoset_train(shards, tmp_path):
    proc = nanoset_train("--config", small_config(tmp_path, tmp_path / "run", dp=1), cwd=shards,
                         env=launcher_env(tmp_path, "exit_at_step 2 7"))
    out, err = proc.communicate(timeout=300)
    assert (proc.returncode, err) == (7, "")  # nothing of torchrun's report


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])  # SIGHUP: the closed-terminal test
def test_a_stop_signal_to_nanoset_train_saves_and_exits_128_plus_the_signal(shards, tmp_path, sig):
    """SIGTERM (Slurm), SIGHUP (a closed terminal or ssh session) and SIGUSR1 (sbatch --signal) each stop after the
    step with one checkpoint, and the launcher exits 128 + the signal, the worker's status (was: SIGTERM 143 where the
    docs said 0, SIGHUP lost the steps since the last checkpoint, SIGUSR1 killed the launcher with 138)."""
    run = tmp_path / "run"
    proc = nanoset_train("--config", small_config(tmp_path, run, dp=1, interval=0), cwd=shards,
                         env=launcher_env(tmp_path, "slow_step 0.3"))
    wait_for_step(run, 2, proc)
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (128 + sig, "")
    step = stopped_at(out, sig.name)
    assert 2 <= step < 12 and (run / "checkpoints" / "latest").read_text().strip() == f"step-{step:06d}"


def test_ctrl_c_during_start_up_is_one_line(shards, tmp_path):
    """Before the first step there is nothing to save: a Ctrl-C ends the workers at once with one line (was: a
    KeyboardInterrupt traceback per rank)."""
    run = tmp_path / "run"
    proc = nanoset_train("--config", small_config(tmp_path, run), cwd=shards,
                         env=launcher_env(tmp_path, "slow_startup 120"))
    for rank in (0, 1):
        wait_for(tmp_path / f"marker.{rank}", proc)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err == ("stopped by SIGINT during start-up, before any step: nothing to save; rerun the same command to "
                   "start again\n")
    assert not (run / "metrics.jsonl").exists()


def test_ctrl_c_during_the_launchers_checks_is_one_line(shards, tmp_path):
    """The launcher's own start-up (its checks, tokenizing an HF stage) answers a stop signal at once, in one line."""
    sig = signal.SIGINT
    run = tmp_path / "run"
    proc = nanoset_train("--config", small_config(tmp_path, run), cwd=shards,
                         env=launcher_env(tmp_path, "launcher_slow_startup 120"))
    wait_for(tmp_path / "marker", proc)
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (128 + sig, "")
    assert err == (f"stopped by {sig.name} during start-up, before any step: nothing to save; rerun the same command "
                   f"to start again\n")
    assert not run.exists()


@pytest.mark.parametrize("fault", ["slow_startup", "slow_startup_but_rank0"])
def test_workers_of_a_launcher_killed_during_start_up_stop(shards, tmp_path, fault):
    """kill -9 of the launcher while its workers start up (a slow check; rank 0 waiting for rank 1 on the launcher's
    store, which no longer answers) left them running; each notices at once that its launcher is gone."""
    proc = nanoset_train("--config", small_config(tmp_path, tmp_path / "run"), cwd=shards,
                         env=launcher_env(tmp_path, f"{fault} 120"))
    for name in ("marker.0", "marker.1") if fault == "slow_startup" else ("marker.pg", "marker.1"):
        wait_for(tmp_path / name, proc)
    time.sleep(0.5)  # well inside init_process_group's wait
    workers = children(proc.pid)
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert gone(workers, within_s=10), "the workers went on without their launcher"
    # (waiting on the store, rank 0 also gets torch's C++ warning of the broken connection, its own log line)
    assert "Traceback" not in err and error_lines(err) == [
        f"error: the launcher (pid {proc.pid}) is gone; this worker stops before training"] * 2, err


def test_a_user_error_of_the_workers_is_not_restarted(shards, tmp_path):
    """--max-restarts is for failures a rerun may cure: a mistake the workers found is said once (was: once per
    restart, the same line each time)."""
    proc = nanoset_train("--config", small_config(tmp_path, tmp_path / "run"), "--max-restarts", 2, cwd=shards,
                         env=launcher_env(tmp_path, "error_at_step 1"))
    out, err = proc.communicate(timeout=300)
    assert (proc.returncode, err) == (1, "error: data.bogus: a user error found while training\n")
    assert out.count("stage 'pretrain' at step 1") == 1  # one start, no restart


def test_nodes_that_never_meet_are_one_line(shards, tmp_path):
    """A node alone at the rendezvous (the others not started, another endpoint): one line naming the endpoint, once
    the rendezvous times out (was: torchrun's traceback); a layout that does not split over the nodes names ours."""
    cfg = small_config(tmp_path, tmp_path / "run")
    endpoint = f"127.0.0.1:{free_port()}"
    proc = nanoset_train("--config", cfg, "--nnodes", 2, "--node-rank", 0, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                         endpoint, "--rdzv-conf", "join_timeout=2", cwd=shards)
    assert proc.communicate(timeout=120) == ("", f"error: the rendezvous of the nodes failed (RendezvousTimeoutError); "
                                                 f"check --rdzv-endpoint {endpoint} and that every node runs the same "
                                                 f"command\n")
    assert proc.returncode == 1
    proc = nanoset_train("--config", cfg, "--nnodes", 3, cwd=shards)
    assert proc.communicate(timeout=120)[1] == (f"error: {cfg}: parallelism tp 1 × pp 1 × dp 2 = 2 processes do not "
                                                f"split over --nnodes 3; change parallelism or --nnodes\n")


def test_a_closed_terminal_stops_the_run_with_a_checkpoint(shards, tmp_path):
    """A terminal that hangs up fails every write (EIO) and then sends SIGHUP: the workers' next step line ended the
    run with 'error: [Errno 5] Input/output error' and no checkpoint; now the output that went to the terminal goes
    nowhere and the run stops after the step with its checkpoint, 128 + SIGHUP."""
    import pty
    import select

    run = tmp_path / "run"
    terminal, tty = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "nanoset.cli", "train", "--config",
                             str(small_config(tmp_path, run, dp=1, interval=0))], cwd=shards,
                            env=launcher_env(tmp_path, "slow_step 0.3"), stdin=tty, stdout=tty, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    os.close(tty)
    deadline = time.time() + 300
    while not (run / "metrics.jsonl").is_file() or len((run / "metrics.jsonl").read_text().splitlines()) < 2:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        while select.select([terminal], [], [], 0.05)[0]:  # the terminal shows what the run prints
            os.read(terminal, 65536)
    os.close(terminal)  # the terminal goes: writes to it fail from now on
    os.kill(proc.pid, signal.SIGHUP)  # and its hangup reaches the launcher, which forwards it
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (128 + signal.SIGHUP, "")
    step = int((run / "checkpoints" / "latest").read_text().strip().removeprefix("step-"))
    assert 2 <= step < 12 and [r["step"] for r in metrics(run)] == list(range(1, step + 1))


SIGNAL_DURING_EXPORT = f'''
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from runtime.trainer import Trainer
export = Trainer._export_hf
def export_and_get_a_signal(self, checkpoint):
    os.kill(os.getpid(), signal.SIGTERM)  # arrives after the last step, while the final checkpoint is exported
    return export(self, checkpoint)
Trainer._export_hf = export_and_get_a_signal
from runtime.train import main
status = main()
from runtime.control.preemption import ignore_stop_signals
ignore_stop_signals()
os.kill(os.getpid(), signal.SIGTERM)  # and one during the process's exit: ignored
sys.exit(status)
'''


def test_a_stop_signal_after_the_last_step_lets_the_run_finish_and_says_so(shards, tmp_path):
    """A SIGTERM during the final export was silent, and one during the exit ended a finished run with 143."""
    script = tmp_path / "signal_in_export.py"
    script.write_text(SIGNAL_DURING_EXPORT)
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=4, interval=2, single_stage=True, checkpoints={"export_hf": True})
    proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                          cwd=shards, env=ENV, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert ("note: SIGTERM after the last step: the run finishes what follows it (the final checkpoint, the Hugging "
            "Face export) and ends") in proc.stdout.splitlines()
    assert (run / "hf" / "config.json").is_file() and (run / "checkpoints" / "latest").read_text() == "step-000004\n"


def test_rerunning_a_finished_run_says_so_before_any_worker_starts(reference, shards, tmp_path):
    """The workers took 16 s to start, load the checkpoint and report nothing to train: the launcher says it
    from the checkpoint's record, exit status 0, and no worker process starts (a sitecustomize on the path
    marks every Python process whose script is runtime/train.py)."""
    run, ref_rows = reference
    marks = tmp_path / "workers"
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if sys.argv and sys.argv[0].endswith('train.py'):\n"
        f"    open({str(marks)!r}, 'a').write(str(os.getpid()) + chr(10))\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    cfg = small_config(tmp_path, run)
    started = time.monotonic()
    proc = nanoset_train("--config", cfg, cwd=shards, env=env)
    out, err = proc.communicate(timeout=120)
    print(f"a finished run's rerun answered in {time.monotonic() - started:.1f} s")
    assert (proc.returncode, err) == (0, "")
    assert out == (f"done: {run / 'checkpoints' / 'step-000012'} is at step 12 = tokens.train_steps: nothing left to "
                   f"train, no worker started (raise tokens.train_steps to train on)\n")
    assert not marks.exists() and metrics(run) == ref_rows
