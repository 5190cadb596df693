"""User-supplied loaders (``trainer.train(dataloader_or_dls=...)``) on resume: advanced, never replayed.

A resumed run must not feed a custom loader's first samples again while the log says they were
consumed. The protocol, in order:

1. a callable (a factory, not itself iterable) taking ``consumed_train_samples`` is called with
   the number of samples already consumed, and builds a loader that starts there;
2. any other callable is called with no arguments; its result is treated as a loader object;
3. a loader object with a ``consumed_train_samples`` attribute gets it set to that number before
   the trainer iterates it, and must start there;
4. any other loader object is accepted only when nothing is consumed (a fresh start or a stage
   start); resuming in the middle of its samples is refused rather than replayed from sample 0.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from runtime.config import ConfigError

CONSUMED = "consumed_train_samples"


def _takes_consumed(factory: Callable) -> bool:
    try:
        return CONSUMED in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def loader_from_source(source: Any, consumed: int, what: str, step: int) -> Any:
    """The loader to iterate for ``what`` (e.g. "stage 'pretrain'") at global ``step`` when ``consumed``
    of its samples are already trained on; raises ``ConfigError`` when it cannot start there."""
    if callable(source) and not hasattr(source, "__iter__"):
        if _takes_consumed(source):
            return source(**{CONSUMED: consumed})
        source = source()
    if consumed == 0:
        return source
    if hasattr(source, CONSUMED):
        setattr(source, CONSUMED, consumed)
        return source
    raise ConfigError(f"{what}: resuming at step {step} with {consumed} of its samples already consumed, but its "
                      f"loader ({type(source).__name__}) cannot be advanced and would replay them from sample 0; "
                      f"pass a callable taking {CONSUMED} that builds the loader from there, or give the loader a "
                      f"{CONSUMED} attribute")
