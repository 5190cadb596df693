"""Hugging Face ``config.json`` → our ``model`` section (``model.init_from_hf``), torch-free: the config reads it
while loading; the other way, export, is ``runtime.hf.export.hf_config_json``.

Import reads the config of a model whose ``architectures`` one of our families takes (its ``ModelSpec``:
``LlamaForCausalLM``, ``MistralForCausalLM`` without sliding window, …) in the transformers 4 form
(``rope_theta``, ``rope_scaling``) or the transformers 5 form (``rope_parameters``), refuses what the
family's model cannot reproduce (the spec's ``hf_requires``: biases, another activation, a sliding window; a
rope scaling other than linear and llama3), and fills ``model.family`` and the sizes the YAML omits; values
given in both must agree.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from nanoset.errors import ConfigError, MissingPath
from runtime.config.schema import SIZE_KEYS, ModelArgs, RopeScalingArgs
from runtime.models.registry import FAMILIES, family_of_architectures
from runtime.models.spec import ModelSpec

LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def read_hf_config(folder: str | Path) -> tuple[dict, ModelSpec]:
    """``folder/config.json`` as a dict and the family that takes it, checked to be a model the family's model
    reproduces."""
    path = Path(folder) / "config.json"
    if not Path(folder).is_dir():
        raise MissingPath(f"model.init_from_hf: {folder}: no such folder (give a local folder holding a "
                                f"Hugging Face model's config.json and model.safetensors)")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingPath(f"model.init_from_hf: {path}: missing; the folder must hold a Hugging Face "
                                f"model's config.json") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.init_from_hf: {path}: not readable JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"model.init_from_hf: {path}: not a JSON object")
    archs = cfg.get("architectures") or []
    spec = family_of_architectures(archs) if isinstance(archs, list) else None
    if spec is None:
        known = [a for s in FAMILIES.values() for a in s.hf_architectures]
        raise ConfigError(f"model.init_from_hf: {path}: architectures {archs} is not one of {known}; "
                          f"only Llama-style models can be imported")
    for key, supported in spec.hf_requires.items():
        if cfg.get(key, supported) != supported:
            raise ConfigError(f"model.init_from_hf: {path}: {key} {cfg[key]!r} is not supported (our {spec.title} "
                              f"has {key} {supported!r})")
    return cfg, spec


def _number(d: dict, key: str, default: float | None, where: str, label: str = "") -> float:
    """``d[key]`` as a float (``default`` when absent or null); a string or bool is an error, not a traceback."""
    value = d.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        what = "missing" if value is None else f"{value!r}, not a number"
        raise ConfigError(f"model.init_from_hf: {where}: {label}{key} is {what}")
    return float(value)


def rope_from_hf(cfg: dict, where: str) -> tuple[float, RopeScalingArgs | None]:
    """``(rope_theta, scaling)`` from either config form; an unsupported scaling is an error, never ignored."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict):  # transformers 5 (rope_theta inside, or beside it in some files)
        theta = _number(params, "rope_theta", _number(cfg, "rope_theta", 10000.0, where), where, "rope_parameters.")
        scaling, label = params, "rope_parameters."
    else:  # transformers 4: rope_theta beside an optional rope_scaling
        theta, scaling, label = _number(cfg, "rope_theta", 10000.0, where), cfg.get("rope_scaling"), "rope_scaling."
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        raise ConfigError(f"model.init_from_hf: {where}: rope_scaling is {scaling!r}, not an object")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind == "linear":
        return theta, RopeScalingArgs("linear", _number(scaling, "factor", None, where, label))
    if kind == "llama3":
        missing = [k for k in LLAMA3_KEYS if k not in scaling]
        if missing:
            raise ConfigError(f"model.init_from_hf: {where}: llama3 rope scaling without {', '.join(missing)}")
        factor, low, high, original = (_number(scaling, k, None, where, label) for k in LLAMA3_KEYS)
        return theta, RopeScalingArgs("llama3", factor, low, high, int(original))
    raise ConfigError(f"model.init_from_hf: {where}: rope scaling {kind!r} is not supported (only linear and llama3); "
                      f"training with it would silently change the model")


def _integer(cfg: dict, key: str, where: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"model.init_from_hf: {where}: {key} is missing or not an integer")
    return value


def hf_model_values(folder: str | Path) -> dict:
    """Our ``model`` keys as the Hugging Face config at ``folder`` sets them (its family too)."""
    cfg, spec = read_hf_config(folder)
    where = str(Path(folder) / "config.json")
    out = {"family": spec.name}
    out.update({key: _integer(cfg, key, where) for key in SIZE_KEYS})
    for key in ("num_key_value_heads", "head_dim"):  # optional; null as absent
        if cfg.get(key) is not None:
            _integer(cfg, key, where)
    out["num_key_value_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or spec.hf_head_dim
    out["head_dim"] = None if head_dim in (None, cfg["hidden_size"] // cfg["num_attention_heads"]) else head_dim
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ConfigError(f"model.init_from_hf: {where}: tie_word_embeddings is {tie!r}, not true or false")
    out["tie_word_embeddings"] = tie
    out["rms_norm_eps"] = _number(cfg, "rms_norm_eps", 1e-6, where)
    out["rope_theta"], out["rope_scaling"] = rope_from_hf(cfg, where)
    return out


def apply_hf_config(model: ModelArgs, given: set[str]) -> None:
    """Fill ``model`` from its ``init_from_hf`` config.json; keys in ``given`` (written in the YAML) must agree."""
    values = hf_model_values(model.init_from_hf)
    for key, value in values.items():
        if key in given:
            configured = getattr(model, key)
            if key == "num_key_value_heads" and configured is None:
                configured = model.num_attention_heads
            if key == "head_dim" and (configured or 0) == values["hidden_size"] // values["num_attention_heads"]:
                configured = None
            if key == "rope_scaling" and configured is not None:
                configured = RopeScalingArgs(**asdict(configured))
            if configured != value:
                raise ConfigError(f"model.{key}: {_show(configured)} in the config but {_show(value)} in "
                                  f"{Path(model.init_from_hf) / 'config.json'} (model.init_from_hf); remove the key "
                                  f"or make them agree")
        setattr(model, key, value)


def _show(value) -> object:
    return asdict(value) if isinstance(value, RopeScalingArgs) else value
