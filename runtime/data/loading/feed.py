"""One feed: this rank's micro-batches of each step, for training, validation and ``runtime.evaluate``.

Where a step's micro-batches come from is a ``DataSource`` (sources.py): the config's stages, a
user's loaders, or a validation set. At the first step of a stage the feed releases the previous
stage's loader (its worker processes, its prefetch thread), frees memory and builds the next loader
(lazily: a user's callable is called then). Then, per step:

* the runtime's own loaders are read by one rank of a replica's cp × tp group and broadcast over it
  (tp_broadcast.py); pipeline ranks that own no data get TensorPointers and read nothing;
* a user's loaders run on every rank: an error on some ranks stops all with the same line, and at
  each loader's first step the cp × tp ranks' micro-batches are compared;
* every micro-batch read is checked against the batch contract (contract.py).
"""

from __future__ import annotations

import gc
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from nanoset.errors import ConfigError, NanosetError
from runtime.data.loading.contract import check_micro_batch, pointer_batch
from runtime.data.loading.dataloader import from_loader_worker
from runtime.data.loading.prefetch import PrefetchIterator, shutdown_workers
from runtime.data.loading.sources import DataSource, Stage, ValidationSource, data_source
from runtime.data.loading.tp_broadcast import broadcast_batches, check_same_batches, needs_broadcast, reads_for_replica
from runtime.data.order.plan import DataPlan
from runtime.data.order.validation_sets import ValidationSet
from runtime.parallel.agreement import raise_together


class StepFeed:
    """This rank's ``accumulation`` micro-batches of ``micro_batch_size`` rows for each step of a ``DataSource``.
    ``log``: where the lines of a stage's start go (none when not given)."""

    def __init__(self, source: DataSource, ctx: Any, micro_batch_size: int, accumulation: int,
                 log: Callable[[str], None] | None = None) -> None:
        self.source, self.ctx = source, ctx
        self.micro_batch_size, self.accumulation = micro_batch_size, accumulation
        self.log = log
        self.stage: Stage | None = None  # the stage of the last step fed
        self.wait = 0.0  # seconds the last ``batches`` waited for data (its stage's new loader built before)
        self._iterator: Iterator | None = None
        self._compare = False  # compare the cp × tp ranks' micro-batches at the next step (a user's new loader)
        owns_data = ctx.pp_rank in (0, ctx.pp_size - 1)
        self._reads = not source.from_config or reads_for_replica(ctx) and owns_data
        self._rank = f" on rank {ctx.world_rank}" if dist.is_initialized() and dist.get_world_size() > 1 else ""

    @property
    def from_config(self) -> bool:
        """Whether the batches are the runtime's own, of the config's datasets (the data order describes them)."""
        return self.source.from_config

    def batches(self, step: int) -> list[dict]:
        """The micro-batches of ``step`` on this rank: tensors of the keys it owns, TensorPointers elsewhere."""
        stage = self.source.stage_for(step)
        if stage is not self.stage:
            self._switch(stage, step)
        start = time.perf_counter()
        batches = self._runtime_batches(stage, step) if self.source.from_config else self._user_batches(stage, step)
        self.wait = time.perf_counter() - start
        return batches

    def close(self) -> None:
        """Release the loader and its workers and free what they held; a later ``batches`` builds its stage's
        loader again."""
        it = self._iterator
        if it is not None:
            shutdown_workers(it)
        if isinstance(it, PrefetchIterator):  # its thread stops and is joined (it shuts down the workers)
            it.close()
        self._iterator = None
        self.stage = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _switch(self, stage: Stage, step: int) -> None:
        """Release the previous stage's loader (and its workers), then build this stage's and log the start."""
        if not (self.source.same_loader_for(stage) and self._iterator is not None):
            if self.stage is not None:  # a first stage has nothing to release
                self.close()
            if self._reads:
                self._iterator = iter(self.source.loader(stage, step))
                self._compare = not self.source.from_config  # a user's loader: at its first step
        self.stage = stage
        if self.log is not None:
            for line in self.source.describe(stage, step):
                self.log(line)

    def _runtime_batches(self, stage: Stage, step: int) -> list[dict]:
        """The runtime's loaders give the contract's batches on the reading rank of each replica."""
        ctx = self.ctx
        if ctx.pp_rank not in (0, ctx.pp_size - 1):
            return [pointer_batch(0, ctx.pp_size - 1, stage.use_position_ids) for _ in range(self.accumulation)]
        batches = self._read(stage, step)
        if needs_broadcast(ctx):  # full-length batches, also for cp ranks (the engine keeps each one's part)
            batches = broadcast_batches(batches, self.accumulation, self.micro_batch_size, stage.sequence_length,
                                        stage.use_position_ids, ctx, with_sources=self.source.with_sources)
        return batches

    def _user_batches(self, stage: Stage, step: int) -> list[dict]:
        """A user's loader runs on every rank and may fail on some: all stop with the same line."""
        batches, error = None, None
        try:
            batches = self._read(stage, step)
        except NanosetError as e:
            error = e
        raise_together(error, self.ctx.device)
        if self._compare and needs_broadcast(self.ctx):
            check_same_batches(batches, self.ctx, f"stage {stage.name!r} step {step}")
        self._compare = False
        return batches

    def _read(self, stage: Stage, step: int) -> list[dict] | None:
        """This rank's micro-batches of ``step`` from its loader (None where it reads none), checked against the
        batch contract."""
        if self._iterator is None:
            return None
        try:
            batches = [next(self._iterator) for _ in range(self.accumulation)]
        except NanosetError as e:  # e.g. a shard removed mid-run, found by a loader worker
            raise from_loader_worker(e) from None
        except StopIteration:
            raise NanosetError(f"the data loader of stage {stage.name!r} ran out at step {step}, but the stage runs "
                               f"steps {stage.start_step}-{stage.end_step - 1}; give it more micro-batches (a larger "
                               f"dataset or a looping sampler)") from None
        ctx = self.ctx
        for i, batch in enumerate(batches):
            check_micro_batch(batch, ctx.pp_rank == 0, ctx.pp_rank == ctx.pp_size - 1, self.micro_batch_size,
                              stage.sequence_length, f"stage {stage.name!r} step {step} micro-batch {i}{self._rank}")
        return batches


