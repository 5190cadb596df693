"""Benchmark adaptive mixing: the cost of one decision, against the cost of a block's plain step bookkeeping.

    python tools/bench_mixing.py [--sources 10] [--every 50] [--batch 1024] [--decisions 2000]

Per rule (``loss_proportional``, ``odm``), for ``--sources`` sources: the rule alone (its formula, the
floor at ``min_weight``, the checks), and a whole decision as the trainer makes it at a block's last step
(the rule, plus the blend's counts of the decided block: ``every`` steps of ``batch`` samples), each in
milliseconds per decision. The baseline is what every step already does with the same numbers, summing
``every`` steps' per-source statistics into the block, so the ratio says what a decision adds to a block.
No collective is involved: a decision reads numbers every rank already has.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from runtime.config.schema import AdaptiveMixingArgs
from runtime.data.order.adaptive_blend import AdaptiveBlend
from runtime.data.order.mixing_rules import RULES, BlockRecord, BlockStats, MixingHistory, decide


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sources", type=int, default=10)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--decisions", type=int, default=2000)
    args = ap.parse_args()
    k, n = args.sources, args.decisions
    rng = np.random.default_rng(0)
    steps = [[(int(s), int(s) * 100, float(s) * 100 * x) for s, x in zip(rng.integers(1, 200, k), rng.uniform(2, 8, k))]
             for _ in range(args.every)]
    began = time.perf_counter()
    for _ in range(n):
        stats = BlockStats.empty(k)
        for sources in steps:
            stats.add(sources)
    baseline = (time.perf_counter() - began) / n
    print(f"{k} sources, blocks of {args.every} steps of {args.batch} samples, {n} decisions")
    print(f"  baseline: summing a block's per-source statistics   {1000 * baseline:.4f} ms per block")
    for name, rule in RULES.items():
        options = AdaptiveMixingArgs(rule=name, every=args.every, min_weight=0.01)
        history, state, used = MixingHistory(options, k), {}, [1.0 / k] * k
        began = time.perf_counter()
        for b in range(n):
            history.blocks.append(BlockRecord(b + 1, used, stats))
            used, state = decide(rule, history, state, "bench")
        alone = (time.perf_counter() - began) / n
        blend = AdaptiveBlend([1.0] * k, args.every, 1, args.every * (n + 2), args.batch)
        began = time.perf_counter()
        for _ in range(n):
            history.blocks.append(BlockRecord(0, used, stats))
            used, state = decide(rule, history, state, "bench")
            blend.add_block(used)
        whole = (time.perf_counter() - began) / n
        print(f"  {name:>17}: the rule {1000 * alone:.4f} ms, a whole decision (with the block's counts) "
              f"{1000 * whole:.4f} ms per decision ({whole / baseline:.2f}× the baseline)")


if __name__ == "__main__":
    main()
