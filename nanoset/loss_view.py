"""Loss masks as ``inspect`` shows them: how many tokens are trained on, and where in a document."""

from __future__ import annotations

import numpy as np

from nanoset.reader import NanosetReader

OPEN, CLOSE = "[[", "]]"
CHUNK = 1 << 24


def count_loss_tokens(ds: NanosetReader) -> int:
    """Tokens with loss 1: from the manifest when it records them per shard, else counted (a full read)."""
    recorded = [s.loss_tokens for s in ds.manifest.shards] if ds.manifest is not None else [None]
    if None not in recorded:
        return int(sum(recorded))
    total = 0
    for shard in ds.shards:
        for start in range(0, shard.num_tokens, CHUNK):
            total += int(np.count_nonzero(shard.loss[start : start + CHUNK]))
    return total


def mark_trained(decoder, ids: list[int], loss: np.ndarray) -> str:
    """The decoded document with each run of trained tokens wrapped in ``[[...]]``. Runs are decoded
    apart; the tokens of one character always share its mask, so no character is cut in two."""
    loss = np.asarray(loss, dtype=bool)
    cuts = np.flatnonzero(np.diff(loss.astype(np.int8))) + 1
    out = []
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(ids)]):
        text = decoder.decode(ids[a:b], skip_special_tokens=False)
        out.append(OPEN + text + CLOSE if loss[a] else text)
    return "".join(out)


def truncate_marked(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, closing a trained span the cut leaves open."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return cut + CLOSE if cut.rfind(OPEN) > cut.rfind(CLOSE) else cut
