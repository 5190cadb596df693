"""Helpers for data-order tests: configs built in code, and the global batch read through loaders."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import yaml
from conftest import CONFIGS

from runtime.config import Config
from runtime.config.load import from_dict
from runtime.config.rules import validate_config
from runtime.data import StageDataset, get_train_dataloader

BASE = yaml.safe_load((CONFIGS / "two-stage.yaml").read_text())


def make_config(dp=1, accum=1, mbs=2, train_steps=40, stages=None, seq=128, pp=1, **top) -> Config:
    d = copy.deepcopy(BASE)
    d.update(top)
    d["parallelism"].update(dp=dp, pp=pp, pp_engine="afab")
    d["tokens"].update(micro_batch_size=mbs, batch_accumulation_per_replica=accum, train_steps=train_steps,
                       sequence_length=seq)
    if stages is not None:
        d["data_stages"] = stages
    c = from_dict(Config, d, "config")
    validate_config(c)
    return c


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
