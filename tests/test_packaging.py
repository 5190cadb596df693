"""Import boundaries the deployment relies on: the toolkit without torch, the runtime without
`datasets`/`zstandard`/`fastokens` (the GPU machines do not have them; fastokens has no wheel everywhere)."""

from __future__ import annotations

import json
import subprocess
import sys

from nanoset.errors import NEEDS_TORCH


def imports_without(blocked: tuple[str, ...], modules: tuple[str, ...]) -> subprocess.CompletedProcess:
    code = ("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
            + "".join(f"import {m}\n" for m in modules))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_nanoset_never_imports_torch():
    proc = imports_without(("torch",), ("nanoset", "nanoset.cli", "nanoset.tokenize.job", "nanoset.stats",
                                        "nanoset.verify"))
    assert proc.returncode == 0, proc.stderr


def test_the_data_order_imports_without_torch():
    """The data order is numpy alone: the plan of a config (and explain's answers) need no torch; the batch
    contract's names are still importable from runtime.data, where they load torch on first use."""
    order = tuple(f"runtime.data.order.{m}" for m in ("permutation", "blend", "scheduled_blend", "sample_space",
                                                          "windows", "packing", "plan", "record", "provenance",
                                                          "validation_sets"))
    proc = imports_without(("torch",), order + ("runtime.config.load", "runtime.checkpoint.layout", "runtime.compat"))
    assert proc.returncode == 0, proc.stderr
    code = ("import sys\nsys.modules['torch'] = None\nfrom runtime.data import DataPlan, get_stage_for_step\n"
            "assert 'torch' not in {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}\n"
            "from runtime.data import get_sampler\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("ModuleNotFoundError: No module named 'torch.utils'"), last


def test_runtime_needs_neither_datasets_zstandard_nor_fastokens():
    proc = imports_without(("datasets", "zstandard", "fastokens"), ("runtime.train", "runtime.trainer",
                                                                    "runtime.explain"))
    assert proc.returncode == 0, proc.stderr


def test_runtime_trains_without_datasets_zstandard_or_fastokens(shards, tmp_path):
    """Not only imports: a whole run (data plan, loader, checkpoint) with the three modules blocked."""
    from tests.support.configs import small_config
    from tests.support.harness import metrics

    cfg = small_config(tmp_path, tmp_path / "run", dp=1, steps=2, interval=2, single_stage=True)
    code = ("import sys\nsys.modules['datasets'] = None\nsys.modules['zstandard'] = None\n"
            "sys.modules['fastokens'] = None\n"
            f"from runtime.train import main\nsys.exit(main(['--config', {str(cfg)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=shards, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in metrics(tmp_path / "run")] == [1, 2]


def test_cli_errors_are_one_line_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nanoset.cli", "inspect", str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr == f"error: {tmp_path / 'nope'}: no such dataset folder (create it with `nanoset tokenize ... " \
                          f"-o {tmp_path / 'nope'}`)\n"


def test_nanoset_train_without_torch_says_so_in_one_line(tmp_path):
    code = "import sys\nsys.modules['torch'] = None\nfrom nanoset.cli import main\nmain()\n"
    proc = subprocess.run([sys.executable, "-c", code, "train", "--config", "c.yaml"], capture_output=True, text=True,
                          cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == ("error: nanoset train needs PyTorch, which is not installed: pip install torch (for the CPU "
                           "build: pip install torch --index-url https://download.pytorch.org/whl/cpu)\n")


def test_nanoset_imports_torch_only_when_a_runtime_subcommand_runs(tmp_path):
    """--help lists the runtime subcommands and `nanoset metrics` summarizes a run, torch blocked; a subcommand that
    needs torch says so in one line (export imports it at once; evaluate once the config is checked)."""
    row = {"step": 1, "stage": "s", "loss": 2.5, "lr": 1e-3, "grad_norm": 1.0, "skipped": False, "tokens_per_s": 64.0,
           "tokens": 128, "label_tokens": 120}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    code = ("import sys\nsys.modules['torch'] = None\nfrom nanoset.cli import main\nmain()\n")

    def nanoset(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tmp_path)

    assert {"evaluate", "explain", "export", "metrics"} <= set(nanoset("--help").stdout.split())
    summary = json.loads(nanoset("metrics", str(tmp_path), "--json").stdout)
    assert (summary["tokens"], summary["time_s"], summary["stages"][0]["loss"]["last"]) == (128, 2.0, 2.5)
    assert nanoset("evaluate", "--help").stdout.startswith("usage: nanoset evaluate")  # torch comes with the model
    proc = nanoset("export", "--help")
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"error: nanoset export {NEEDS_TORCH}\n")


def test_the_test_extra_installs_the_packages_the_tests_check_for_real():
    """A test against a real optional package runs in CI only if `pip install -e '.[test]'` brings the package: W&B's
    offline files (tests/runtime/test_wandb.py) are read with the version the `wandb` extra pins."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()  # no tomllib before Python 3.11
    test_extra = re.search(r"^test = \[(.*?)\n(?=\w)", text, re.M | re.S).group(1)
    assert '"wandb==0.31.0"' in test_extra and 'wandb = ["wandb==0.31.0"]' in text
