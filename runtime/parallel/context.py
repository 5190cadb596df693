"""ParallelContext: the process groups of a run, from one DeviceMesh with named axes (pp, dp, tp).

tp is the innermost axis (neighbouring ranks, the fastest links), pp the outermost. NCCL on CUDA,
gloo on CPU, picked automatically; the process group itself comes from torchrun's environment.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from runtime.config import ParallelismArgs


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


class ParallelContext:
    """World, dp, tp and pp groups plus this rank's coordinates; ``tp · pp · dp`` must be the world size."""

    def __init__(self, tp: int = 1, pp: int = 1, dp: int = 1, backend: str | None = None) -> None:
        for name, size in (("tp", tp), ("pp", pp), ("dp", dp)):
            if size < 1:
                raise ValueError(f"parallelism.{name} must be ≥ 1, got {size}")
        self.device = default_device()
        if not dist.is_initialized():
            if "RANK" not in os.environ and tp * pp * dp == 1:  # a plain `python` run: a world of one
                os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
                os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
                os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
            dist.init_process_group(backend or ("nccl" if self.device.type == "cuda" else "gloo"))
        ParallelismArgs(dp=dp, tp=tp, pp=pp).check_world(dist.get_world_size(), launched=False)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.tp_size, self.pp_size, self.dp_size = tp, pp, dp
        self.mesh = init_device_mesh(self.device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        self.world_pg = dist.group.WORLD
        self.pp_pg = self.mesh.get_group("pp")
        self.dp_pg = self.mesh.get_group("dp")
        self.tp_pg = self.mesh.get_group("tp")
        self.pp_rank = self.mesh.get_local_rank("pp")
        self.dp_rank = self.mesh.get_local_rank("dp")
        self.tp_rank = self.mesh.get_local_rank("tp")
        self.world_rank = dist.get_rank()

    @property
    def is_first_pp_rank(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_pp_rank(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def global_rank_of(self, pp_rank: int, dp_rank: int, tp_rank: int) -> int:
        """The world rank at mesh coordinates (pp, dp, tp)."""
        return int(self.mesh.mesh[pp_rank, dp_rank, tp_rank])

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
