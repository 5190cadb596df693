"""The global batch of a stage as the DP ranks' loaders deliver it (configs: ``tests.support.configs``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from runtime.data import StageDataset, get_train_dataloader


def stage_loader(plan, stage, dp_rank, dp_size, consumed=0, pp_rank=0, pp=1, workers=0):
    ctx = SimpleNamespace(dp_rank=dp_rank, dp_size=dp_size, pp_rank=pp_rank)
    return get_train_dataloader(StageDataset(plan, stage), stage.sequence_length, ctx, 0, pp - 1,
                                plan.config.tokens.micro_batch_size, consumed_train_samples=consumed,
                                dataloader_num_workers=workers, use_position_ids=stage.use_position_ids)


def global_batches(plan, stage, steps, consumed=0, workers=0):
    """Per step, the global batch (tokens of inputs) as the DP ranks' loaders deliver it, in global order."""
    c = plan.config
    dp, accum = c.parallelism.dp, c.tokens.batch_accumulation_per_replica
    iters = [iter(stage_loader(plan, stage, r, dp, consumed, workers=workers)) for r in range(dp)]
    out = []
    for _ in range(steps):
        rows = []
        for _m in range(accum):
            for it in iters:
                b = next(it)
                rows.append(np.concatenate([b["input_ids"].numpy(), b["label_ids"].numpy()[:, -1:]], axis=1))
        out.append(np.concatenate(rows))
    return out
