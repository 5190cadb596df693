"""What a checkpoint records about the data it trained on, and how to read it back.

The data order is a pure function of (config, step) only while the config describes the past
truthfully. A run resumed with a different global batch size, or with other weights for a stage
that already ran, would recompute the draws of earlier stages wrongly and repeat (or skip)
samples. So every checkpoint records, per stage that has begun, the exact parts it trained:
from which step, with which global batch size, datasets (resolved folders and content
fingerprints), weights, seed, and how many draws each dataset had taken before the part. A
resumed plan takes the past from this record and computes only the future from the config.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runtime.config import ConfigError


@dataclass
class PartRecord:
    """Steps of one stage trained with one data definition (a stage has several only after a
    resume that changed its global batch size or data with ``allow_data_change``)."""

    start_step: int
    global_batch_size: int
    datasets: list[str]  # resolved dataset folders, in the stage's order
    fingerprints: list[str]  # content fingerprint of each dataset when this part was trained
    weights: list[float]
    seed: int
    draw_offsets: list[int]  # draws each dataset had taken before this part


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


def read_metadata_json(checkpoint: str | Path) -> dict:
    """A checkpoint folder's ``metadata.json`` (training record, config), checked to hold a training record."""
    path = Path(checkpoint) / "metadata.json"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint}: no metadata.json; it is not a complete checkpoint "
                                f"(give a step-N folder)")
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
        TrainingMetadata.from_json(metadata["training"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: not a training checkpoint's metadata ({type(e).__name__}: {e}); give a step-N "
                          f"folder that a run saved") from None
    return metadata
