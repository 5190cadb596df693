"""ParallelContext: the process groups of a run, from one DeviceMesh with named axes (pp, dp, cp, tp).

tp is the innermost axis (neighbouring ranks, the fastest links), then cp (whose attention gathers
keys and values every layer), pp the outermost. Two flattened views serve the ranks that share
something: ``dp_cp`` (the replicas and their cp ranks hold the same parameters, so FSDP shards over
them and the global batch's sums reduce over them, torchtitan's ``dp_shard_cp``) and ``cp_tp`` (the
ranks of one replica that need the same samples: one reads, the others receive them). NCCL on CUDA,
gloo on CPU, picked automatically; the process group itself comes from torchrun's environment.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from runtime.config import ParallelismArgs


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


class ParallelContext:
    """World, dp, cp, tp and pp groups plus this rank's coordinates; ``tp · cp · pp · dp`` must be the
    world size."""

    def __init__(self, tp: int = 1, pp: int = 1, dp: int = 1, backend: str | None = None, *, cp: int = 1) -> None:
        for name, size in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp)):
            if size < 1:
                raise ValueError(f"parallelism.{name} must be ≥ 1, got {size}")
        self.device = default_device()
        layout = ParallelismArgs(dp=dp, tp=tp, pp=pp, cp=cp)
        if not dist.is_initialized():
            if "RANK" not in os.environ and layout.world_size == 1:  # a plain `python` run: a world of one
                os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
                os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
                os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
            dist.init_process_group(backend or ("nccl" if self.device.type == "cuda" else "gloo"))
        layout.check_world(dist.get_world_size(), launched=False)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.tp_size, self.pp_size, self.dp_size, self.cp_size = tp, pp, dp, cp
        self.mesh = init_device_mesh(self.device.type, (pp, dp, cp, tp), mesh_dim_names=("pp", "dp", "cp", "tp"))
        self.world_pg = dist.group.WORLD
        self.pp_pg = self.mesh.get_group("pp")
        self.dp_pg = self.mesh.get_group("dp")
        self.cp_pg = self.mesh.get_group("cp")
        self.tp_pg = self.mesh.get_group("tp")
        self.pp_rank = self.mesh.get_local_rank("pp")
        self.dp_rank = self.mesh.get_local_rank("dp")
        self.cp_rank = self.mesh.get_local_rank("cp")
        self.tp_rank = self.mesh.get_local_rank("tp")
        self.world_rank = dist.get_rank()
        # without cp these are the dp and tp axes themselves (no further process groups)
        self.dp_cp_mesh: DeviceMesh = self.mesh["dp"] if cp == 1 else self.mesh["dp", "cp"]._flatten("dp_cp")
        self.dp_cp_pg = self.dp_cp_mesh.get_group()
        self.cp_tp_pg = self.tp_pg if cp == 1 else self.mesh["cp", "tp"]._flatten("cp_tp").get_group()

    @property
    def dp_cp_size(self) -> int:
        """The ranks that share the parameters (FSDP's shards) and split the global batch's tokens."""
        return self.dp_size * self.cp_size

    @property
    def is_first_pp_rank(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_pp_rank(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def global_rank_of(self, pp_rank: int, dp_rank: int, tp_rank: int, cp_rank: int | None = None) -> int:
        """The world rank at mesh coordinates (pp, dp, cp, tp); ``cp_rank`` None: this rank's own."""
        cp_rank = self.cp_rank if cp_rank is None else cp_rank
        return int(self.mesh.mesh[pp_rank, dp_rank, cp_rank, tp_rank])

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
