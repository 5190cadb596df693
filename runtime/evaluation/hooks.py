"""``evaluation.hooks``: the user's own evaluations, ``module:function`` names imported before the run starts and
called on every rank at each evaluation as ``function(model=engine, step=step)``. A hook may return
``{name: {metric: number}}``, which joins the metrics row's ``eval``; anything else it returns is ignored."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

from nanoset.errors import ConfigError

Hook = Callable[..., object]


def load_hooks(names: list[str]) -> list[Hook]:
    """The functions ``names`` name; a module that does not import or a missing function is one ``ConfigError``."""
    hooks = []
    for i, name in enumerate(names):
        module_name, _, function = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ConfigError(f"evaluation.hooks[{i}] {name!r}: module {module_name!r} does not import ({e}); put it "
                              f"on PYTHONPATH") from None
        hook = getattr(module, function, None)
        if not callable(hook):
            raise ConfigError(f"evaluation.hooks[{i}] {name!r}: {module_name} has no function {function!r}")
        hooks.append(hook)
    return hooks


def hook_metrics(name: str, returned: object) -> dict[str, dict[str, float]]:
    """What a hook returned, as rows of the metrics' ``eval`` (finite numbers only; other values left out)."""
    if not isinstance(returned, dict):
        return {}
    out = {}
    for key, metrics in returned.items():
        if isinstance(metrics, dict):
            out[str(key)] = {str(k): v for k, v in metrics.items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    if returned and not out:
        raise ConfigError(f"evaluation hook {name} returned {type(returned).__name__} values; return "
                          f"{{name: {{metric: number}}}} or None")
    return out
