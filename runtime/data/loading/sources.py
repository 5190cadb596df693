"""Where each stage's micro-batches come from: the config's datasets, or the user's loaders.

``trainer.train(dataloader_or_dls=...)`` takes nothing (the config's stages), one loader for the
whole run, or a dict of stage name → loader (or callable returning one). Each is a
``DataSource`` that builds the loader of a stage when the trainer starts it; this rank may read
nothing at all (a tp rank that receives by broadcast, a pipeline rank of TensorPointers only).

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
from collections.abc import Callable
from typing import Any

from nanoset.errors import ConfigError
from runtime.data.loading.dataloader import get_train_dataloader
from runtime.data.loading.dataset import StageDataset
from runtime.data.loading.tp_broadcast import reads_for_replica
from runtime.data.order.plan import DataPlan, StagePlan

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


class DataSource:
    """The loaders of a run's stages. ``from_config``: built from the config's datasets (so the data order,
    ``data_hash`` and ``explain`` describe them, and tp rank 0 reads for its replica)."""

    from_config = False

    def loader(self, stage: StagePlan, step: int) -> Any:
        """The loader of ``stage``, resuming at global ``step``."""
        raise NotImplementedError

    def same_loader_for(self, stage: StagePlan) -> bool:
        """Whether the loader built for an earlier stage also serves ``stage`` (one loader for the run)."""
        return False

    def reads(self, ctx: Any) -> bool:
        """Whether this rank iterates a loader (a user's loaders run on every rank)."""
        return True


class ConfigStages(DataSource):
    """The config's stages through the canonical loader (DP sampler, collator, prefetch)."""

    from_config = True

    def __init__(self, plan: DataPlan, ctx: Any, micro_batch_size: int) -> None:
        self.plan, self.ctx, self.micro_batch_size = plan, ctx, micro_batch_size

    def loader(self, stage: StagePlan, step: int) -> Any:
        return get_train_dataloader(
            StageDataset(self.plan, stage), stage.sequence_length, self.ctx, input_pp_rank=0,
            output_pp_rank=self.ctx.pp_size - 1, micro_batch_size=self.micro_batch_size,
            consumed_train_samples=stage.consumed_samples(step - 1), dataloader_num_workers=stage.num_loading_workers,
            use_position_ids=stage.use_position_ids, prefetch=stage.prefetch)

    def reads(self, ctx: Any) -> bool:
        """With tp or cp > 1 one rank of a replica's cp × tp group reads (and broadcasts); pipeline ranks that
        own no data build a loader of TensorPointers, which reads nothing."""
        return reads_for_replica(ctx) or not (ctx.is_first_pp_rank or ctx.is_last_pp_rank)


class LoadersByStage(DataSource):
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


class OneLoader(DataSource):
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
    if isinstance(given, dict):
        return LoadersByStage(given, plan)
    return OneLoader(given, plan)
