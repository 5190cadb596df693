"""Where each stage's micro-batches come from: the config's datasets, the user's loaders, or a validation set.

``trainer.train(dataloader_or_dls=...)`` takes nothing (the config's stages), one loader for the
whole run, or a dict of stage name → loader (or callable returning one). Each is a
``DataSource`` that says which stage a step belongs to and builds the loader of a stage when the
feed (feed.py) starts it; the feed decides which ranks read.

A resumed run must not feed a custom loader's first samples again while the log says they were
consumed. The protocol, in order:

1. a callable (a factory, not itself iterable) taking ``consumed_train_samples`` is called with
   the number of samples already consumed, and builds a loader that starts there;
2. any other callable is called with no arguments; its result is treated as a loader object;
3. a loader object with a ``consumed_train_samples`` attribute gets it set to that number before
   the trainer iterates it, and must start there;
4. any other loader object is accepted only when nothing is consumed (a fresh start or a stage
   start); resuming in the middle of its samples is refused rather than replayed from sample 0.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from nanoset.errors import ConfigError
from runtime.data.loading.collator import collator_class
from runtime.data.loading.dataloader import build_loader
from runtime.data.loading.dataset import StageDataset
from runtime.data.order.plan import DataPlan, StagePlan
from runtime.data.order.source_names import source_names
from runtime.data.order.validation_sets import ValidationSet

CONSUMED = "consumed_train_samples"


def _takes_consumed(factory: Callable) -> bool:
    try:
        return CONSUMED in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def loader_from_source(source: Any, consumed: int, what: str, step: int) -> Any:
    """The loader to iterate for ``what`` (e.g. "stage 'pretrain'") at global ``step`` when ``consumed``
    of its samples are already trained on; raises ``ConfigError`` when it cannot start there."""
    if callable(source) and not hasattr(source, "__iter__"):
        if _takes_consumed(source):
            return source(**{CONSUMED: consumed})
        source = source()
    if consumed == 0:
        return source
    if hasattr(source, CONSUMED):
        setattr(source, CONSUMED, consumed)
        return source
    raise ConfigError(f"{what}: resuming at step {step} with {consumed} of its samples already consumed, but its "
                      f"loader ({type(source).__name__}) cannot be advanced and would replay them from sample 0; "
                      f"pass a callable taking {CONSUMED} that builds the loader from there, or give the loader a "
                      f"{CONSUMED} attribute")


class Stage(Protocol):
    """What the feed needs of the stage a step belongs to: a ``StagePlan``, or a pass over a validation set."""

    name: str
    start_step: int
    end_step: int
    sequence_length: int
    use_position_ids: bool


class DataSource:
    """The loaders of a run's stages. ``from_config``: the runtime's own loaders, of the config's datasets (so the
    data order, ``data_hash`` and ``explain`` describe them, and one rank of a replica reads for it); else a
    user's, which run on every rank. ``with_sources``: the batches carry ``source_ids``."""

    from_config = False
    with_sources = False

    def stage_for(self, step: int) -> Stage:
        """The stage global ``step`` belongs to; a new one (``is not`` the last) starts a new loader."""
        raise NotImplementedError

    def loader(self, stage: Stage, step: int) -> Any:
        """The loader of ``stage``, resuming at global ``step``."""
        raise NotImplementedError

    def same_loader_for(self, stage: Stage) -> bool:
        """Whether the loader built for an earlier stage also serves ``stage`` (one loader for the run)."""
        return False

    def restarts_at(self, stage: Stage, step: int) -> bool:
        """Whether ``stage``'s loader is built anew at ``step`` inside it (an adaptive stage's next block)."""
        return False

    def describe(self, stage: Stage, step: int) -> list[str]:
        """The lines logged when ``stage`` starts at ``step``."""
        return []


class PlanStages(DataSource):
    """The stages of a ``DataPlan``: a step's stage is the plan's, and each start is logged with what it reads."""

    plan: DataPlan

    def stage_for(self, step: int) -> StagePlan:
        return self.plan.stage_for_step(step)

    def restarts_at(self, stage: StagePlan, step: int) -> bool:
        """An adaptive stage's loader is built every two blocks: at the first step of block b the weights of blocks
        b and b + 1 are decided (b + 1's at the end of block b − 1), so it reads both, ahead as far as it likes."""
        return stage.adaptive is not None and step > stage.start_step and (
            (step - stage.start_step) % (2 * stage.adaptive["every"]) == 0)

    def describe(self, stage: StagePlan, step: int) -> list[str]:
        plan = self.plan
        if self.restarts_at(stage, step):
            weights = ", ".join(f"{w:.4f}" for w in stage.weights_at(step))
            return [f"stage {stage.name!r} block {stage.blend.block_of(step)} at step {step}: weights [{weights}] "
                    f"(adaptive, {stage.adaptive['rule']})"]
        named, names = plan.shown_names(), source_names(plan)
        folders = ", ".join(f"{names[plan.datasets[d].folder]}: {named[plan.datasets[d].folder]} ({w})"
                            for d, w in zip(stage.dataset_ids, stage.weights_shown()))
        lines = [f"stage {stage.name!r} at step {step} (steps {stage.start_step}-{stage.end_step - 1}): "
                 f"datasets {folders}, sequence length {stage.sequence_length}, "
                 f"{stage.consumed_samples(step - 1)} of {stage.num_samples} samples already consumed"]
        if stage.schedule is not None:
            lines.append(f"  weights by schedule: {stage.schedule.describe()}, linear in between")
        if stage.adaptive is not None:
            a = stage.adaptive
            lines.append(f"  weights adaptive ({a['rule']}, every {a['every']} steps): now "
                         f"[{', '.join(f'{w:.4f}' for w in stage.weights_at(step))}]")
        packed = [plan.datasets[d] for d in stage.dataset_ids if plan.datasets[d].packing == "documents"]
        return lines + [f"  {dataset.describe()}" for dataset in packed]


