"""The export of a checkpoint carries the tokenizer of the data its stage trained on: after an SFT stage on a chat
folder, its chat template (so that ``apply_chat_template`` works on the export), not the pretraining folder's files;
``--tokenizer DIR`` chooses another."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from runtime.config import ConfigError
from runtime.hf.export import export_checkpoint
from tests.support import CORPUS, FIXTURES, ROOT, TOKENIZER, run_cli
from tests.support.configs import small_config
from tests.support.harness import train_one

transformers = pytest.importorskip("transformers")

CHATML = json.loads((TOKENIZER / "tokenizer_config.json").read_text())["chat_template"]


def tokenizer_folder(folder, **config):
    """The fixture tokenizer.json with a tokenizer_config.json of ``config`` (no chat template)."""
    folder.mkdir()
    shutil.copyfile(TOKENIZER / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", **config}))
    return folder


def test_the_export_after_an_sft_stage_carries_the_chat_template_of_its_data(tmp_path):
    plain = tokenizer_folder(tmp_path / "plain", model_max_length=1024)  # the tokenizer's model's, not ours
    chat_tokenizer = tokenizer_folder(tmp_path / "chat-tokenizer", pad_token="<|pad|>")
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    run_cli("tokenize", CORPUS / "web", "-o", tmp_path / "web", "--tokenizer", plain, "--quiet")
    run_cli("tokenize", FIXTURES / "chat" / "chat-000.jsonl", "-o", tmp_path / "chat", "--tokenizer", chat_tokenizer,
            "--chat", "--chat-template", template, "--quiet")
    run = tmp_path / "run"
    stages = [{"name": "pretrain", "start_training_step": 1,
               "data": {"num_loading_workers": 0, "dataset": {"dataset_folder": str(tmp_path / "web")}}},
              {"name": "sft", "start_training_step": 2,
               "data": {"num_loading_workers": 0, "dataset": {"dataset_folder": str(tmp_path / "chat")}}}]
    cfg = small_config(tmp_path, run, dp=1, steps=2, interval=1, data_stages=stages,
                       checkpoints={"export_hf": True, "checkpoint_interval": 1})
    train_one(cfg, cwd=tmp_path)
    exported = run / "hf"
    config = json.loads((exported / "tokenizer_config.json").read_text())
    assert (config["chat_template"], config["pad_token"], config["eos_token"]) == (CHATML, "<|pad|>", "<|endoftext|>")
    assert (exported / "tokenizer.json").read_bytes() == (TOKENIZER / "tokenizer.json").read_bytes()
    tok = transformers.AutoTokenizer.from_pretrained(exported)
    messages = [{"role": "user", "content": "Where is the mill?"}, {"role": "assistant", "content": "By the canal."}]
    assert tok.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>user\nWhere is the mill?<|im_end|>\n<|im_start|>assistant\nBy the canal.<|im_end|>\n")
    ids = tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") == 1492  # the markers are single tokens, as trained

    pretraining = export_checkpoint(run / "checkpoints" / "step-000001", tmp_path / "pretrain-hf")
    assert json.loads((pretraining / "tokenizer_config.json").read_text()) == {"eos_token": "<|endoftext|>",
                                                                                "model_max_length": 64}

    proc = subprocess.run([sys.executable, "-m", "runtime.export", str(run / "checkpoints"), str(tmp_path / "other"),
                           "--tokenizer", str(plain)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"exported {run / 'checkpoints'} to {tmp_path / 'other'} (tokenizer files from {plain} "
                           f"(--tokenizer))\n")
    assert (tmp_path / "other" / "tokenizer_config.json").read_bytes() == (plain / "tokenizer_config.json").read_bytes()
    with pytest.raises(ConfigError) as e:
        export_checkpoint(run / "checkpoints", tmp_path / "none", tokenizer=tmp_path / "nope")
    assert str(e.value) == (f"--tokenizer {tmp_path / 'nope'}: no such folder; give a Hugging Face tokenizer folder "
                            f"(with tokenizer.json)")
    assert not (tmp_path / "none").exists()
