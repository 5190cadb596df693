"""The checkpoint record: what a checkpoint's ``metadata.json`` holds beside its tensors, written and read here
only (the string keys of the file are spelled in this package and nowhere else).

Format version 2 (this one): ``format_version``, ``training`` (step, consumed samples per stage, the data's record:
see ``runtime.data.order.record``), ``lr_schedule`` (the schedule's state), ``config`` (the run's, overrides
applied), ``tokenizer`` (the data's, of the checkpoint's stage: see ``tokenizer_record``), ``step_skipped`` and
``skipped_in_a_row`` (non-finite steps), ``world_size`` (the processes that saved it) and ``extensions`` (typed
fields that later features add under their own key, each reading its absence as its default). Version 1 (no
``format_version``: checkpoints saved before it) reads with defaults; a version newer than this code knows is
refused in one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path

from nanoset.atomic import atomic_write_text
from nanoset.errors import CheckpointError, MissingPath
from runtime.checkpoint.layout import METADATA
from runtime.checkpoint.tokenizer_record import TokenizerRecord, stage_tokenizer
from runtime.data.order.plan import DataPlan, training_metadata
from runtime.data.order.record import TrainingMetadata

FORMAT_VERSION = 2
VERSION_KEY = "format_version"
SKIPPED_KEY = "step_skipped"


@dataclass
class CheckpointRecord:
    """One checkpoint's metadata, typed."""

    training: TrainingMetadata
    config: dict  # Config.to_dict() of the run that saved it
    lr_schedule: dict = field(default_factory=dict)  # LRSchedule.state_dict()
    tokenizer: TokenizerRecord | None = None  # the data's tokenizer (None: the data recorded none)
    step_skipped: bool = False  # its step was skipped (non-finite): not a state to return to
    skipped_in_a_row: int = 0  # skipped steps in a row up to it (a resumed diverging run counts on)
    world_size: int | None = None  # processes that saved it (None: not yet saved); each wrote its RNG file
    extensions: dict = field(default_factory=dict)  # later features' fields, by feature name
    version: int = FORMAT_VERSION  # the format the file was read in (written: always FORMAT_VERSION)

    @property
    def last_step(self) -> int:
        return self.training.last_train_step

    @property
    def model(self) -> dict:
        """The ``model`` section of the saved config ({} when it has none)."""
        model = self.config.get("model")
        return model if isinstance(model, dict) else {}

    def consumed(self) -> dict[str, tuple[int, int]]:
        """Stage name → (samples, tokens) it had trained on by this checkpoint (a sample is sequence length
        tokens of inputs)."""
        return {s.name: (s.consumed_train_samples, s.consumed_train_samples * s.sequence_length)
                for s in self.training.data_stages}

    @staticmethod
    def of_run(plan: DataPlan, step: int, lr_schedule: dict, skipped_in_a_row: int) -> CheckpointRecord:
        """What a run saves at ``step``: its data record, the config of its plan, the tokenizer of the step's stage;
        a skipped (non-finite) step is not one to return to, and carries the count of skipped steps in a row."""
        return CheckpointRecord(training_metadata(plan, step), plan.config.to_dict(), lr_schedule,
                                stage_tokenizer(plan, step), skipped_in_a_row > 0, skipped_in_a_row)

    def to_json(self) -> dict:
        return {VERSION_KEY: FORMAT_VERSION, "training": self.training.to_json(), "lr_schedule": self.lr_schedule,
                "config": self.config, "tokenizer": self.tokenizer.to_json() if self.tokenizer is not None else None,
                SKIPPED_KEY: self.step_skipped, "skipped_in_a_row": self.skipped_in_a_row,
                "world_size": self.world_size, "extensions": self.extensions}

    @staticmethod
    def from_json(data: object) -> CheckpointRecord:
        """The record of a parsed ``metadata.json``; ``TypeError``/``KeyError``/``ValueError`` where it is not one,
        ``NewerFormat`` for a version this code does not know."""
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
        version = data.get(VERSION_KEY, 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"{VERSION_KEY} is {version!r}, not a version number")
        if version > FORMAT_VERSION:
            raise NewerFormat(version)
        training = data["training"]
        if not isinstance(training, dict):
            raise TypeError(f"training is a JSON {type(training).__name__}, not an object")
        config, lr_schedule = data.get("config") or {}, data.get("lr_schedule") or {}
        extensions = data.get("extensions") or {}
        for key, value in (("config", config), ("lr_schedule", lr_schedule), ("extensions", extensions)):
            if not isinstance(value, dict):
                raise TypeError(f"{key} is a JSON {type(value).__name__}, not an object")
        skipped = data.get(SKIPPED_KEY, False)
        if not isinstance(skipped, bool):
            raise ValueError(f"{SKIPPED_KEY} is {skipped!r}, not true or false")
        in_a_row = data.get("skipped_in_a_row", int(skipped))  # before the count was saved: its own step's skip
        if not isinstance(in_a_row, int):
            raise TypeError(f"skipped_in_a_row is {in_a_row!r}, not a count")
        world = data.get("world_size")
        if world is not None and not _is_count(world):
            raise ValueError(f"world_size is {world!r}, not a count")
        tokenizer = data.get("tokenizer")
        try:
            history = TrainingMetadata.from_json(training)
        except KeyError as e:  # a missing field, said where it is missing
            raise KeyError(f"training.{e.args[0]}") from None
        _check_kinds(history, "training")
        return CheckpointRecord(
            training=history, config=config, lr_schedule=lr_schedule,
            tokenizer=TokenizerRecord.from_json(tokenizer, version) if tokenizer else None, step_skipped=skipped,
            skipped_in_a_row=in_a_row, world_size=world if isinstance(world, int) else None, extensions=extensions,
            version=version)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# what a field declared so must hold (the record's dataclasses declare their types as strings): the check, its name
