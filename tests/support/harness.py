"""Running the runtime as its users do: N local processes with a gloo process group (CPU), as torchrun
would start them; ``torchrun`` and ``python -m runtime.train`` as subprocesses; their metrics and errors."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import torch.multiprocessing as mp

from tests.support import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# torch's modules every rank of a test imports: loaded once, by the fork server, instead of by each rank
# (torch._dynamo: the first call of a function torch keeps out of compilation imports it, e.g. building a model)
PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint", "torch.distributed.tensor",
           "torch.distributed.fsdp", "torch.distributed.pipelining", "torch._dynamo"]


def _entry(rank: int, world: int, port: int, env: dict, fn, args, errors, finished) -> None:
    os.environ.clear()  # the test's environment now, not the fork server's when it started
    os.environ.update(env, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    try:
        fn(rank, world, *args)
        import torch.distributed as dist

        if dist.is_initialized():  # let every rank's last gloo operation finish before any tears its group down
            dist.barrier()
        finished.put(rank)
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        raise
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(world: int, fn, *args) -> None:
    """Start ``world`` processes running ``fn(rank, world, *args)``; re-raise the first failure.

    Each rank is forked from a fork server that imported torch once for this test process (``PRELOAD``) and
    imports nothing of the project: a spawned rank would import torch again, seconds of every rank of every test.
    A rank starts clean all the same: a fresh interpreter state for the project, the test's working folder,
    ``sys.path`` and environment of the moment. Its stdout and stderr are the test process's from when the
    server started, so a failure is reported through ``errors``, not the captured output."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    ctx = mp.get_context("forkserver")
    errors, finished = ctx.SimpleQueue(), ctx.SimpleQueue()
    try:
        mp.start_processes(_entry, args=(world, free_port(), dict(os.environ), fn, args, errors, finished),
                           nprocs=world, start_method="forkserver")
    except Exception as e:
        done = set()
        while not finished.empty():
            done.add(finished.get())
        if errors.empty() and len(done) == world:
            # every rank ran fn to the end and met the others at the last barrier: what died was gloo's
            # teardown at process exit (a rare "terminate called without an active exception"), not the test
            return
        detail = errors.get() if not errors.empty() else (None, str(e))
        raise AssertionError(f"rank {detail[0]} failed:\n{detail[1]}") from None


def torchrun(config: Path, nproc: int, cwd: Path, env: dict | None = None, script: Path | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(script or ROOT / "runtime" / "train.py"), "--config", str(config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_one(config: Path, cwd: Path, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m runtime.train`` as one process (no torchrun: a world of one)."""
    proc = subprocess.run([sys.executable, "-m", "runtime.train", "--config", str(config)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def worker_stderr(stderr: str) -> str:
    """The workers' part of torchrun's stderr: what precedes torchrun's own failure report (which
    always holds the launcher's traceback, ``ChildFailedError``)."""
    lines = stderr.splitlines()
    cut = next((i for i, line in enumerate(lines) if "torch/distributed/elastic" in line), len(lines))
    return "\n".join(lines[:cut])
