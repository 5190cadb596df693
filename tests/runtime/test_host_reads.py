"""A training step reads tensors back to the host (``.item()``, ``float()``, ``tolist()``, ...; each one waits for
the GPU to drain) at most a few times, and never per micro-batch: counted in every process of a tiny
``nanoset train`` run, at dp 1 and dp 2, accumulation 4 and 8."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import torchrun

MAX_READS_PER_STEP = 8
STEPS = 6

# runtime.train with every conversion of a tensor to a Python value counted, in every thread, per training
# step: reads between the start of one train_step and the next (the loader, the step, logging and the stop
# agreement), and reads inside the micro-batch loop; written to $COUNTS.RANK as JSON after each step.
COUNTED = f"""
import json, os, sys
sys.path.insert(0, {str(ROOT)!r})
import torch
reads = [0]
inside = [0]
def counting(name):
    original = getattr(torch.Tensor, name)
    def counted(self, *a, **k):
        reads[0] += 1
        return original(self, *a, **k)
    return counted
for name in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "__complex__"):
    setattr(torch.Tensor, name, counting(name))
import runtime.engine as engine
train_step, accumulate = engine.Engine.train_step, engine.Engine._run_accumulation
per_step, per_loop, last = [], [], [None]
out = os.environ["COUNTS"] + "." + os.environ.get("RANK", "0")
def step(self, *a, **k):
    if last[0] is not None:
        per_step.append(reads[0] - last[0])
    last[0] = reads[0]
    result = train_step(self, *a, **k)
    with open(out, "w") as f:
        json.dump({{"per_step": per_step, "micro_batch_loop": per_loop}}, f)
    return result
def loop(self, *a, **k):
    before = reads[0]
    try:
        return accumulate(self, *a, **k)
    finally:
        per_loop.append(reads[0] - before)
engine.Engine.train_step, engine.Engine._run_accumulation = step, loop
from runtime.train import main
sys.exit(main())
"""


def _counts(shards, tmp_path, dp: int, accum: int) -> list[dict]:
    run = tmp_path / f"run-dp{dp}-a{accum}"
    cfg = small_config(tmp_path, run, dp=dp, accum=accum, steps=STEPS, interval=0, single_stage=True,
                       name=f"dp{dp}-a{accum}.yaml")
    script = tmp_path / "counted.py"
    script.write_text(COUNTED)
    counts = tmp_path / f"counts-dp{dp}-a{accum}"
    env = {"COUNTS": str(counts)}
    if dp == 1:  # a world of one, as python -m runtime.train runs it
        proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                              cwd=shards, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        torchrun(cfg, dp, cwd=shards, script=script, env=env)
    return [json.loads((tmp_path / f"{counts.name}.{r}").read_text()) for r in range(dp)]


@pytest.mark.parametrize("dp", [1, 2])
def test_host_reads_per_step_are_few_and_none_per_micro_batch(shards, tmp_path, dp):
    by_accum = {accum: _counts(shards, tmp_path, dp, accum) for accum in (4, 8)}
    print(json.dumps({f"dp{dp}-accum{a}": [r["per_step"] for r in ranks] for a, ranks in by_accum.items()}))
    for accum, ranks in by_accum.items():
        for rank in ranks:
            assert rank["micro_batch_loop"] == [0] * STEPS, (accum, rank)
            steady = rank["per_step"][1:]  # the reads between step 2's start and step 6's: whole steady steps
            assert len(steady) == STEPS - 2
            assert max(steady) <= MAX_READS_PER_STEP, (accum, rank)
    # the same count at accumulation 4 and 8: nothing is read per micro-batch, in the loader either
    for r in range(dp):
        assert by_accum[4][r]["per_step"][1:] == by_accum[8][r]["per_step"][1:]

