"""Weight schedules: the exact rule (interpolate, normalise, water-fill each step, interleave), its bound at
every step boundary, the in-step interleave both ways, the cache, and the config's checks (numpy only)."""

from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config import ConfigError
from runtime.data.order import scheduled_blend
from runtime.data.order.scheduled_blend import (
    ScheduledBlend,
    WeightSchedule,
    deviation_bound,
    positions_in_step,
    step_orders,
)
from tests.support import assert_one_cache_note
from tests.support.configs import TWO_STAGE, build, merged


def exact_targets(schedule: WeightSchedule, steps: list[int], batches: list[int]) -> list[list[Fraction]]:
    """``T_d(s) = Σ_{t ≤ s} G(t)·w_d(t)`` in exact arithmetic, independently of the implementation: the rule
    as the docs state it (linear interpolation of the raw weights, then normalised)."""
    at = list(schedule.steps)
    raw = [[Fraction(w) for w in row] for row in schedule.weights]
    total = [Fraction(0)] * schedule.num_datasets
    out = []
    for t, g in zip(steps, batches):
        seg = max(i for i, s in enumerate(at) if s <= t)
        if seg + 1 < len(at):
            f = Fraction(t - at[seg], at[seg + 1] - at[seg])
            w = [a + (b - a) * f for a, b in zip(raw[seg], raw[seg + 1])]
        else:
            w = raw[seg]
        total = [x + g * v / sum(w) for x, v in zip(total, w)]
        out.append(total)
    return out


def test_the_bound_is_one_half_five_sixths_then_harmonic():
    assert deviation_bound(2) == 0.5 and deviation_bound(3) == pytest.approx(5 / 6)
    assert deviation_bound(4) == pytest.approx(1 / 2 + 1 / 3 + 1 / 4)
    assert deviation_bound(10) == pytest.approx(1.929, abs=1e-3)
    assert [deviation_bound(k, zero_shares=True) for k in (2, 3, 4, 13)] == [0.5, 1.0, 1.5, 6.0]


def random_schedule(rng: np.random.Generator, k: int, zeros: bool) -> WeightSchedule:
    """One to four entries 1 to 8 steps apart, integer weights (0 to 4 with ``zeros``, where at least one row
    holds a 0; else 1 to 4), each row with a positive weight."""
    steps = np.cumsum(rng.integers(1, 9, size=int(rng.integers(1, 5))))
    rows = rng.integers(0 if zeros else 1, 5, size=(len(steps), k))
    rows[rows.sum(axis=1) == 0, int(rng.integers(k))] = 1
    if zeros and (rows > 0).all():
        rows[int(rng.integers(len(steps))), int(rng.integers(k))] = 0
    return WeightSchedule.from_entries([{"step": int(s), "weights": r.tolist()} for s, r in zip(steps, rows)])


def test_a_weight_of_zero_draws_nothing_at_every_k_and_the_bound_with_zeros_holds():
    """4,000 seeded random schedules with zeros, k = 3 to 13 (scans and the heap), a part of G₁ then one of G₂
    (the deviation carried): no step draws from a dataset whose share there is 0, every step's counts are ≥ 0
    and sum to G, and every dataset stays within (k − 1)/2 of its target at every step boundary."""
    rng = np.random.default_rng(24)
    ks = []
    for _ in range(4000):
        k = int(rng.integers(3, 14))
        ks.append(k)
        schedule = random_schedule(rng, k, zeros=True)
        start, n1, n2 = int(schedule.steps[0]), int(rng.integers(1, 20)), int(rng.integers(1, 20))
        g1, g2 = int(rng.integers(1, 3 * k)), int(rng.integers(1, 3 * k))
        first = ScheduledBlend(schedule, start, n1, g1)
        second = ScheduledBlend(schedule, start + n1, n2, g2, first.deviation)
        counts = np.concatenate([first.step_counts(np.arange(n1)), second.step_counts(np.arange(n2))])
        shares = schedule.shares(np.arange(start, start + n1 + n2))
        batches = np.array([g1] * n1 + [g2] * n2)
        assert (counts[shares == 0] == 0).all(), schedule
        assert (counts >= 0).all() and (counts.sum(axis=1) == batches).all()
        targets = np.cumsum(shares * batches[:, None], axis=0)
        assert np.abs(targets - np.cumsum(counts, axis=0)).max() <= deviation_bound(k, zero_shares=True) + 1e-9
    assert set(ks) == set(range(3, 14))


