"""Resuming an earlier checkpoint of a run (a rewind) moves what the run had done after it aside, never
deleting it: its later checkpoints and its metrics stay in ``<run_dir>/rewound-<time>/``."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.configs import small_config
from tests.support.harness import metrics, train_one


def test_a_rewind_moves_the_later_checkpoints_and_metrics_aside(shards, tmp_path):
    run = tmp_path / "run"
    first = small_config(tmp_path, run, dp=1, steps=8, interval=2, single_stage=True, checkpoints={"keep_last": 4})
    train_one(first, cwd=shards)
    before = metrics(run)
    earlier = run / "checkpoints" / "step-000004"
    again = small_config(tmp_path, run, dp=1, steps=8, interval=2, single_stage=True, name="rewind.yaml",
                         checkpoints={"keep_last": 4, "resume": str(earlier)})
    assert check_start(first, shards) == f"start: resumes from {run / 'checkpoints' / 'step-000008'} (step 8): " \
                                         f"nothing left to train"
    assert check_start(again, shards) == (  # --check says what the rewind will move, and moves nothing
        f"start: rewinds to {earlier} (step 4): trains steps 5-8; the 2 later checkpoint(s) (step-000006, step-000008) "
        f"and a copy of metrics.jsonl are moved to {run}/rewound-<UTC time>")
    assert not list(run.glob("rewound-*"))
    proc = train_one(again, cwd=shards)
    (aside,) = run.glob("rewound-*")
    assert f"rewound to step 4 ({earlier}): the run's later checkpoints and its metrics.jsonl were moved to " \
           f"{aside}" in proc.stdout
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["step-000006", "step-000008"]
    assert [json.loads(line) for line in (aside / "metrics.jsonl").read_text().splitlines()] == before
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == [
        "step-000002", "step-000004", "step-000006", "step-000008"]
    after = metrics(run)
    assert [r["step"] for r in after] == list(range(1, 9))
    assert [r["loss"] for r in after] == [r["loss"] for r in before]  # steps 5-8 trained again, the same


def check_start(config, cwd) -> str:
    """The first line of ``nanoset train --check``: where the run starts."""
    proc = subprocess.run([sys.executable, "-m", "nanoset.cli", "train", "--config", str(config), "--check"], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[0]