_KINDS = {"int": (_is_count, "a count"), "str": (lambda v: isinstance(v, str), "a string"),
          "list[int]": (lambda v: isinstance(v, list) and all(map(_is_count, v)), "a list of counts"),
          "list[str]": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings")}


def _check_kinds(record: object, where: str) -> None:
    """``ValueError`` naming the first counter, name or list of ``record`` (a training record's dataclasses, nested)
    that does not hold its declared kind: a string, null or negative step would otherwise be taken here and fail,
    or count wrongly, in the middle of a resume."""
    for f in fields(record):
        value, name = getattr(record, f.name), f"{where}.{f.name}"
        if f.type in _KINDS and not _KINDS[f.type][0](value):
            raise ValueError(f"{name} is {value!r}, not {_KINDS[f.type][1]}")
        if isinstance(value, list):
            for i, item in enumerate(value):
                if is_dataclass(item):
                    _check_kinds(item, f"{name}[{i}]")


class NewerFormat(Exception):
    """A ``metadata.json`` of a format version newer than this code reads."""

    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


def read_metadata(path: Path | str, model: bool = True) -> CheckpointRecord:
    """The record of checkpoint ``path``, checked to hold what it should before anything is taken from it (and,
    with ``model``, the model section resuming, evaluating and exporting build from): a missing, damaged, foreign
    or newer ``metadata.json`` is one ``CheckpointError`` line naming the file."""
    file = Path(path) / METADATA
    if not file.is_file():
        raise MissingPath(f"{path}: no {METADATA}; it is not a complete checkpoint (give a step-N folder)")
    try:
        record = CheckpointRecord.from_json(json.loads(file.read_text(encoding="utf-8")))
    except OSError as e:
        raise CheckpointError(f"{file}: unreadable ({e.strerror or e}); choose another checkpoint") from None
    except NewerFormat as e:
        raise CheckpointError(f"{file}: written in checkpoint format version {e.version} by a newer version of the "
                              f"runtime (this one reads versions 1 to {FORMAT_VERSION}); use that version, or choose "
                              f"another checkpoint") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # not JSON, or not a record of a run
        raise CheckpointError(f"{file}: not a training checkpoint's metadata ({type(e).__name__}: {e}); give a "
                              f"step-N folder that a run saved") from None
    if model and not record.model:
        raise CheckpointError(f"{file}: records no model section (config.model); give a step-N folder that a run "
                              f"saved")
    return record


def step_was_skipped(path: Path) -> bool:
    """Whether checkpoint ``path`` is of a skipped (non-finite) step, for pruning: read without the rest of the
    record, which pruning never needs (a record it cannot read is one line, as ``read_metadata`` says it)."""
    file = Path(path) / METADATA
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file}: unreadable ({e}); choose another checkpoint") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: not a training checkpoint's metadata (a JSON {type(data).__name__}, not an "
                              f"object); give a step-N folder that a run saved")
    return bool(data.get(SKIPPED_KEY, False))


def write_metadata(folder: Path, record: CheckpointRecord) -> None:
    atomic_write_text(folder / METADATA, json.dumps(record.to_json(), indent=1))
