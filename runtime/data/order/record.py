"""What a checkpoint records about the data it trained on, and what a resumed config may change of it.

The data order is a pure function of (config, step) only while the config describes the past
truthfully. A run resumed with a different global batch size, or with other weights for a stage
that already ran, would recompute the draws of earlier stages wrongly and repeat (or skip)
samples. So every checkpoint records, per stage that has begun, the exact parts it trained:
from which step, with which global batch size, datasets (resolved folders and content
fingerprints), weights, seed, and how many draws each dataset had taken before the part. A
resumed plan takes the past from this record and computes only the future from the config.

A stage that has begun by the checkpoint's step keeps its name, start step and sequence length
(always refused otherwise: there is no way to follow a record of another stage layout). Its data
(datasets, their content, weights, seed, and for the stage in progress the global batch size)
may change only with ``checkpoints.allow_data_change``: then a finished stage follows the record
and the stage in progress continues with the new values from the resume step (see ``DataPlan``).
A weight schedule is part of the record; of the stage in progress only its past counts (the
entries up to and including the first one after the resume step): the scheduled blend is causal,
so later entries may change freely.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from nanoset.errors import ConfigError
from runtime.config import Config, DatasetStageArgs, NanosetDatasetsArgs
from runtime.data.order.scheduled_blend import WeightSchedule


@dataclass
class PartRecord:
    """Steps of one stage trained with one data definition (a stage has several only after a
    resume that changed its global batch size or data with ``allow_data_change``)."""

    start_step: int
    global_batch_size: int
    datasets: list[str]  # resolved dataset folders, in the stage's order: shown (identity: the fingerprints)
    fingerprints: list[str]  # content fingerprint of each dataset when this part was trained: what names it
    weights: list[float] | None  # constant weights; None with a schedule
    seed: int
    draw_offsets: list[int]  # draws each dataset had taken before this part
    blend: str = "periodic"  # periodic (constant weights: the greedy period) | scheduled (a weight schedule)
    schedule: list[dict] | None = None  # the weight schedule, [{step, weights}], for a scheduled blend
    adaptive: dict | None = None  # adaptive mixing's options (rule, every, initial, ...), for an adaptive blend
    decisions: list[list[float]] | None = None  # adaptive: the decided weights of blocks 3, 4, ... by the checkpoint


@dataclass
class DataStageMetadata:
    name: str
    start_training_step: int
    consumed_train_samples: int
    sequence_length: int
    parts: list[PartRecord] = field(default_factory=list)  # only for stages that have begun
    packing: str = "window"  # window | documents | documents-drop: what a sample is


@dataclass
class TrainingMetadata:
    """What a checkpoint records about training progress and the data it trained on."""

    last_train_step: int
    consumed_train_samples: int
    last_stage_idx: int
    global_batch_size: int
    data_stages: list[DataStageMetadata]
    draws_per_dataset: dict[str, int] = field(default_factory=dict)
    data_fingerprint: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> TrainingMetadata:
        d = dict(d)
        stages = []
        for s in d["data_stages"]:
            s = dict(s)
            s["parts"] = [PartRecord(**p) for p in s.get("parts", [])]
            stages.append(DataStageMetadata(**s))
        d["data_stages"] = stages
        return TrainingMetadata(**d)


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
    weights: list[float] | None  # None with a schedule
    seed: int
    global_batch_size: int
    schedule: WeightSchedule | None = None
    adaptive: dict | None = None  # adaptive mixing's options, as recorded (``adaptive_options``)

    @staticmethod
    def of_record(record: PartRecord, folders: list[str]) -> PartSpec:
        schedule = WeightSchedule.from_entries(record.schedule) if record.schedule else None
        return PartSpec(folders, record.weights, record.seed, record.global_batch_size, schedule, record.adaptive)

    def describe_weights(self) -> str:
        if self.adaptive is not None:
            return "adaptive " + ", ".join(f"{k} {v}" for k, v in self.adaptive.items())
        return f"the schedule {self.schedule.describe()}" if self.schedule is not None else str(self.weights)


def adaptive_options(args, num_folders: int) -> dict:
    """An adaptive stage's options as recorded and compared: every key, ``initial`` normalised (equal by default)."""
    initial = list(args.initial) if args.initial is not None else [1.0] * num_folders
    total = float(sum(initial))
    return {"rule": args.rule, "every": args.every, "initial": [float(w) / total for w in initial],
            "min_weight": args.min_weight, "temperature": args.temperature, "smoothing": args.smoothing,
            "exploration": args.exploration}


def differences(config: Config, i: int, new: PartSpec, old: PartSpec, in_progress: bool,
                resume_step: int) -> list[str]:
    """Human descriptions of what the config changed in stage ``i`` against its record (a schedule's entries
    after the segment of ``resume_step`` are the future of a stage in progress: they may change)."""
    stage = config.data_stages[i]
    where = f"data_stages[{i}] ({stage.name})"
    nanoset = isinstance(stage.data.dataset, NanosetDatasetsArgs)
    out = []
    if new.folders != old.folders:
        key = "dataset_folder" if nanoset else "hf_dataset_or_datasets"
        out.append(f"{where}.data.dataset.{key} reads {new.folders}, the checkpoint {old.folders}")
    elif new.adaptive != old.adaptive and (new.adaptive is not None or old.adaptive is not None):
        out.append(f"{where}.data.dataset.dataset_weights is {new.describe_weights()}, the checkpoint's "
                   f"{old.describe_weights()}")
    elif (new.schedule is None) != (old.schedule is None) or new.weights != old.weights:
        out.append(f"{where}.data.dataset.dataset_weights is {new.describe_weights()}, the checkpoint's "
                   f"{old.describe_weights()}")
    elif new.schedule is not None and not (old.schedule.same_past(new.schedule, resume_step) if in_progress
                                           else old.schedule == new.schedule):
        past = (f"; a resume at step {resume_step} keeps the entries up to the first one after it"
                if in_progress else "")
        out.append(f"{where}.data.dataset.dataset_weights is {new.describe_weights()}, the checkpoint's "
                   f"{old.describe_weights()}{past}")
    if new.seed != old.seed:
        key = f"{where}.data.seed" if stage.data.seed is not None else f"general.seed (the seed of {where})"
        out.append(f"{key} is {new.seed}, the checkpoint's {old.seed}")
    if in_progress and new.global_batch_size != old.global_batch_size:
        out.append(f"global batch size changed mid-stage ({old.global_batch_size} → {new.global_batch_size}) in "
                   f"stage {stage.name!r}; keep dp · micro_batch_size · batch_accumulation_per_replica = "
                   f"{old.global_batch_size}")
    return out


def data_changed_error(checkpoint: str, changes: list[str], first: int, last: int, in_progress: bool) -> ConfigError:
    """The error for a stage that has begun and whose data the config changed."""
    follow = (f"continue the stage from step {last + 1} with the new values" if in_progress
              else "keep the checkpoint's record for this finished stage")
    what = "; ".join(changes)
    if not changes[0].startswith("global batch size"):
        what = f"the data changed since this checkpoint: {what} (it trained steps {first}-{last})"
    return ConfigError(f"{checkpoint}: {what}; restore it, or set checkpoints.allow_data_change: true to {follow}")
