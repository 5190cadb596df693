"""Benchmark weight schedules: computing a part's per-step counts, and reading them back from the cache.

    python tools/bench_schedule.py [--steps 1000000] [--batch 1024]

For 2, 3, 5 and 10 datasets: seconds to compute the counts of ``--steps`` steps of a schedule (one
sequential pass, once per part: what a first start-up pays), seconds to read them from
``general.cache_dir/blend/`` (what every later start-up pays), and their ratio; then the cost of
locating one global batch through the scheduled blend against the constant-weight blend's; then, for 30,
100 and 300 datasets, the step-by-step rule settling each step's bids by scans against by a heap (the same
counts; the heap is what runs from ``HEAP_DATASETS`` datasets on).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from runtime.data.order import scheduled_blend
from runtime.data.order.blend import BlendSchedule
from runtime.data.order.scheduled_blend import ScheduledBlend, WeightSchedule


def schedule(k: int, steps: int) -> WeightSchedule:
    """A ramp over the first half, then constant: every dataset's share changes."""
    first = [float(i + 1) for i in range(k)]
    return WeightSchedule.from_entries([{"step": 1, "weights": first},
                                        {"step": steps // 2, "weights": first[::-1]}])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        for k in (2, 3, 5, 10):
            began = time.perf_counter()
            ScheduledBlend(schedule(k, args.steps), 1, args.steps, args.batch, cache_dir=cache)
            computed = time.perf_counter() - began
            began = time.perf_counter()
            blend = ScheduledBlend(schedule(k, args.steps), 1, args.steps, args.batch, cache_dir=cache)
            cached = time.perf_counter() - began
            print(f"{k:>2} datasets, {args.steps:,} steps of {args.batch}: computed in {computed:.2f} s, read from "
                  f"the cache in {cached * 1000:.1f} ms ({computed / cached:,.0f}x)")
        periodic = BlendSchedule([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
        j = np.arange(args.batch) + (args.steps // 3) * args.batch
        for name, b in (("scheduled", blend), ("constant", periodic)):
            began = time.perf_counter()
            for _ in range(100):
                b.locate(j)
            print(f"locate one global batch ({name} blend, 10 datasets): {(time.perf_counter() - began) * 10:.2f} ms")
    steps = 2000
    for k in (30, 100, 300):
        shares = schedule(k, steps).shares(np.arange(1, steps + 1))
        seconds = {}
        for name, threshold in (("scans", 10**9), ("heap", 1)):
            scheduled_blend.HEAP_DATASETS = threshold
            began = time.perf_counter()
            scheduled_blend._water_fill(shares, args.batch, np.zeros(k))
            seconds[name] = time.perf_counter() - began
        print(f"{k:>3} datasets, {steps:,} steps of {args.batch}: scans {seconds['scans'] / steps * 1e6:.0f} s, heap "
              f"{seconds['heap'] / steps * 1e6:.0f} s per million steps ({seconds['scans'] / seconds['heap']:.1f}x)")


if __name__ == "__main__":
    main()
