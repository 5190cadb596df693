"""Every rank must plan the same samples, checked once after start-up.

Each rank builds its data plan from its own view of the filesystem: a relative dataset path resolves
from each node's working directory, and node-local copies can differ. A rank that sees another
dataset would silently put other samples into its rows of every global batch; one all-gather of a
content signature turns that into one clear error.
"""

from __future__ import annotations

import hashlib
import json

import torch.distributed as dist

from runtime.config import ConfigError
from runtime.data.order.plan import DataPlan


def plan_signature(plan: DataPlan) -> str:
    """A hash of what the plan draws, by content (dataset fingerprints, not folder names)."""
    parts = [(p.start_step, p.end_step, p.global_batch_size, p.seed, list(p.weights), p.draw_offsets.tolist(),
              [(plan.datasets[d].reader.fingerprint, plan.datasets[d].sequence_length) for d in p.dataset_ids],
              p.schedule.to_json() if p.schedule is not None else None)
             for p in plan.stages]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def check_same_plan(plan: DataPlan) -> None:
    """Raise ``ConfigError`` on every rank when any rank's plan differs from global rank 0's."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    mine = (plan_signature(plan), plan.folders)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    other = next((r for r, (sig, _) in enumerate(everyone) if sig != everyone[0][0]), None)
    if other is not None:
        raise ConfigError(f"rank {other} sees other data than rank 0 (datasets {everyone[other][1]} against "
                          f"{everyone[0][1]}); every node must see the same dataset folders: use absolute paths, "
                          f"or start every node in the same directory")
