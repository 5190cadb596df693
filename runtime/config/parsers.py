"""The config's parsers of its text values, plain Python: a step range and a document (``surgery``), a mixing
rule's name (``adaptive.rule``). The config checks with them before start-up; the data order and the commands
parse the same text with them."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

from nanoset.errors import ConfigError

DIGITS = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() also takes "²", which int() refuses
MAX_DIGITS = 18  # every index of up to 18 digits fits the int64 arrays the order computes with
RULE_NAMES = ("loss_proportional", "odm")  # the built-in mixing rules (runtime/data/order/mixing_rules.py)


def parse_step_range(text: str, where: str) -> tuple[int, int]:
    """``A:B`` (both included, 1 ≤ A ≤ B) → (A, B); a bad form is one ``ConfigError`` naming ``where``."""
    first, sep, last = str(text).partition(":")
    if not sep or not DIGITS.fullmatch(first.strip()) or not DIGITS.fullmatch(last.strip()) \
            or not 1 <= int(first) <= int(last):
        raise ConfigError(f"{where}: expected A:B with 1 ≤ A ≤ B (steps, both included), got {text!r}")
    return int(first), int(last)


def parse_document(text: str, where: str) -> tuple[str, int]:
    """``FOLDER:DOC`` → (folder, document index); a bad form is a ``ConfigError`` naming ``where``."""
    folder, sep, doc = text.strip().rpartition(":")
    if not sep or not folder or not DIGITS.fullmatch(doc.strip()):
        raise ConfigError(f"{where}: expected FOLDER:DOC (a dataset folder and a document index), got {text.strip()!r}")
    if len(doc.strip()) > MAX_DIGITS:
        raise ConfigError(f"{where}: the document index is too large, got {text.strip()!r}; give the index of a "
                          f"document of the folder")
    return folder, int(doc)


def user_rule_function(name: str, key: str) -> Callable:
    """The function a user's rule ``module:function`` names (importable from here), or one line saying why not;
    ``name`` is not a built-in rule (``RULE_NAMES``)."""
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"{key}: {name!r} is not a rule; give one of {', '.join(RULE_NAMES)} or a function "
                          f"as module:function")
    try:
        found = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ConfigError(f"{key}: {name!r}: module {module!r} cannot be imported ({e}); put it on "
                          f"PYTHONPATH") from None
    except AttributeError:
        raise ConfigError(f"{key}: {name!r}: module {module!r} has no function {attr!r}") from None
    if not callable(found):
        raise ConfigError(f"{key}: {name!r} is not a function")
    return found


def check_rule(name: str, key: str) -> None:
    """A built-in rule, or a user's importable ``module:function``; else one line saying why not."""
    if name not in RULE_NAMES:
        user_rule_function(name, key)