def test_a_weight_of_zero_on_a_dataset_behind_forces_the_draws_onto_the_others():
    """One sample a step: [1, 1, 1], then [0, 1, 1], then [74, 26, 0]. At step 3 dataset 2 is 5/6 behind but at
    weight 0, so the sample goes to dataset 1 (x = 0.093 against 0.073), which ends 0.907 ahead: past the 5/6
    of schedules without zeros, within the bound 1 of three datasets with zeros."""
    s = WeightSchedule.from_entries([{"step": 1, "weights": [1, 1, 1]}, {"step": 2, "weights": [0, 1, 1]},
                                     {"step": 3, "weights": [74, 26, 0]}])
    b = ScheduledBlend(s, 1, 3, 1)
    assert b.cumulative[1:].tolist() == [[1, 0, 0], [1, 1, 0], [1, 2, 0]]
    assert b.deviation.tolist() == pytest.approx([0.74 + 1 / 3 - 1, 0.26 + 1 / 3 + 1 / 2 - 2, 1 / 3 + 1 / 2])
    assert deviation_bound(3) < -b.deviation[1] <= deviation_bound(3, zero_shares=True)


def test_schedules_without_zeros_keep_their_order():
    """The counts of 300 seeded random schedules without zeros (k = 3 to 13, a carried deviation) are the ones
    the rule gave before a zero weight kept a dataset out: their digest, so no change moves a trained run."""
    rng = np.random.default_rng(7)
    digest = hashlib.sha256()
    for _ in range(300):
        k = int(rng.integers(3, 14))
        schedule = random_schedule(rng, k, zeros=False)
        carried = rng.normal(0, 0.2, k)
        blend = ScheduledBlend(schedule, int(schedule.steps[0]), int(rng.integers(1, 30)),
                               int(rng.integers(1, 3 * k)), carried - carried.mean())
        digest.update(blend.cumulative.tobytes() + blend.deviation.tobytes())
    assert digest.hexdigest() == "52c6e4faa6454eee9d5c7497d43435e5e2a5c9f714e2052200840369d708c82f"


def test_a_ramp_and_a_half_split_give_the_counts_of_the_rule():
    ramp = WeightSchedule.from_entries([{"step": 1, "weights": [1, 0]}, {"step": 5, "weights": [0, 1]}])
    b = ScheduledBlend(ramp, 1, 6, 4)
    assert b.step_counts(np.arange(6)).tolist() == [[4, 0], [3, 1], [2, 2], [1, 3], [0, 4], [0, 4]]
    half = WeightSchedule.from_entries([{"step": 1, "weights": [1, 1]}])
    # targets 2.5, 5, 7.5, 10: the tie of step 1 goes to the lower index, then the other catches up
    assert ScheduledBlend(half, 1, 4, 5).step_counts(np.arange(4)).tolist() == [[3, 2], [2, 3], [3, 2], [2, 3]]


def test_weights_are_interpolated_then_normalised():
    s = WeightSchedule.from_entries([{"step": 10, "weights": [0.9, 0.1]}, {"step": 20, "weights": [5, 5]}])
    w = s.shares(np.array([10, 15, 20, 99]))
    assert w[0].tolist() == pytest.approx([0.9, 0.1])
    assert w[1].tolist() == pytest.approx([2.95 / 5.5, 2.55 / 5.5])  # halfway: [2.95, 2.55], normalised after
    assert w[2].tolist() == w[3].tolist() == pytest.approx([0.5, 0.5])  # constant after the last entry


