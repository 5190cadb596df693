"""A user error that some ranks find and others do not, raised on every rank.

A rank that stops alone leaves the others waiting in their next collective (a pipeline send, an
FSDP gather) until gloo or NCCL fails them with a traceback of its own. Where ranks can judge the
same thing differently (each checks the micro-batches its own loader gave, a pipeline's first rank
the inputs, its last the labels), they agree first: one small all-reduce, and only when some rank
found an error, one gather of the errors; every rank then raises the lowest failing rank's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from nanoset.errors import NanosetError


def raise_together(error: NanosetError | None, device: torch.device) -> None:
    """Called by every rank of the job with its own verdict (``None``: nothing wrong here); raises on every
    rank the error of the lowest rank that found one, or returns on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if error is not None:
            raise error
        return
    flag = torch.tensor([int(error is not None)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if not flag.item():
        return
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    raise next(e for e in errors if e is not None) from None
