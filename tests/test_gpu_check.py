"""tools/gpu_check: its parts fit the 10 minutes by construction, and it refuses to report success untested."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import ROOT


def test_the_parts_timeouts_and_setup_fit_in_ten_minutes():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--plan"], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    plan = rows[-1]
    assert plan["part"] == "plan" and plan["budget_s"] == 600
    assert sum(r["timeout_s"] for r in rows[:-1]) == plan["parts_s"]
    assert plan["parts_s"] + plan["setup_s"] < 600
    # the most important first: the tests, then the compiled document-masked row
    assert [r["part"] for r in rows[:2]] == ["cuda_tests", "bench_compiled_document"]


def test_without_a_gpu_it_fails_in_one_line():
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh")], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"error: gpu_check: {sys.executable} has no torch that sees a CUDA "
                                                f"device; run it on a GPU machine"]


def test_the_pip_step_cannot_spend_minutes_and_only_pytest_is_required():
    script = (ROOT / "tools" / "gpu_check.sh").read_text()
    assert "--retries 0 --timeout 5" in script and "timeout 25" in script
    assert "hypothesis" not in script  # test_cuda.py does not need it
