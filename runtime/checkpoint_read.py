"""Reading a checkpoint's DCP files, with a damaged checkpoint as one line instead of a traceback.

DCP reports a missing or torn shard file as ``CheckpointException``, a ``BaseException`` that
escapes every ``except Exception`` (and a missing ``.metadata`` as a logged traceback per rank
first). Every reader (resume, ``runtime.evaluate``, ``runtime.export``) goes through here.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from nanoset.errors import ConfigError
from runtime.run_start import checkpoint_step, saved_checkpoints


def earlier_checkpoints_hint(checkpoint: Path) -> str:
    """What to resume from instead of ``checkpoint``: the newest complete checkpoint before it, if any."""
    step = checkpoint_step(checkpoint.name)
    if step is None:  # a folder not named step-N: nothing to say what came before it
        return "set checkpoints.resume to another checkpoint and rerun"
    earlier = [p for p in saved_checkpoints(checkpoint.parent) if (checkpoint_step(p.name) or 0) < step]
    if earlier:
        return f"set checkpoints.resume: {earlier[-1]} (an earlier checkpoint) and rerun"
    return "no earlier checkpoint is there: start over (checkpoints.resume: null, checkpoints.replace_run: true)"


def load_dcp(state: dict, checkpoint: Path, what_to_do: str, no_dist: bool = False) -> None:
    """``dcp.load(state)`` from ``checkpoint`` in place; unreadable files are a ``ConfigError`` naming the
    checkpoint, the cause and ``what_to_do`` (raised on every rank: DCP gathers the failures)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    checkpoint = Path(checkpoint)
    if not (checkpoint / ".metadata").is_file():
        raise ConfigError(f"{checkpoint}: the DCP files are unreadable (.metadata is missing); {what_to_do}")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.load(state, checkpoint_id=str(checkpoint), no_dist=no_dist)
        except (Exception, CheckpointException) as e:  # a missing or torn shard file
            cause = next(iter(e.failures.values()))[0] if isinstance(e, CheckpointException) and e.failures else e
            raise ConfigError(f"{checkpoint}: the DCP files are unreadable ({cause}); {what_to_do}") from None
