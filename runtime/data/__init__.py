"""The runtime's data layer: windows, permutations, blends, stages, samplers, collators, loaders."""

from runtime.data.collator import DataCollatorForCLM, DataCollatorForCLMWithPositionIds
from runtime.data.dataloader import TensorPointerLoader, get_train_dataloader
from runtime.data.plan import DataPlan, StagePlan, validate_data
from runtime.data.sampler import DataParallelSampler, get_sampler
from runtime.data.stage_dataset import StageDataset
from runtime.data.stages import (
    TrainingMetadata,
    compute_remain_train_steps_of_a_data_stage_from_ckp,
    get_consumed_train_samples_of_a_data_stage_from_ckp,
    get_stage_for_step,
    training_metadata,
)
from runtime.parallel.tensor_pointer import TensorPointer

__all__ = [
    "DataCollatorForCLM",
    "DataCollatorForCLMWithPositionIds",
    "DataParallelSampler",
    "DataPlan",
    "StageDataset",
    "StagePlan",
    "TensorPointer",
    "TensorPointerLoader",
    "TrainingMetadata",
    "compute_remain_train_steps_of_a_data_stage_from_ckp",
    "get_consumed_train_samples_of_a_data_stage_from_ckp",
    "get_sampler",
    "get_stage_for_step",
    "get_train_dataloader",
    "training_metadata",
    "validate_data",
]
