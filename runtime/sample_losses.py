"""Per-sample loss: every sample's summed token loss and label tokens, a by-product of the step's loss.

The engine already has each micro-batch's per-token losses; summing them per row costs one reduction
over tokens. Each row carries its position in the global batch (``global_rows``: the sampler's rule,
micro-batch ``m`` of dp rank ``r`` holds positions ``[m·dp·mbs + r·mbs, +mbs)``), so the rows of every
rank and micro-batch land in one float64 vector of ``2·G`` numbers (``scatter``) that rides in the step's
one all-reduce: dp ranks fill their own positions, cp ranks add the sums of their slices of the same
rows, and the pipeline's last stage (the only one with a loss) sends the result on. Layout-invariant
up to float rounding: the same token losses, summed in another order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

IGNORE_INDEX = -100  # the label id of a token that counts in no loss


def global_rows(num_micro_batches: int, rows: int, dp_rank: int, dp_size: int,
                device: torch.device | None = None) -> torch.Tensor:
    """Each row's position in the global batch, for this dp rank's ``num_micro_batches`` of ``rows`` rows."""
    m = torch.arange(num_micro_batches, device=device)[:, None]
    return (m * dp_size * rows + dp_rank * rows + torch.arange(rows, device=device)).flatten()


def row_sums(token_losses: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[rows, 2]`` float64: each row's summed token loss and its label tokens (targets not ``IGNORE_INDEX``).
    ``token_losses`` is the flat per-token loss of ``targets`` (0 where ignored, as cross-entropy gives it)."""
    rows = targets.shape[0]
    return torch.stack([token_losses.detach().view(rows, -1).double().sum(1),
                        (targets != IGNORE_INDEX).sum(1).double()], dim=1)


def scatter(positions: torch.Tensor, sums: torch.Tensor, global_batch_size: int) -> torch.Tensor:
    """The ``[2·G]`` vector (Σ loss, label tokens per position) of these rows; other positions 0, to be summed
    with the other ranks'."""
    out = torch.zeros((global_batch_size, 2), dtype=torch.float64, device=sums.device)
    out.index_add_(0, positions, sums)
    return out.flatten()


@dataclass(frozen=True)
class SampleLosses:
    """One step's samples in global batch order: summed token loss (float64) and label tokens."""

    loss: np.ndarray  # [G] float64
    label_tokens: np.ndarray  # [G] int64

    @classmethod
    def from_flat(cls, values: list[float] | np.ndarray) -> SampleLosses:
        """From the ``[2·G]`` vector ``scatter`` builds, once reduced over the ranks."""
        pairs = np.asarray(values, dtype=np.float64).reshape(-1, 2)
        return cls(pairs[:, 0].copy(), np.rint(pairs[:, 1]).astype(np.int64))

    def per_token(self) -> np.ndarray:
        """Each sample's mean token loss; NaN for a sample without label tokens."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.label_tokens > 0, self.loss / np.maximum(self.label_tokens, 1), np.nan)

    def ranked(self) -> list[int]:
        """Positions by mean token loss, highest first (samples without label tokens last; ties by position)."""
        per_token = self.per_token()
        key = np.where(np.isnan(per_token), -np.inf, per_token)
        return sorted(range(len(key)), key=lambda p: (-key[p], p))
