"""Run a function on N local processes with a gloo process group (CPU), as torchrun would."""

from __future__ import annotations

import os
import socket
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn, args, errors, finished) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
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
    """Spawn ``world`` processes running ``fn(rank, world, *args)``; re-raise the first failure."""
    ctx = mp.get_context("spawn")
    errors, finished = ctx.SimpleQueue(), ctx.SimpleQueue()
    try:
        mp.start_processes(_entry, args=(world, free_port(), fn, args, errors, finished), nprocs=world,
                           start_method="spawn")
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
