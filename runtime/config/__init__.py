"""The training config: its schema (``schema``), strict loading from YAML (``load``) and the rules
between keys (``rules``). ``load_config(path)`` does all three, also as ``Config.from_yaml(path)`` and
``get_config_from_yaml(path)`` (the seeds' names); the loaders are imported when first asked for, so
importing the schema loads no YAML machinery and makes no import cycle."""

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
           "WeightsAtStep", "get_config_from_yaml", "load_config"]

_LAZY = {"load_config": "runtime.config.load", "get_config_from_yaml": "runtime.compat"}  # name → its home


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
