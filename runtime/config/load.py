"""Loading a config: strict YAML → the schema's dataclasses → the sizes of ``model.init_from_hf`` → the rules.

Unknown keys are errors naming their path and the closest valid key; missing required keys and
wrong types are errors naming the path. Nothing is read but the YAML itself (and, with
``model.init_from_hf``, that model's ``config.json``); the data is checked later, at start-up.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from nanoset.errors import ConfigError
from runtime.config.hf_config import apply_hf_config
from runtime.config.overrides import apply_override, config_arguments, parse_override
from runtime.config.rules import validate_config
from runtime.config.schema import Config


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _fit(cls: type, data: dict) -> tuple[int, int, float]:
    """How well the keys of ``data`` fit dataclass ``cls``: (its required keys there, keys it has, summed
    likeness of each key to its closest field), so a typo is reported against the kind of entry it was
    meant for, and a key of another kind (``sft`` beside ``dataset_folder``) against the kind whose
    required key is given."""
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = [f.name for f in fields]
    required = sum(f.name in data for f in fields
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    known = sum(str(k) in names for k in data)
    close = sum(max(difflib.SequenceMatcher(None, str(k), n).ratio() for n in names) for k in data)
    return required, known, close


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = {}
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except ConfigError as e:
                errors[arg] = str(e)
        records = [a for a in errors if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and records:  # a mapping: the error of the kind its keys fit best
            raise ConfigError(errors[max(records, key=lambda a: _fit(a, value))])
        if isinstance(value, list) and value:  # a list: the error of the kind of list its first item is
            shaped = [a for a in errors if typing.get_origin(a) is list
                      and dataclasses.is_dataclass(typing.get_args(a)[0]) == isinstance(value[0], dict)]
            if len(shaped) == 1:
                raise ConfigError(errors[shaped[0]])
        raise ConfigError(next(iter(errors.values())) if len(errors) == 1 else f"{path}: {value!r} matches none of "
                          f"{' | '.join(_type_name(a) for a in args)}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return {_convert(k, key_tp, f"{path} key {k!r}"): _convert(v, value_tp, f"{path}.{k}")
                for k, v in value.items()}
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{path}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    if tp is Any:
        return value
    raise TypeError(f"unsupported config type {tp} at {path}")


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, strictly. ``path``: where ``data`` sits, for the messages ("" for the
    whole config, so its keys read ``model.hidden_size`` as everywhere else)."""
    if not isinstance(data, dict):
        what = f"{path}: expected a mapping of {cls.__name__} keys" if path else (
            f"expected a mapping of the config's sections ({', '.join(f.name for f in dataclasses.fields(cls))})")
        raise ConfigError(f"{what}, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(fields)}"
            raise ConfigError(f"{_join(path, key)}: unknown key{hint}")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], _join(path, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{_join(path, name)}: required key is missing")
    return cls(**kwargs)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def yaml_problem(path: Path, error: yaml.YAMLError) -> str:
    """A YAML error in one line, ``FILE:LINE:COLUMN: not valid YAML: PROBLEM`` (1-based, where the parser stopped;
    the construct it was in and where that began), without the excerpt and caret PyYAML prints under it."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context, began = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context and began is not None:
        problem += f" ({context} that began at line {began.line + 1}, column {began.column + 1})"
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    return f"{where}: not valid YAML: {problem}"


class ConfigLoader(yaml.SafeLoader):
    """YAML as a config is written: PyYAML's safe types, numbers in exponent form without a dot (``3e-4``,
    ``1e5``) read as numbers (YAML 1.2 does; PyYAML's 1.1 rules made them strings), and a key given twice in one
    mapping refused (PyYAML keeps the last one silently: a second ``tokens:`` would replace the first)."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # ``<<:`` merges are meant to be overridden
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (first at line {seen[key].start_mark.line + 1}): "
                                    f"keep one", key_node.start_mark)
                seen[key] = key_node
        return super().construct_mapping(node, deep)


EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789"))


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The config at ``path`` with the ``--set KEY=VALUE`` ``overrides`` applied, built strictly and checked by
    every rule that needs no data."""
    return read_config(path, overrides)[0]


def read_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> tuple[Config, list[str]]:
    """``load_config``, and what each override changed (``KEY: BEFORE → AFTER``, for ``--check``). A mistake in
    the config is said with the file and, where there are overrides, them: ``cfg.yaml with --set K=V: ...``."""
    path = Path(path)
    parsed = [parse_override(text) for text in overrides]  # a malformed --set costs no file read
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=ConfigLoader)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); save it "
                          f"as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config ({e.strerror or e}); pass a YAML file") from None
    except yaml.YAMLError as e:
        raise ConfigError(yaml_problem(path, e)) from None
    changes = []
    for override in parsed:
        if not isinstance(data, dict):
            break  # the document itself is wrong: said below
        try:
            value = yaml.load(override.value_text, Loader=ConfigLoader)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {override.text}: the value is not valid YAML "
                              f"({getattr(e, 'problem', None) or str(e).splitlines()[0]})") from None
        changes.append(apply_override(data, override, value))
    try:
        config = config_from_data(data)
    except ConfigError as e:
        where = f"{path} with {' '.join(f'--set {o.text}' for o in parsed)}" if parsed else str(path)
        raise ConfigError(f"{where}: {e}") from None
    config.arguments = config_arguments(str(path), [o.text for o in parsed])
    return config, changes


def config_from_data(data: Any) -> Config:
    """A config from plain data (a YAML document), built strictly and checked by every rule that needs no data."""
    config = from_dict(Config, data)
    if config.model.init_from_hf is not None:
        apply_hf_config(config.model, given=set(data["model"]))
    validate_config(config)
    return config
