"""Pure data math: the permutation, the blend schedule, windows and position ids (numpy only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoset import Manifest, ShardWriter, TokenizerInfo, open_dataset, write_manifest
from runtime.data.order.blend import BlendSchedule, round_weights
from runtime.data.order.permutation import FeistelPermutation
from runtime.data.order.windows import TokenWindows


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


def test_public_helpers_take_scalars_and_arrays(toy):
    """A scalar index gives the same value as the array form, with the scalar's shape."""
    perm = FeistelPermutation(5, 1)
    assert perm(np.arange(5)).tolist() == [0, 1, 3, 2, 4]
    assert [perm(i) for i in range(5)] == [0, 1, 3, 2, 4] and np.shape(perm(2)) == ()
    assert perm([[0, 1], [2, 3]]).tolist() == [[0, 1], [3, 2]] and perm(np.array([], dtype=np.int64)).shape == (0,)
    assert FeistelPermutation(1, 7)(0) == 0
    for bad in (-1, 5):
        with pytest.raises(IndexError, match=f"permutation index {bad} outside"):
            perm(bad)
    blend = BlendSchedule([0.7, 0.3])
    d, k = blend.locate(np.arange(10))
    assert [tuple(map(int, blend.locate(j))) for j in range(10)] == list(zip(d.tolist(), k.tolist()))
    reader, stream = toy
    w = TokenWindows("toy", 3, reader)
    assert w.tokens(2).tolist() == stream[6:10] == w.tokens(np.array([2]))[0].tolist()
    assert w.position_ids(2).tolist() == [0, 1, 0, 1] and w.tokens([[0], [1]]).shape == (2, 1, 4)
    assert w.token_range(2) == (6, 10) and [a.tolist() for a in w.token_range(np.array([1, 2]))] == [[3, 6], [7, 10]]


def test_blend_of_1200_datasets():
    """More than 1,000 datasets in one stage: the period grows (10 slots per dataset), weights keep their meaning."""
    weights = [5.0] * 200 + [1.0] * 1000
    b = BlendSchedule(weights)
    assert b.period == 12_000 and b.counts[:200].tolist() == [30] * 200 and b.counts[200:].tolist() == [6] * 1000
    d, k = b.locate(np.arange(2 * b.period))
    assert np.bincount(d, minlength=1200).tolist() == [60] * 200 + [12] * 1000
    assert b.draws(2 * b.period + 5).tolist() == (np.bincount(d, minlength=1200) + np.bincount(
        b.slots[:5], minlength=1200)).tolist()
    for ds in (0, 199, 200, 1199):  # draw numbers of each dataset are 0, 1, 2, ... in stream order
        np.testing.assert_array_equal(k[d == ds], np.arange((d == ds).sum()))
    assert BlendSchedule([1.0] * 100).period == 1000 and BlendSchedule([1.0] * 101).period == 1010
