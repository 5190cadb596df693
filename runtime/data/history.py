"""Checks of a config against a checkpoint's data record: what has been trained cannot change.

A stage that has begun by the checkpoint's step keeps its name, start step and sequence length
(always refused otherwise: there is no way to follow a record of another stage layout). Its data
(datasets, their content, weights, seed, and for the stage in progress the global batch size)
may change only with ``checkpoints.allow_data_change``: then a finished stage follows the record
and the stage in progress continues with the new values from the resume step (see ``DataPlan``).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config import Config, ConfigError, DatasetStageArgs, NanosetDatasetsArgs
from runtime.data.record import DataStageMetadata, TrainingMetadata


def started_stages(config: Config, history: TrainingMetadata, checkpoint: str) -> dict[int, DataStageMetadata]:
    """Config stage index → its record, for every stage the checkpoint has begun; refuses a changed layout."""
    last = history.last_train_step
    by_name = {s.name: i for i, s in enumerate(config.data_stages)}
    out: dict[int, DataStageMetadata] = {}
    for r in history.data_stages:
        if r.start_training_step > last:
            continue
        i = by_name.get(r.name)
        if i is None:
            raise ConfigError(f"{checkpoint}: it trained stage {r.name!r} from step {r.start_training_step}, but "
                              f"data_stages has no stage of that name; a stage that has begun cannot be renamed "
                              f"or removed")
        stage = config.data_stages[i]
        where = f"{checkpoint}: data_stages[{i}] ({stage.name})"
        if stage.start_training_step != r.start_training_step:
            raise ConfigError(f"{where}.start_training_step: {stage.start_training_step} differs from step "
                              f"{r.start_training_step} where the checkpoint began this stage; a stage that has "
                              f"begun cannot move")
        seq = config.stage_sequence_length(stage)
        if seq != r.sequence_length:
            raise ConfigError(f"{where}.sequence_length: {seq} differs from {r.sequence_length} that the "
                              f"checkpoint trained this stage with; add a new stage from step {last + 1} instead")
        if packing_mode(stage) != r.packing:
            raise ConfigError(f"{where}.data.packing: {packing_mode(stage)} differs from {r.packing} that the "
                              f"checkpoint trained this stage with (packed samples are another sample list); restore "
                              f"it, or add a new stage from step {last + 1} instead")
        out[i] = r
    for i, stage in enumerate(config.data_stages):
        if stage.start_training_step <= last and i not in out:
            raise ConfigError(f"{checkpoint}: data_stages[{i}] ({stage.name}).start_training_step: "
                              f"{stage.start_training_step} is not after the checkpoint's step {last}, which trained "
                              f"those steps as other stages; start it at step {last + 1} or later")
    return out


def packing_mode(stage: DatasetStageArgs) -> str:
    """What a sample of the stage is: ``window``, ``documents`` or ``documents-drop`` (as recorded)."""
    if stage.data.packing == "window":
        return "window"
    return "documents-drop" if stage.data.drop_long_documents else "documents"


@dataclass
class PartSpec:
    """The data definition of a stage part: what must match the record of a stage that has begun."""

    folders: list[str]  # resolved
    weights: list[float]
    seed: int
    global_batch_size: int


def differences(config: Config, i: int, new: PartSpec, old: PartSpec, in_progress: bool) -> list[str]:
    """Human descriptions of what the config changed in stage ``i`` against its record."""
    stage = config.data_stages[i]
    where = f"data_stages[{i}] ({stage.name})"
    nanoset = isinstance(stage.data.dataset, NanosetDatasetsArgs)
    out = []
    if new.folders != old.folders:
        key = "dataset_folder" if nanoset else "hf_dataset_or_datasets"
        out.append(f"{where}.data.dataset.{key} reads {new.folders}, the checkpoint {old.folders}")
    elif new.weights != old.weights:
        out.append(f"{where}.data.dataset.dataset_weights is {new.weights}, the checkpoint's {old.weights}")
    if new.seed != old.seed:
        key = f"{where}.data.seed" if stage.data.seed is not None else f"general.seed (the seed of {where})"
        out.append(f"{key} is {new.seed}, the checkpoint's {old.seed}")
    if in_progress and new.global_batch_size != old.global_batch_size:
        out.append(f"global batch size changed mid-stage ({old.global_batch_size} → {new.global_batch_size}) in "
                   f"stage {stage.name!r}; keep dp · micro_batch_size · batch_accumulation_per_replica = "
                   f"{old.global_batch_size}")
    return out


def refuse(checkpoint: str, changes: list[str], first: int, last: int, in_progress: bool) -> ConfigError:
    """The error for a stage that has begun and whose data the config changed."""
    follow = (f"continue the stage from step {last + 1} with the new values" if in_progress
              else "keep the checkpoint's record for this finished stage")
    what = "; ".join(changes)
    if not changes[0].startswith("global batch size"):
        what = f"the data changed since this checkpoint: {what} (it trained steps {first}-{last})"
    return ConfigError(f"{checkpoint}: {what}; restore it, or set checkpoints.allow_data_change: true to {follow}")
