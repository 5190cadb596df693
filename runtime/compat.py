"""The helpers Nanotron users know by name, on top of the runtime's own: loading a config, the stage of
a step, and what a checkpoint says of a stage (steps still to run, samples consumed).

Every count here is derived from the config and the checkpoint's last completed step, never
accumulated, so it is right in the middle of a stage, at its boundaries and after any number of
restarts (Nanotron's own reports 0 remaining steps mid-stage).
"""

from __future__ import annotations

from pathlib import Path

from runtime.config.load import load_config
from runtime.config.schema import Config, DatasetStageArgs
from runtime.data.order.record import TrainingMetadata

__all__ = ["compute_remain_train_steps_of_a_data_stage_from_ckp", "get_config_from_yaml",
           "get_consumed_train_samples_of_a_data_stage_from_ckp", "get_stage_for_step"]


def get_config_from_yaml(path: str | Path) -> Config:
    """``load_config`` under its Nanotron name."""
    return load_config(path)


def get_stage_for_step(config: Config, step: int) -> DatasetStageArgs:
    """The stage that global step ``step`` (1-based) belongs to."""
    return config.stage_at(step)


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
