"""A seeded bijection of [0, n), computed on the fly: O(1) memory and start-up, any n.

A balanced Feistel network permutes [0, 2^m) with 2^m the smallest even power of two ≥ n;
cycle-walking (re-applying it while the value is ≥ n) restricts it to [0, n) and keeps it a
bijection. Everything is vectorised over numpy uint64 arrays, so a whole micro-batch of
indices costs a few array operations. The key comes from (seed, dataset id, epoch): each
epoch gets its own order. ``inverse`` runs the rounds backwards (and cycle-walks the same way),
so "where in this epoch's order is sample i?" costs as much as the forward question.
"""

from __future__ import annotations

import hashlib

import numpy as np

ROUNDS = 6
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64 finaliser of (x xor key): a cheap, well-spread round function."""
    x = x ^ key
    x = x * _M1
    x ^= x >> np.uint64(30)
    x = x * _M2
    x ^= x >> np.uint64(27)
    x = x * _M3
    x ^= x >> np.uint64(31)
    return x


class FeistelPermutation:
    """``perm(i)`` for ``i`` in [0, n): a bijection determined by ``key_material``."""

    def __init__(self, n: int, *key_material: object) -> None:
        if n < 0:
            raise ValueError(f"permutation size must be ≥ 0, got {n}")
        self.n = n
        bits = max(2, (max(n, 2) - 1).bit_length())
        bits += bits % 2
        self.half = bits // 2
        self.mask = np.uint64((1 << self.half) - 1)
        digest = hashlib.blake2b(repr(key_material).encode(), digest_size=8 * ROUNDS).digest()
        self.keys = [np.uint64(int.from_bytes(digest[8 * r : 8 * r + 8], "little")) for r in range(ROUNDS)]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(self.half), x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right, key) & self.mask)
        return (left << np.uint64(self.half)) | right

    def _feistel_inverse(self, y: np.ndarray) -> np.ndarray:
        left, right = y >> np.uint64(self.half), y & self.mask
        for key in reversed(self.keys):
            left, right = right ^ (_mix(left, key) & self.mask), left
        return (left << np.uint64(self.half)) | right

    def __call__(self, index: np.ndarray | int) -> np.ndarray:
        """``perm(i)`` for an index or an array of indices; the result has the shape of ``index``."""
        return self._walk(index, self._feistel)

    def inverse(self, value: np.ndarray | int) -> np.ndarray:
        """The ``i`` with ``perm(i) == value`` (an index or an array); the result has the shape of ``value``."""
        return self._walk(value, self._feistel_inverse)

    def _walk(self, index: np.ndarray | int, rounds) -> np.ndarray:
        idx = np.asarray(index)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.n):
            bad = int(idx.max()) if int(idx.max()) >= self.n else int(idx.min())
            raise IndexError(f"permutation index {bad} outside [0, {self.n})")
        x = np.array(idx, dtype=np.uint64).reshape(-1)  # 1-d copy: cycle-walking assigns into it
        if self.n > 1:
            x = rounds(x)
            out = x >= np.uint64(self.n)
            while out.any():  # cycle-walk the few values that left [0, n)
                x[out] = rounds(x[out])
                out = x >= np.uint64(self.n)
        return x.astype(np.int64).reshape(idx.shape)[()]
