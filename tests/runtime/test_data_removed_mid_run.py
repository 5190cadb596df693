"""A shard removed after start-up (a cleanup job, a lost mount) is one line naming the file, from the prefetch
thread and from a loader worker process alike (was ~150 lines of traceback per rank)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from tests.support import ROOT
from tests.support.configs import small_config

# runtime.train, with the code dataset's token files removed once start-up has opened them
REMOVED = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from runtime.data.loading import sources
loader = sources.ConfigStages.loader
def remove_then_load(self, stage, step):
    for f in Path("shards/code").glob("*.ds"):
        f.unlink()
    return loader(self, stage, step)
sources.ConfigStages.loader = remove_then_load
from runtime.train import main
sys.exit(main())
"""


@pytest.mark.parametrize("workers", [0, 1], ids=["prefetch-thread", "loader-worker"])
def test_a_shard_removed_mid_run_is_one_line_naming_it(shards, tmp_path, workers):
    for name in ("web", "code"):  # copies: the files are removed from them
        shutil.copytree(shards / "shards" / name, tmp_path / name)
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, steps=4, single_stage=True)
    d = yaml.safe_load(cfg.read_text())
    d["data_stages"][0]["data"].update(num_loading_workers=workers, dataset={
        "dataset_folder": [str(tmp_path / "web"), str(tmp_path / "code")], "dataset_weights": [0.5, 0.5]})
    cfg.write_text(yaml.safe_dump(d))
    script = tmp_path / "removed.py"
    script.write_text(REMOVED.replace('Path("shards/code")', f'Path({str(tmp_path / "code")!r})'))
    proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith(f"error: {tmp_path / 'code'}/") and line.endswith(
        f".ds: missing: the file was removed or moved since the dataset was written; restore it (run `nanoset verify "
        f"{tmp_path / 'code'}`) and rerun"), line