def test_the_in_step_interleave_both_ways():
    d, m = step_orders(np.array([[3, 1]]))
    # keys 1/6, 3/6, 5/6 and 1/2: the tie at 1/2 goes to the lower index
    assert d.tolist() == [[0, 0, 1, 0]] and m.tolist() == [[0, 1, 0, 2]]
    counts = np.array([[5, 0, 3, 7]])
    d, m = step_orders(counts)
    pos = positions_in_step(np.repeat(counts, 15, axis=0), d[0], m[0])
    assert pos.tolist() == list(range(15))


entries = st.lists(st.lists(st.integers(0, 6), min_size=5, max_size=5).filter(any), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(k=st.integers(2, 5), rows=entries, gaps=st.lists(st.integers(1, 12), min_size=3, max_size=3),
       batches=st.tuples(st.integers(1, 17), st.integers(1, 17)), split=st.integers(1, 30), data=st.data())
def test_counts_stay_within_the_bound_of_the_rule_at_every_step_boundary(k, rows, gaps, batches, split, data):
    """Random schedules (zeros included), a part of G₁ then a part of G₂ (a resume that changed the global
    batch: the deviation carries on): every step's counts are ≥ 0 and sum to G, every dataset's cumulative
    count is within the bound of the exact target, and locate/position are inverses."""
    start = data.draw(st.integers(1, 50))
    steps = [start]
    for g in gaps[: len(rows) - 1]:
        steps.append(steps[-1] + g)
    schedule = WeightSchedule.from_entries([{"step": s, "weights": r[:k]} for s, r in zip(steps, rows)])
    if any(sum(w) == 0 for w in schedule.weights):
        return
    n1, n2 = split, 40 - split
    first = ScheduledBlend(schedule, start, n1, batches[0])
    second = ScheduledBlend(schedule, start + n1, n2, batches[1], first.deviation)
    counts = np.concatenate([first.step_counts(np.arange(n1)), second.step_counts(np.arange(n2))])
    assert (counts >= 0).all()
    assert counts.sum(axis=1).tolist() == [batches[0]] * n1 + [batches[1]] * n2
    cumulative = np.cumsum(counts, axis=0)
    targets = exact_targets(schedule, list(range(start, start + 40)), [batches[0]] * n1 + [batches[1]] * n2)
    zeros = bool((first.schedule.shares(np.arange(start, start + 40)) == 0).any())
    bound = Fraction(deviation_bound(k, zero_shares=zeros)) + Fraction(1, 10**9)
    for s in range(40):
        for d in range(k):
            assert abs(targets[s][d] - int(cumulative[s, d])) <= bound, (s, d)
    for blend in (first, second):
        j = np.arange(blend.num_steps * blend.global_batch)
        d, draw = blend.locate(j)
        assert (blend.position(d, draw) == j).all()
        for ds in range(k):  # each dataset's draws are 0, 1, 2, ... in stream order
            assert draw[d == ds].tolist() == list(range(int(blend.cumulative[-1, ds])))


def half_integer_distance(target: Fraction) -> Fraction:
    """How far ``target`` is from the nearest ``m + ½`` (where rounding it to a count is a tie)."""
    return abs(target - (target.numerator // target.denominator) - Fraction(1, 2))


@settings(max_examples=200, deadline=None)
@given(first=st.lists(st.integers(0, 9), min_size=2, max_size=2).filter(any),
       last=st.lists(st.integers(0, 9), min_size=2, max_size=2).filter(any), span=st.integers(1, 60),
       batch=st.integers(1, 33), carried=st.floats(-0.5, 0.49))
def test_two_datasets_round_the_cumulative_target_as_the_step_by_step_rule_does(first, last, span, batch, carried):
    """The closed form for two datasets (⌊T_0 + ½⌋) is the water-filling rule, carried deviation included, and
    both are the exact rule (T_0 summed exactly from the float64 shares) at every step whose target is not
    within float rounding of a tie m + ½; at such a step each follows its own float64 sums (both the same on
    every machine), and both stay within ½ of the target."""
    s = WeightSchedule.from_entries([{"step": 1, "weights": first}, {"step": 1 + span, "weights": last}])
    shares = s.shares(np.arange(1, 2 * span + 2))
    deviation = np.array([carried, -carried])
    fast, slow = scheduled_blend._round_two(shares, batch, deviation)[:2], scheduled_blend._water_fill(
        shares, batch, deviation)
    targets = np.cumsum([Fraction(float(carried))] + [batch * Fraction(float(w)) for w in shares[:, 0]])[1:]
    near_tie = np.array([half_integer_distance(t) < Fraction(1, 10**9) for t in targets])
    exact = np.array([int((t + Fraction(1, 2)) // 1) for t in targets])
    for counts, after in (fast, slow):
        cumulative = np.cumsum(counts[:, 0])
        np.testing.assert_array_equal(cumulative[~near_tie], exact[~near_tie])
        assert all(abs(t - int(c)) <= Fraction(1, 2) + Fraction(1, 10**9) for t, c in zip(targets, cumulative))
        behind = float(targets[-1] - int(cumulative[-1]))  # the deviation a next part carries on
        assert after.tolist() == pytest.approx([behind, -behind], abs=1e-9)


def test_a_tie_within_float_rounding_follows_the_float_sum_of_the_closed_form():
    """Weights 5 : 1, one sample a step: T_0(9) = 9 · fl(5/6) = 7.5 + 3.3e-16, a tie in the weights' own arithmetic.
    The float64 cumulative sum the closed form rounds is 7.499999999999999, so dataset 1 gets step 9's sample
    (the step-by-step rule's float deviations give it to dataset 0); both are within ½ of the target. The two-
    dataset order is the closed form's: this pins it, so no later change moves a trained run's samples."""
    s = WeightSchedule.from_entries([{"step": 1, "weights": [5, 1]}])
    blend = ScheduledBlend(s, 1, 12, 1)
    assert blend.cumulative[1:, 0].tolist() == [1, 2, 3, 3, 4, 5, 6, 7, 7, 8, 9, 10]
    stepwise = scheduled_blend._water_fill(s.shares(np.arange(1, 13)), 1, np.zeros(2))[0]
    assert np.cumsum(stepwise[:, 0]).tolist() == [1, 2, 3, 3, 4, 5, 6, 7, 8, 8, 9, 10]
    assert 9 * Fraction(float(s.shares(np.array([9]))[0, 0])) - Fraction(15, 2) == Fraction(3, 2**53)


def largest_remainder(targets: np.ndarray, total: int) -> np.ndarray:
    """Rounding one step boundary's targets on its own (largest remainder, ties to the lower index)."""
    floors = np.floor(targets).astype(np.int64)
    order = np.lexsort((np.arange(len(targets)), -(targets - floors)))
    floors[order[: total - int(floors.sum())]] += 1
    return floors


def test_three_datasets_never_go_backwards_where_rounding_each_boundary_would():
    """Rounding each boundary's cumulative targets on its own lowers dataset 2's count at step 2
    ([0, 0, 1] then [1, 1, 0]); the rule never lowers a count and stays within 5/6."""
    s = WeightSchedule.from_entries([{"step": 1, "weights": [0.3, 0.3, 0.4]}, {"step": 2, "weights": [0.5, 0.5, 0]}])
    targets = np.cumsum(s.shares(np.arange(1, 5)), axis=0)  # G = 1: [.3 .3 .4], [.8 .8 .4], [1.3 1.3 .4], ...
    rounded = [largest_remainder(t, n).tolist() for t, n in zip(targets, range(1, 5))]
    assert rounded[:2] == [[0, 0, 1], [1, 1, 0]]
    b = ScheduledBlend(s, 1, 4, 1)
    assert b.cumulative[1:].tolist() == [[0, 0, 1], [1, 0, 1], [1, 1, 1], [2, 1, 1]]
    assert np.abs(b.cumulative[1:] - targets).max() <= 5 / 6 + 1e-12


def test_the_bound_for_four_datasets_is_reached_and_not_passed():
    """One sample a step, equal weight on the datasets not yet served: dataset 3 ends 1/4 + 1/3 + 1/2 behind,
    the bound H_4 − 1, and no causal rule could keep all four within 1 (each step's pick is forced)."""
    s = WeightSchedule.from_entries([{"step": 1, "weights": [1, 1, 1, 1]}, {"step": 2, "weights": [0, 1, 1, 1]},
                                     {"step": 3, "weights": [0, 0, 1, 1]}, {"step": 4, "weights": [0, 0, 0, 1]}])
    b = ScheduledBlend(s, 1, 4, 1)
    assert b.cumulative[1:4].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    behind = float(np.cumsum(s.shares(np.arange(1, 4)), axis=0)[-1, 3])
    assert behind == pytest.approx(13 / 12) and behind <= deviation_bound(4) + 1e-12


def test_long_parts_are_cached_atomically_and_a_damaged_cache_is_recomputed(tmp_path, monkeypatch):
    s = WeightSchedule.from_entries([{"step": 1, "weights": [0.9, 0.1]}, {"step": 3000, "weights": [0.2, 0.8]}])
    first = ScheduledBlend(s, 1, 5000, 8, cache_dir=tmp_path)
    files = list((tmp_path / "blend").iterdir())
    assert len(files) == 1 and files[0].suffix == ".npy"  # no temporary file left
    calls = []
    monkeypatch.setattr(scheduled_blend, "allocate", lambda *a: calls.append(1) or pytest.fail("recomputed"))
    again = ScheduledBlend(s, 1, 5000, 8, cache_dir=tmp_path)
    np.testing.assert_array_equal(again.cumulative, first.cumulative)
    assert again.deviation.tolist() == first.deviation.tolist() and not calls
    monkeypatch.undo()
    files[0].write_bytes(b"not a table")
    redone = ScheduledBlend(s, 1, 5000, 8, cache_dir=tmp_path)
    np.testing.assert_array_equal(redone.cumulative, first.cumulative)
    assert ScheduledBlend(s, 1, 100, 8, cache_dir=tmp_path / "short").cumulative.shape == (101, 2)
    assert not (tmp_path / "short").exists()  # short parts take milliseconds: no file


def test_an_unwritable_schedule_cache_is_one_note_and_counting_again_at_the_next_start(tmp_path, capsys, monkeypatch):
    """The write failed silently: nothing said why every start-up of a long scheduled stage took seconds."""
    s = WeightSchedule.from_entries([{"step": 1, "weights": [0.9, 0.1]}, {"step": 3000, "weights": [0.2, 0.8]}])
    expected = ScheduledBlend(s, 1, 5000, 8).cumulative  # not cached (no cache_dir)
    root = tmp_path / "file"
    root.write_text("not a folder")
    real, calls = scheduled_blend.allocate, []
    monkeypatch.setattr(scheduled_blend, "allocate", lambda *a: calls.append(1) or real(*a))
    for run in range(2):  # the run goes on; the next start counts again, and the note is said once a process
        np.testing.assert_array_equal(ScheduledBlend(s, 1, 5000, 8, cache_dir=root).cumulative, expected)
        assert len(calls) == run + 1
        if run == 0:
            assert_one_cache_note(capsys.readouterr().err, root, "blend", r"[0-9a-f]{32}\.npy")
    assert capsys.readouterr().err == ""
    root.unlink()  # writable again: counted, written, then read back
    ScheduledBlend(s, 1, 5000, 8, cache_dir=root)
    assert len(list((root / "blend").iterdir())) == 1
    np.testing.assert_array_equal(ScheduledBlend(s, 1, 5000, 8, cache_dir=root).cumulative, expected)
    assert len(calls) == 3 and capsys.readouterr().err == ""


@pytest.mark.parametrize("k", [2, 3])
def test_a_long_part_computed_block_by_block_is_the_part_computed_at_once(monkeypatch, k):
    """Blocks of 7 steps (a part of 50, a deviation carried in from an earlier part): the same counts and the
    same deviation bits as one pass over all 50 steps, so a long part's order does not depend on the block."""
    s = WeightSchedule.from_entries([{"step": 3, "weights": [0.9, 0.1, 0.3][:k]},
                                     {"step": 30, "weights": [0.2, 0.8, 0.1][:k]}])
    carried = np.array([0.3, -0.3]) if k == 2 else np.array([0.25, -0.5, 0.25])
    whole_counts, whole_deviation = scheduled_blend.allocate(s.shares(np.arange(3, 53)), 5, carried)[:2]
    monkeypatch.setattr(scheduled_blend, "ALLOCATION_BLOCK", 7)
    blocked = ScheduledBlend(s, 3, 50, 5, carried)
    np.testing.assert_array_equal(blocked.cumulative[1:], np.cumsum(whole_counts, axis=0))
    assert blocked.deviation.tobytes() == whole_deviation.tobytes()


def test_computing_a_long_part_needs_little_memory_beyond_its_table(monkeypatch):
    """40,000 steps of three datasets: the peak of memory allocated while the counts are computed stays within
    twice the table kept ([n + 1, k] int64; blocks of 1,024 steps), not the 14 times the per-step Python lists of
    the whole part took."""
    import tracemalloc

    monkeypatch.setattr(scheduled_blend, "ALLOCATION_BLOCK", 1024)
    s = WeightSchedule.from_entries([{"step": 1, "weights": [1, 2, 3]}, {"step": 20_000, "weights": [3, 2, 1]}])
    tracemalloc.start()
    try:
        blend = ScheduledBlend(s, 1, 40_000, 64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * blend.cumulative.nbytes, (peak, blend.cumulative.nbytes)


def test_the_heap_picks_the_bids_the_scans_pick():
    """Many datasets settle a step's bids through a heap: the same picks, order and ties as the scans, whether
    bids are added (floors short of G) or given back (floors past G), on 300 random steps of 12 to 60 datasets
    (zeros, equal values and negative bids included)."""
    rng = np.random.default_rng(11)
    given_back = 0
    for _ in range(300):
        k = int(rng.integers(12, 61))
        x = np.round(rng.uniform(-1.5, 6.0, k), 1).tolist()  # rounded: equal bids, so ties decide
        a = [int(v) if v >= 1.0 else 0 for v in x]
        total = sum(a)
        g = max(0, total + int(rng.integers(-k // 2, k // 2 + 1)))
        given_back += g < total
        by_scan, by_heap = list(a), list(a)
        scheduled_blend._settle_by_scan(x, by_scan, total, g)
        scheduled_blend._settle_by_heap(x, by_heap, total, g)
        assert by_heap == by_scan and sum(by_heap) == g
    assert given_back > 100


def test_many_datasets_draw_the_same_counts_through_the_heap(monkeypatch):
    """The step-by-step rule over 40 steps of 30 datasets (a schedule with zeros, a carried deviation) gives the
    same counts and deviation bits with scans as with the heap."""
    rng = np.random.default_rng(3)
    weights = [(rng.random(30) * (rng.random(30) < 0.6) + 0.001).tolist() for _ in range(3)]
    s = WeightSchedule.from_entries([{"step": step, "weights": w} for step, w in zip((1, 15, 30), weights)])
    deviation = rng.normal(0, 0.3, 30)
    deviation -= deviation.mean()
    monkeypatch.setattr(scheduled_blend, "HEAP_DATASETS", 10**9)
    by_scan = scheduled_blend._water_fill(s.shares(np.arange(1, 41)), 37, deviation)
    monkeypatch.setattr(scheduled_blend, "HEAP_DATASETS", 2)
    by_heap = scheduled_blend._water_fill(s.shares(np.arange(1, 41)), 37, deviation)
    np.testing.assert_array_equal(by_heap[0], by_scan[0])
    assert by_heap[1].tobytes() == by_scan[1].tobytes()


def schedule_config(weights, start=1, steps=40):
    stages = [{"name": "s", "start_training_step": start, "data": {"dataset": {
        "dataset_folder": ["a", "b"], "dataset_weights": weights}}}]
    if start != 1:
        stages.insert(0, {"name": "first", "start_training_step": 1, "data": {"dataset": {"dataset_folder": "a"}}})
    return merged(TWO_STAGE, data_stages=stages, tokens={**TWO_STAGE["tokens"], "train_steps": steps})


def test_a_schedule_is_a_form_of_dataset_weights():
    c = build(schedule_config([{"step": 1, "weights": [0.9, 0.1]}, {"step": 30, "weights": [0.5, 0.5]}]))
    ds = c.data_stages[0].data.dataset
    assert [(e.step, e.weights) for e in ds.schedule] == [(1, [0.9, 0.1]), (30, [0.5, 0.5])] and ds.weights is None
    constant = build(schedule_config([0.7, 0.3])).data_stages[0].data.dataset
    assert constant.schedule is None and constant.weights == [0.7, 0.3]


def test_a_schedule_too_long_to_count_is_one_line(shards, monkeypatch):
    """A schedule's per-step counts are a table in memory: a stage of 10**12 steps is refused before it is made."""
    from runtime.data import DataPlan

    monkeypatch.chdir(shards)
    d = schedule_config([{"step": 1, "weights": [0.9, 0.1]}, {"step": 30, "weights": [0.5, 0.5]}], steps=10**12)
    d["data_stages"][0]["data"]["dataset"]["dataset_folder"] = ["shards/web", "shards/code"]
    with pytest.raises(ConfigError) as e:
        DataPlan(build(d))
    assert str(e.value) == ("data_stages[0] (s).data.dataset.dataset_weights: a weight schedule over "
                            "1,000,000,000,000 steps needs 14,901 GiB of per-step counts, more than 16 GiB; end the "
                            "stage earlier and go on with constant weights in a later stage")


@pytest.mark.parametrize("weights,start,fragment", [
    ([{"step": 2, "weights": [1, 1]}], 1, "dataset_weights[0].step: 2, but a schedule starts at the stage's first "
                                          "step (start_training_step 1)"),
    ([{"step": 11, "weights": [1, 1]}, {"step": 11, "weights": [1, 0]}], 11,
     "dataset_weights[1].step: 11 follows step 11; the steps of a schedule must increase"),
    ([{"step": 11, "weights": [1, 1]}, {"step": 41, "weights": [1, 0]}], 11,
     "dataset_weights[1].step: 41 is outside the stage (steps 11-40)"),
    ([{"step": 1, "weights": [1, 1, 1]}], 1, "dataset_weights[0].weights: 3 weights for 2 folders"),
    ([{"step": 1, "weights": [1, -0.5]}], 1, "dataset_weights[0].weights: weights must be ≥ 0 and finite"),
    ([{"step": 1, "weights": [1, 1]}, {"step": 5, "weights": [0, 0]}], 1, "dataset_weights[1].weights: all zero"),
    ([{"step": 1, "weight": [1, 1]}], 1, "dataset_weights[0].weight: unknown key; did you mean 'weights'?"),
    # finite weights whose sum is not: every share would be 0 (or the periodic blend 999 : 1)
    ([{"step": 1, "weights": [1, 1]}, {"step": 5, "weights": [1e308, 1e308]}], 1,
     "dataset_weights[1].weights: [1e+308, 1e+308] sum to more than a float holds; scale them down"),
    ([1e308, 1e308], 1, "dataset_weights: [1e+308, 1e+308] sum to more than a float holds; scale them down"),
    # an infinite weight is not a large one: said as such, not as an overflowing sum
    ([float("inf"), 1], 1, "dataset_weights: weights must be positive and finite, got [inf, 1.0]"),
    ([float("nan"), 1], 1, "dataset_weights: weights must be positive and finite, got [nan, 1.0]"),
    # constant weights have no 0: the periodic blend gives every dataset a slot (leave the folder out instead)
    ([1, 0], 1, "dataset_weights: weights must be positive and finite, got [1.0, 0.0]"),
    ([{"step": 1, "weights": [float("inf"), 1]}], 1,
     "dataset_weights[0].weights: weights must be ≥ 0 and finite, got [inf, 1.0]"),
])
def test_bad_schedules_are_one_line_naming_the_entry(weights, start, fragment):
    with pytest.raises(ConfigError) as e:
        build(schedule_config(weights, start))
    assert fragment in str(e.value) and "\n" not in str(e.value)
    assert "data_stages[" in str(e.value) and ".data.dataset.dataset_weights" in str(e.value)