class ConfigStages(PlanStages):
    """The config's stages through the runtime's loader (``build_loader``: DP sampler, collator, prefetch)."""

    from_config = True
    with_sources = True  # StageDataset's examples carry each row's source

    def __init__(self, plan: DataPlan, ctx: Any, micro_batch_size: int) -> None:
        self.plan, self.ctx, self.micro_batch_size = plan, ctx, micro_batch_size

    def loader(self, stage: StagePlan, step: int) -> Any:
        decided = stage.decided_samples()  # no read past a decision
        return build_loader(StageDataset(self.plan, stage, decided), stage.sequence_length, self.ctx,
                            self.micro_batch_size, stage.consumed_samples(step - 1),
                            num_workers=stage.num_loading_workers, use_position_ids=stage.use_position_ids,
                            prefetch=stage.prefetch)


class LoadersByStage(PlanStages):
    """A loader (or a callable building one) per stage name."""

    def __init__(self, loaders: dict, plan: DataPlan) -> None:
        names = [s.name for s in plan.stages]
        unknown = sorted(set(loaders) - set(names))
        missing = [n for n in names if n not in loaders]
        if unknown or missing:
            raise ConfigError(f"dataloader_or_dls: keys must be the stage names {names}; "
                              f"unknown {unknown}, missing {missing}")
        self.loaders, self.plan = loaders, plan

    def loader(self, stage: StagePlan, step: int) -> Any:
        # it has delivered every part of the stage so far (several after a resume that changed the stage)
        consumed = sum(p.consumed_samples(step - 1) for p in self.plan.stages if p.index == stage.index)
        return loader_from_source(self.loaders[stage.name], consumed, f"stage {stage.name!r}", step)


class OneLoader(PlanStages):
    """One loader for the whole run: it has delivered the samples of every stage so far."""

    def __init__(self, source: Any, plan: DataPlan) -> None:
        self.source, self.plan = source, plan

    def loader(self, stage: StagePlan, step: int) -> Any:
        return loader_from_source(self.source, self.plan.consumed_samples(step - 1), "the run's data loader", step)

    def same_loader_for(self, stage: StagePlan) -> bool:
        return True


def data_source(given: Any, plan: DataPlan, ctx: Any, micro_batch_size: int) -> DataSource:
    """``dataloader_or_dls`` as a ``DataSource``: None (the config's stages), a dict by stage name, or one loader."""
    if given is None:
        return ConfigStages(plan, ctx, micro_batch_size)
    adaptive = [s.name for s in plan.stages if s.adaptive is not None]
    if adaptive:
        raise ConfigError(f"dataloader_or_dls: stage {adaptive[0]!r} has adaptive weights, which only the runtime's "
                          f"own loaders follow; train it with dataloader_or_dls=None, or give it constant weights")
    if isinstance(given, dict):
        return LoadersByStage(given, plan)
    return OneLoader(given, plan)


@dataclass(frozen=True)
class ValidationPass:
    """One validation of a set, as the feed's stage: evaluation steps ``[0, end_step)``."""

    name: str
    sequence_length: int
    use_position_ids: bool
    end_step: int
    start_step: int = 0


class ValidationSource(DataSource):
    """A validation set at one sequence length in steps shaped like training steps: global rows split by
    micro-batch, then dp rank. Rows past the end of the set are padding whose labels are all masked, so the loss
    and the token count are the same whatever the layout."""

    from_config = True

    def __init__(self, vset: ValidationSet, sequence_length: int, use_position_ids: bool, ctx: Any,
                 micro_batch_size: int, accumulation: int) -> None:
        self.vset, self.ctx = vset, ctx
        self.micro_batch_size, self.accumulation = micro_batch_size, accumulation
        self.ids = vset.sample_ids(sequence_length)
        self.rows_per_step = ctx.dp_size * micro_batch_size * accumulation
        self.stage = ValidationPass(vset.name, sequence_length, use_position_ids,
                                    end_step=-(-len(self.ids) // self.rows_per_step))

    def stage_for(self, step: int) -> ValidationPass:
        return self.stage

    def loader(self, stage: ValidationPass, step: int) -> Iterator[dict]:
        """This dp rank's micro-batches of the set from evaluation step ``step`` on."""
        ctx, rows = self.ctx, self.micro_batch_size
        last = ctx.pp_size - 1
        length, positions = stage.sequence_length, stage.use_position_ids
        collate = collator_class(positions)(length, 0, last, pp_rank=ctx.pp_rank)
        for s in range(step, stage.end_step):
            for m in range(self.accumulation):
                first = s * self.rows_per_step + (m * ctx.dp_size + ctx.dp_rank) * rows
                at = np.arange(first, first + rows)
                pad = at >= len(self.ids)
                batch = collate(self.vset.examples(length, self.ids[np.where(pad, 0, at)], positions))
                if ctx.pp_rank == last and pad.any():
                    batch["label_mask"][torch.from_numpy(pad)] = False  # padding rows count no label
                yield batch
