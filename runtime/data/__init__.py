"""The runtime's data layer.

``runtime.data.order`` is the data order, a pure function of (config, step) in numpy alone:
permutations, blends, windows, packing, the plan of stages and what a checkpoint records.
``runtime.data.loading`` turns it into torch batches: the stage dataset, the data-parallel
sampler, the collators, loaders, prefetch, the tensor-parallel broadcast, and the feed that gives
each rank its micro-batches of a step. The names of the
batch contract are importable from here; they load on first use, so the data order imports
without torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DataCollatorForCLM": "runtime.data.loading.collator",
    "DataCollatorForCLMWithPositionIds": "runtime.data.loading.collator",
    "DataParallelSampler": "runtime.data.loading.sampler",
    "get_sampler": "runtime.data.loading.sampler",
    "StageDataset": "runtime.data.loading.dataset",
    "TensorPointerLoader": "runtime.data.loading.dataloader",
    "get_train_dataloader": "runtime.compat",
    "TensorPointer": "runtime.parallel.tensor_pointer",
    "DataPlan": "runtime.data.order.plan",
    "StagePlan": "runtime.data.order.plan",
    "training_metadata": "runtime.data.order.plan",
    "TrainingMetadata": "runtime.data.order.record",
    "compute_remain_train_steps_of_a_data_stage_from_ckp": "runtime.compat",
    "get_consumed_train_samples_of_a_data_stage_from_ckp": "runtime.compat",
    "get_stage_for_step": "runtime.compat",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
