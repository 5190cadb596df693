"""``--set KEY=VALUE``: a config key changed on the command line, as if the file said it.

``KEY`` is a dotted path through the config's sections, with list indices (``tokens.train_steps``,
``data_stages[1].data.seed``); ``VALUE`` is YAML, read as the file is (``80``, ``3e-4``, ``[a, b]``,
``{step: 1, weights: [1, 2]}``, ``null``). Each key is checked against the schema before it is applied (an
unknown key is one line with the closest valid one); the value then goes into the file's data, so the
config is built and checked exactly as if the file held it: the same types, ranges and rules, the same
``Config``, the same data order. Several ``--set`` apply in order.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import shlex
import types
import typing
from dataclasses import dataclass
from typing import Any, Union

from nanoset.errors import ConfigError
from runtime.config.schema import Config

_KEY = re.compile(r"[A-Za-z_]\w*(\[\d+\])*(\.[A-Za-z_]\w*(\[\d+\])*)*")
_PART = re.compile(r"([A-Za-z_]\w*)|\[(\d+)\]")
_NOT_GIVEN = object()


@dataclass(frozen=True)
class Override:
    """One ``--set``: its text as given, the key's parts (names and list indices) and the value's YAML text."""

    text: str
    parts: tuple[str | int, ...]
    value_text: str

    @property
    def key(self) -> str:
        return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(self.parts))


def config_arguments(path: str, overrides: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``--config PATH --set K=V …`` for the commands the runtime suggests: the config as this process read it,
    less ``checkpoints.resume`` (a suggested command chooses its own checkpoint; a rewind's launcher sets it)."""
    kept = [o for o in overrides if parse_override(o).key != "checkpoints.resume"]
    return ("--config", str(path), *(word for o in kept for word in ("--set", o)))


def suggested_command(arguments: tuple[str, ...], command: str, *args: object) -> str:
    """``nanoset COMMAND`` on the same config (``arguments``: a config's ``Config.arguments``), then ``args``: a line
    to run as printed."""
    return shlex.join(["nanoset", command, *arguments, *map(str, args)])


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` on a command that reads a config (repeatable): ``args.overrides``, in order."""
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="a config key as if the file said it, e.g. tokens.train_steps=80 (repeatable; see "
                             "docs/config.md)")


def parse_override(text: str) -> Override:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.fullmatch(key):
        raise ConfigError(f"--set {text}: expected KEY=VALUE with a dotted key, e.g. --set tokens.train_steps=80 or "
                          f"--set data_stages[1].data.seed=7")
    parts = tuple(int(index) if index else name for name, index in _PART.findall(key))
    return Override(text, parts, value)


def apply_override(data: dict, override: Override, value: Any) -> str:
    """Put ``value`` at the override's key of ``data`` (the file's document), after checking the key against the
    schema; missing sections on the way are made. Returns what changed, ``KEY: BEFORE → AFTER`` (BEFORE: the
    file's value, or the default where the file has none)."""
    node: Any = data
    hints: list[Any] = [Config]
    where, default = "", _NOT_GIVEN
    for i, part in enumerate(override.parts):
        last = i == len(override.parts) - 1
        if isinstance(part, int):
            options = _options(hints)
            hints = [typing.get_args(h)[0] for h in options if typing.get_origin(h) is list]
            if not hints and Any not in options:
                raise ConfigError(f"--set {override.text}: {where} is not a list")
            hints = hints or [Any]
            if not isinstance(node, list) or part >= len(node):
                have = len(node) if isinstance(node, list) else 0
                entries = f"{where}[0]" + (f" to {where}[{have - 1}]" if have > 1 else "") if have else "none"
                raise ConfigError(f"--set {override.text}: {where}[{part}] is not in the config ({have} "
                                  f"entr{'y' if have == 1 else 'ies'}: {entries}); --set changes entries, it does not "
                                  f"add them")
            where = f"{where}[{part}]"
        else:
            hints, default = _field(hints, part, where, override)
            where = f"{where}.{part}" if where else part
            if not isinstance(node, dict):
                raise ConfigError(f"--set {override.text}: {where.rsplit('.', 1)[0]} is {node!r} in the config, not a "
                                  f"section with keys")
        if last:
            before = node[part] if _holds(node, part) else default
            node[part] = value
            return f"{override.key}: {_shown(before)} → {_shown(value)}"
        if not _holds(node, part) or node[part] is None:
            node[part] = {}  # a section the file leaves out (or null): its keys from here
        node = node[part]
    raise AssertionError("an override has at least one part")


def _holds(node: Any, part: str | int) -> bool:
    return part in node if isinstance(node, dict) else isinstance(node, list) and part < len(node)


def _options(hints: list[Any]) -> list[Any]:
    """The types a value may have here, unions and Optional unfolded."""
    out = []
    for h in hints:
        if typing.get_origin(h) in (Union, types.UnionType):
            out.extend(a for a in typing.get_args(h) if a is not type(None))
        else:
            out.append(h)
    return out


def _field(hints: list[Any], name: str, where: str, override: Override) -> tuple[list[Any], Any]:
    """The types of key ``name`` under a node of types ``hints`` and its default; an unknown key is an error
    naming the closest key there."""
    options = _options(hints)
    found, default, names = [], _NOT_GIVEN, []
    for h in options:
        if h is Any or typing.get_origin(h) is dict:  # free-form keys (validation.datasets)
            found.append(typing.get_args(h)[1] if typing.get_origin(h) is dict else Any)
        elif dataclasses.is_dataclass(h):
            fields = {f.name: f for f in dataclasses.fields(h) if f.init}
            names += fields
            if name in fields:
                found.append(typing.get_type_hints(h)[name])
                f = fields[name]
                if f.default is not dataclasses.MISSING:
                    default = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    default = f.default_factory()
    if found:
        return found, default
    key = f"{where}.{name}" if where else name
    if not names:
        raise ConfigError(f"--set {override.text}: {where} is a value, not a section with keys")
    close = difflib.get_close_matches(name, list(dict.fromkeys(names)), n=1)
    hint = (f"; did you mean {(f'{where}.' if where else '') + close[0]}?" if close
            else f"; the keys of {where or 'the config'}: {', '.join(dict.fromkeys(names))}")
    raise ConfigError(f"--set {override.text}: {key}: unknown key{hint}")


def _shown(value: Any) -> str:
    if value is _NOT_GIVEN:
        return "(not given)"
    if dataclasses.is_dataclass(value):
        return "(its defaults)"
    return "null" if value is None else str(value)
