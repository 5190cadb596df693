"""The training config: its schema (``schema``), strict loading from YAML (``load``) and the rules
between keys (``rules``). ``load_config(path)`` does all three."""

from nanoset.errors import ConfigError
from runtime.config.schema import (
    Config,
    DataArgs,
    DatasetStageArgs,
    HFDatasetArgs,
    LRSchedulerArgs,
    ModelArgs,
    NanosetDatasetsArgs,
    ParallelismArgs,
    RopeScalingArgs,
    TokensArgs,
    ValidationArgs,
    WeightsAtStep,
)

__all__ = ["Config", "ConfigError", "DataArgs", "DatasetStageArgs", "HFDatasetArgs", "LRSchedulerArgs", "ModelArgs",
           "NanosetDatasetsArgs", "ParallelismArgs", "RopeScalingArgs", "TokensArgs", "ValidationArgs",
           "WeightsAtStep"]
