"""The training config: its schema (``schema``), strict loading from YAML (``load``), the rules between keys
(``rules``) and its parsers of text values (``parsers``, ``hf_config``). ``load_config(path)`` does it all, also as
``Config.from_yaml(path)`` and ``get_config_from_yaml(path)`` (the seeds' names); the loaders are imported when first
asked for, so importing the schema loads no YAML machinery, and ``from_yaml`` is given to ``Config`` here, where the
package is assembled, since the loader builds on the schema."""

from pathlib import Path

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



def _from_yaml(cls: type[Config], path: str | Path) -> Config:
    """The config at ``path``, loaded strictly and checked (``load_config`` under the seeds' name)."""
    return __getattr__("load_config")(path)  # the package's lazy loader: importing the schema loads no YAML


Config.from_yaml = classmethod(_from_yaml)

_LAZY = {"load_config": "runtime.config.load", "get_config_from_yaml": "runtime.compat"}  # name → its home


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
