"""docs/quickstart.md as a new user runs it: its configs written as the page names them, its bash blocks run in
order, as they stand, in a folder holding the repository's fixtures and tools."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import nanoset
from tests.support import ROOT
from tests.support.harness import metrics

PAGE = ROOT / "docs" / "quickstart.md"


def test_the_quickstart_runs_as_written(tmp_path):
    text = PAGE.read_text()
    configs = dict(re.findall(r"`([\w-]+\.yaml)`[^\n]*\n\n```yaml\n(.*?)```", text, re.S))
    commands = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert set(configs) == {"pretrain.yaml", "sft.yaml"} and len(commands) == 5
    for name in ("data_fixtures", "tools"):
        (tmp_path / name).symlink_to(ROOT / name)
    for name, body in configs.items():
        (tmp_path / name).write_text(body)
    bin_dir = tmp_path / ".bin"  # `nanoset` and `python` as the install of step 0 gives them
    bin_dir.mkdir()
    for name, run in (("nanoset", f'"{sys.executable}" -m nanoset.cli'), ("python", f'"{sys.executable}"')):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {run} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(commands)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    documents = len((tmp_path / "my_data" / "text.jsonl").read_text().splitlines())
    assert nanoset.open_dataset(tmp_path / "shards" / "text").num_documents == documents
    pretrain = metrics(tmp_path / "runs" / "pretrain")
    assert [r["step"] for r in pretrain] == list(range(1, 21))
    assert all(r["stage"] == "pretrain" and r["tokens"] == 4 * 128 for r in pretrain)
    sft = metrics(tmp_path / "runs" / "sft")
    assert [r["step"] for r in sft] == list(range(1, 11))
    # answers only: of each step's 4 × 256 tokens, the prompts, template scaffolding and padding are not learned
    assert all(r["stage"] == "sft" and r["tokens"] == 4 * 256 and 0 < r["label_tokens"] < r["tokens"] for r in sft)
    # from the pretrained weights: a fresh model's first loss is ln(vocab) ≈ 9.01; after pretraining, ~7
    assert sft[0]["loss"] < math.log(8192) - 1 < pretrain[0]["loss"]
    exported = json.loads((tmp_path / "models" / "chat" / "config.json").read_text())
    assert exported["architectures"] == ["LlamaForCausalLM"] and exported["hidden_size"] == 64
    assert "chat_template" in json.loads((tmp_path / "models" / "chat" / "tokenizer_config.json").read_text())
    assert proc.stdout.splitlines()[-1].startswith(("transformers loaded models/chat: ",
                                                    "transformers is not installed"))