def training_feed(dataloader_or_dls: Any, plan: DataPlan, ctx: Any, micro_batch_size: int, accumulation: int,
                  log: Callable[[str], None]) -> StepFeed:
    """The feed of a run: ``dataloader_or_dls`` as ``Trainer.train`` takes it (None: the config's stages), once
    every rank is known to plan the same samples."""
    source = data_source(dataloader_or_dls, plan, ctx, micro_batch_size)
    check_same_plan(plan)  # no rank silently reads another dataset (e.g. another node's cwd)
    return StepFeed(source, ctx, micro_batch_size, accumulation, log)


def validation_batches(vset: ValidationSet, sequence_length: int, use_position_ids: bool, ctx: Any,
                       micro_batch_size: int, accumulation: int) -> Iterator[list[dict]]:
    """This rank's micro-batches of each evaluation step of ``vset``: every row of the set once, in steps of
    ``dp_size × micro_batch_size × accumulation`` rows, the last one padded."""
    source = ValidationSource(vset, sequence_length, use_position_ids, ctx, micro_batch_size, accumulation)
    feed = StepFeed(source, ctx, micro_batch_size, accumulation)  # its loader, in-process, holds no worker
    for step in range(source.stage.end_step):
        yield feed.batches(step)


def plan_signature(plan: DataPlan) -> str:
    """A hash of what the plan draws, by content (dataset fingerprints, not folder names), and its surgery."""
    parts = [(p.start_step, p.end_step, p.global_batch_size, p.seed, list(p.weights), p.draw_offsets.tolist(),
              [(plan.datasets[d].reader.fingerprint, plan.datasets[d].sequence_length) for d in p.dataset_ids],
              p.schedule.to_json() if p.schedule is not None else None)
             for p in plan.stages]
    excised = [[(g.first_draw, hashlib.sha256(g.excluded.tobytes()).hexdigest()) for g in index.segments]
               for index in plan.draw_indexes]  # by content too: folders may be mounted elsewhere on other nodes
    surgery = [plan.surgery.skip_steps, excised]
    return hashlib.sha256(json.dumps([parts, surgery]).encode()).hexdigest()[:16]


def check_same_plan(plan: DataPlan) -> None:
    """Raise ``ConfigError`` on every rank when any rank's plan differs from global rank 0's.

    Each rank builds its data plan from its own view of the filesystem: a relative dataset path resolves from
    each node's working directory, and node-local copies can differ. A rank that sees another dataset would
    silently put other samples into its rows of every global batch; one all-gather of a content signature turns
    that into one clear error."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    signature = (plan_signature(plan), plan.folders)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, signature)
    other = next((r for r, (sig, _) in enumerate(everyone) if sig != everyone[0][0]), None)
    if other is not None:
        raise ConfigError(f"rank {other} sees other data than rank 0 (datasets {everyone[other][1]} against "
                          f"{everyone[0][1]}); every node must see the same dataset folders: use absolute paths, "
                          f"or start every node in the same directory")
