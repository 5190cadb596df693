"""The numbers a training step agrees on across the job, in one collective and one read back to the host.

Every ``.item()``, ``float()`` or ``tolist()`` of a GPU tensor waits until the GPU has run everything queued
before it, so a step that reads its loss, then its label tokens, then a stop flag drains the GPU each time. A
step instead collects every number it logs or agrees on — the loss sum, the label tokens, the per-source
tally, the stop signal, a failed metrics write — as named parts of one float64 vector, sums it over the world
group in one all-reduce (on the device: nothing waits) and reads it back once, after the optimizer's update
is queued.

Each part is summed over every rank of the world, so a value is contributed by exactly the ranks that make
it whole (the last pipeline stage's tp rank 0 for the loss, for example) and zeros elsewhere
(``counted=False``); an "any rank" flag is a count (> 0 somewhere). Every rank adds the same names with the
same sizes in the same order. More values ride along by adding more parts: no new collective. A part given as
a function is read when the reduction is made, at the end of the step's backward: a stop signal that came
during the step's forward or backward still counts in it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist


class StepReduction:
    """Named float64 parts, summed over the world group by ``reduce()`` and read to the host by ``read()``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # in the order added: numbers the host already knows (copied to the device together), functions giving
        # such numbers when the reduction is made, or device tensors
        self._parts: list[tuple[str, list[float] | Callable[[], Sequence[float]] | torch.Tensor]] = []
        self._slices: dict[str, slice] = {}
        self._reduced: torch.Tensor | None = None
        self._values: list[float] | None = None

    def add(self, name: str, value: float | Sequence[float] | Callable[[], Sequence[float]] | torch.Tensor,
            counted: bool = True) -> None:
        """This rank's share of ``name`` (a number, numbers, a function returning numbers when the reduction is
        made, or a tensor of any shape, flattened); with ``counted`` False, zeros of the same size (a rank that
        does not contribute to it). The layout is the order of the calls and the sizes, whether a part is on the
        host or the device."""
        if any(name == n for n, _ in self._parts):
            raise ValueError(f"step reduction: {name!r} added twice")
        if self._reduced is not None:
            raise RuntimeError(f"step reduction: {name!r} added after the reduction")
        if isinstance(value, torch.Tensor):
            t = value.detach().reshape(-1).to(torch.float64)
            self._parts.append((name, t if counted else torch.zeros_like(t)))
        elif callable(value):
            self._parts.append((name, value))
        else:
            numbers = [float(v) for v in value] if isinstance(value, Sequence) else [float(value)]
            self._parts.append((name, numbers if counted else [0.0] * len(numbers)))

    def reduce(self) -> torch.Tensor:
        """Sum every part over the world (one all-reduce, queued on the device); the reduced vector."""
        if self._reduced is not None:
            return self._reduced
        self._parts = [(name, [float(v) for v in part()] if callable(part) else part) for name, part in self._parts]
        host = [v for _, part in self._parts if isinstance(part, list) for v in part]
        copied = torch.tensor(host, dtype=torch.float64)
        if self.device.type == "cuda":  # pinned: the one host-to-device copy is queued, the host does not wait
            copied = copied.pin_memory()
        copied = copied.to(self.device, non_blocking=True)
        pieces, start, taken = [], 0, 0
        for name, part in self._parts:
            if isinstance(part, list):
                piece, taken = copied[taken:taken + len(part)], taken + len(part)
            else:
                piece = part.to(self.device)
            self._slices[name] = slice(start, start + piece.numel())
            start += piece.numel()
            pieces.append(piece)
        reduced = torch.cat(pieces) if pieces else copied
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(reduced)
        self._reduced = reduced
        return reduced

    def on_device(self, name: str) -> torch.Tensor:
        """The reduced part ``name``, still on the device (for decisions the host need not see)."""
        return self.reduce()[self._slices[name]]

    def read(self, *extra: torch.Tensor) -> None:
        """The one read back to the host: the reduced parts, and ``extra`` device scalars (values already the
        same on every rank, e.g. the gradient norm), available as ``values("extra")``."""
        reduced = self.reduce()
        if extra:
            self._slices["extra"] = slice(reduced.numel(), reduced.numel() + len(extra))
            reduced = torch.cat([reduced, torch.stack([e.detach().reshape(()).to(torch.float64) for e in extra])])
        self._values = reduced.tolist()

    def values(self, name: str) -> list[float]:
        if self._values is None:
            raise RuntimeError("step reduction: read() first")
        return self._values[self._slices[name]]

    def value(self, name: str) -> float:
        (v,) = self.values(name)
        return v
