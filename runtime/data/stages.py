"""Stage bookkeeping and the seeds' resume helpers, all derived from the last completed step.

The reference reports 0 remaining steps in the middle of a stage and lets per-stage counts
drift after a stage change; here every count is computed from the plan (the config, plus a
checkpoint's record of what it trained) and the last step, never accumulated, so it is right
mid-stage, at boundaries and after any number of restarts.
"""

from __future__ import annotations

from runtime.config import Config, DatasetStageArgs
from runtime.data.plan import DataPlan
from runtime.data.record import DataStageMetadata, PartRecord, TrainingMetadata

__all__ = ["DataStageMetadata", "PartRecord", "TrainingMetadata", "compute_remain_train_steps_of_a_data_stage_from_ckp",
           "get_consumed_train_samples_of_a_data_stage_from_ckp", "get_stage_for_step", "training_metadata"]


def get_stage_for_step(config: Config, step: int) -> DatasetStageArgs:
    """The stage that global step ``step`` (1-based) belongs to."""
    if not 1 <= step <= config.tokens.train_steps:
        raise ValueError(f"step {step} is outside [1, tokens.train_steps={config.tokens.train_steps}]")
    return max((s for s in config.data_stages if s.start_training_step <= step), key=lambda s: s.start_training_step)


def training_metadata(plan: DataPlan, last_step: int) -> TrainingMetadata:
    """The metadata of a run whose steps ``1..last_step`` are done, with the record of what they trained."""
    config = plan.config
    current = plan.stage_for_step(min(max(last_step, 1), config.tokens.train_steps))
    return TrainingMetadata(
        last_train_step=last_step, consumed_train_samples=plan.consumed_samples(last_step),
        last_stage_idx=current.index, global_batch_size=config.global_batch_size, data_stages=plan.record(last_step),
        draws_per_dataset=plan.draws_after(last_step), data_fingerprint=plan.fingerprint)


def compute_remain_train_steps_of_a_data_stage_from_ckp(stage: DatasetStageArgs, config: Config,
                                                        metadata: TrainingMetadata) -> int:
    """Steps of ``stage`` still to run after the checkpoint (its full length if it has not begun)."""
    end = config.stage_end_step(stage)
    return max(end - max(stage.start_training_step, metadata.last_train_step + 1), 0)


def get_consumed_train_samples_of_a_data_stage_from_ckp(stage: DatasetStageArgs,
                                                       metadata: TrainingMetadata) -> int | None:
    """Samples of ``stage`` consumed at the checkpoint; None if the checkpoint does not know the stage."""
    return next((s.consumed_train_samples for s in metadata.data_stages
                 if s.start_training_step == stage.start_training_step and s.name == stage.name), None)
