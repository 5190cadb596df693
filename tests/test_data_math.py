"""Pure data math: the permutation, the blend schedule, windows and position ids (numpy only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoset import Manifest, ShardWriter, TokenizerInfo, open_dataset, write_manifest
from runtime.data.blend import BlendSchedule, round_weights
from runtime.data.permutation import FeistelPermutation
from runtime.data.windows import TokenWindows


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 31, 127, 8191, 2**10 - 1, 2**10, 2**10 + 1, 2**16 + 1, 1_000_003])
def test_permutation_is_a_bijection(n):
    y = FeistelPermutation(n, 42, "ds", 0)(np.arange(n))
    assert y.min() == 0 and y.max() == n - 1 and len(np.unique(y)) == n


def test_permutation_large_is_injective_on_a_slice():
    n = 3_000_000_017  # larger than any real window count; memory stays O(batch)
    perm = FeistelPermutation(n, 1, "big", 0)
    idx = np.arange(0, n, n // 200_000)[:200_000]
    y = perm(idx)
    assert (y < n).all() and len(np.unique(y)) == len(idx)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**31), epoch=st.integers(0, 100))
def test_permutation_bijection_property(n, seed, epoch):
    y = FeistelPermutation(n, seed, "x", epoch)(np.arange(n))
    assert np.array_equal(np.sort(y), np.arange(n))


def test_epochs_and_seeds_give_different_orders():
    n = 1000
    orders = [FeistelPermutation(n, 42, "ds", e)(np.arange(n)) for e in range(3)]
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
    assert not np.array_equal(orders[0], FeistelPermutation(n, 43, "ds", 0)(np.arange(n)))
    np.testing.assert_array_equal(orders[0], FeistelPermutation(n, 42, "ds", 0)(np.arange(n)))  # deterministic
    assert abs(np.corrcoef(orders[0], np.arange(n))[0, 1]) < 0.1  # actually shuffled
    with pytest.raises(IndexError):
        FeistelPermutation(10, 1)(np.array([10]))


@pytest.mark.parametrize("weights", [[0.7, 0.3], [1, 1, 1], [0.5, 0.25, 0.125, 0.125], [0.999, 0.001], [3, 1]])
def test_blend_counts_exact_per_period_and_prefix_within_one(weights):
    b = BlendSchedule(weights)
    assert b.counts.sum() == b.period == 1000 and (b.counts >= 1).all()
    n = 3 * b.period + 17
    d, k = b.locate(np.arange(n))
    share = b.counts / b.period
    for ds in range(len(weights)):
        in_period = np.bincount(d[: b.period], minlength=len(weights))
        assert in_period[ds] == b.counts[ds]
        prefix = np.cumsum(d == ds)
        target = share[ds] * np.arange(1, n + 1)
        assert np.abs(prefix - target).max() < 1.0
        # draw numbers of a dataset are 0, 1, 2, ... in stream order
        np.testing.assert_array_equal(k[d == ds], np.arange((d == ds).sum()))
        assert b.draws(n)[ds] == (d == ds).sum()


def test_blend_rounding():
    assert round_weights([0.7, 0.3], 1000).tolist() == [700, 300]
    assert round_weights([1, 1, 1], 1000).tolist() == [334, 333, 333]
    assert round_weights([1e-9, 1], 1000).tolist() == [1, 999]
    assert BlendSchedule([5.0]).period == 1
    with pytest.raises(ValueError, match="positive"):
        round_weights([1, 0], 10)


@pytest.fixture
def toy(tmp_path):
    """Two shards; documents of lengths 3, 5, 2 | 4, 6 (EOS = 0 at each end)."""
    docs = [[[11, 12, 0], [21, 22, 23, 24, 0], [31, 0]], [[41, 42, 43, 0], [51, 52, 53, 54, 55, 0]]]
    shards = []
    for i, shard_docs in enumerate(docs):
        with ShardWriter(tmp_path, f"s{i}", np.uint16, "toy") as w:
            for d in shard_docs:
                w.add_document(d)
            shards.append(w.finalize())
    write_manifest(tmp_path, Manifest(TokenizerInfo("toy", 100, eos_id=0), "uint16", shards))
    return open_dataset(tmp_path), [t for s in docs for d in s for t in d]


def test_windows_equal_the_concatenated_stream(toy):
    reader, stream = toy
    for L in (1, 3, 4, 7, 19):
        w = TokenWindows("toy", L, reader)
        assert w.num_samples == (len(stream) - 1) // L
        got = w.tokens(np.arange(w.num_samples))
        for i in range(w.num_samples):
            assert got[i].tolist() == stream[i * L : i * L + L + 1]
    with pytest.raises(IndexError):
        TokenWindows("toy", 4, reader).tokens(np.array([5]))


def test_position_ids_reset_exactly_at_document_starts(toy):
    reader, stream = toy
    w = TokenWindows("toy", 6, reader)
    # stream: 11 12 0 | 21 22 23 24 0 | 31 0 | 41 42 43 0 | 51 52 53 54 55 0 ; doc starts at 3, 8, 10, 14
    pos = w.position_ids(np.arange(w.num_samples))
    assert pos[0].tolist() == [0, 1, 2, 0, 1, 2, 3]        # tokens 0..6
    assert pos[1].tolist() == [0, 1, 0, 1, 0, 1, 2]        # tokens 6..12: starts at 8, 10
    assert pos[2].tolist() == [0, 1, 0, 1, 2, 3, 4]        # tokens 12..18: start at 14 (crosses the shard)
