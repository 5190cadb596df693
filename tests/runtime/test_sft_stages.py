"""SFT stages from Hugging Face datasets: conversations tokenized into the cache with loss masks,
exactly as ``nanoset tokenize --chat`` does; packed whole, trained on the answers only."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nanoset import open_dataset
from runtime.config import ConfigError
from runtime.config.load import load_config
from runtime.data import DataPlan
from runtime.data.hf_datasets import resolve_stage_folders
from tests.support import FIXTURES, TOKENIZER, run_cli
from tests.support.configs import make_config

CHAT = FIXTURES / "chat" / "chat-000.jsonl"


def sft_config(tmp_path, source, **dataset):
    ds = {"hf_dataset_or_datasets": str(source), "sft": True, **dataset}
    c = make_config(train_steps=4, seq=256, tokenizer={"tokenizer_name_or_path": str(TOKENIZER)},
                    stages=[{"name": "sft", "start_training_step": 1,
                             "data": {"use_position_ids": True, "packing": "documents", "dataset": ds}}])
    c.general.cache_dir = str(tmp_path / "cache")
    return c


def test_sft_stage_is_tokenized_like_tokenize_chat(tmp_path):
    config = sft_config(tmp_path, CHAT)
    [[folder]] = resolve_stage_folders(config)
    run_cli("tokenize", CHAT, "-o", tmp_path / "cli", "--tokenizer", TOKENIZER, "--chat", "--quiet")
    ours, cli = open_dataset(folder), open_dataset(tmp_path / "cli")
    assert ours.has_loss_masks and ours.num_documents == 300
    n = cli.num_tokens
    assert ours.num_tokens == n and np.array_equal(ours.tokens(0, n), cli.tokens(0, n))
    assert np.array_equal(ours.loss_mask(0, n), cli.loss_mask(0, n))
    assert 0 < int(ours.loss_mask(0, n).sum()) < n  # answers only
    assert resolve_stage_folders(config) == [[folder]]  # cached: the same folder, not tokenized again
    plan = DataPlan(config, [[folder]])
    p = plan.datasets[0]
    lengths = np.diff(ours.document_ends, prepend=0)
    assert p.packing == "documents" and p.num_long_documents == int((lengths > 257).sum())
    starts = set(np.concatenate([[0], ours.document_ends[:-1]]).tolist())
    assert set(p.starts.tolist()) <= starts  # every packed sample begins at a conversation's start


def test_sft_cache_is_keyed_by_the_chat_template(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    [[own]] = resolve_stage_folders(sft_config(tmp_path, CHAT))
    [[other]] = resolve_stage_folders(sft_config(tmp_path, CHAT, chat_template=str(template)))
    assert own != other
    text = open_dataset(other)
    assert text.num_tokens != open_dataset(own).num_tokens and text.has_loss_masks


def test_sft_cache_is_keyed_by_the_special_tokens_the_template_renders(tmp_path):
    """A template writes bos_token & co. from tokenizer_config.json: another BOS there is another rendering
    (the cache was reused, its conversations rendered with the old BOS)."""
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(TOKENIZER, tok)
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ bos_token }}" + cfg["chat_template"]
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg))

    def folder():
        config = sft_config(tmp_path, CHAT)
        config.tokenizer.tokenizer_name_or_path = str(tok)
        [[out]] = resolve_stage_folders(config)
        return out

    first = folder()
    cfg["bos_token"] = "<|pad|>"
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg))
    second = folder()
    assert first != second
    assert open_dataset(second).num_tokens == open_dataset(first).num_tokens + 300  # one <|pad|> per conversation


def test_sft_stage_errors_name_the_config_keys(tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(3)))
    with pytest.raises(ConfigError, match=r"data_stages\[0\] \(sft\)\.data\.dataset\.messages_column_name \(or "
                                          r"prompt_column_name and completion_column_name\): 'messages' is not a "
                                          r"column of .*plain\.jsonl.*; the columns there are: text"):
        resolve_stage_folders(sft_config(tmp_path, plain))
    with pytest.raises(ConfigError, match=r"data_stages\[0\] \(sft\)\.data\.dataset\.chat_template: only applies "
                                          r"to conversations; set sft: true or remove it"):
        sft_config(tmp_path, CHAT, sft=False, chat_template="t.jinja")
    with pytest.raises(ConfigError, match=r"^data_stages\[0\] \(sft\)\.data\.dataset\.messages_column_name: only "
                                          r"applies to conversations; set sft: true or remove it$"):
        sft_config(tmp_path, CHAT, sft=False, messages_column_name="conversation")  # was ignored: text read
    with pytest.raises(ConfigError, match=r"^data_stages\[0\] \(sft\)\.data\.dataset\.text_column_name: not read "
                                          r"with sft: true \(conversations come from messages_column_name, or "
                                          r"prompt_column_name and completion_column_name\); remove it$"):
        sft_config(tmp_path, CHAT, text_column_name="conversation")
    with pytest.raises(ConfigError, match=r"data_stages\[0\] \(sft\)\.data\.dataset\.chat_template: --chat-template "
                                          r".*missing\.jinja: cannot read it"):
        resolve_stage_folders(sft_config(tmp_path, CHAT, chat_template=str(tmp_path / "missing.jinja")))


def test_a_bad_row_of_an_sft_stage_does_not_name_a_flag_the_config_lacks(tmp_path):
    """The row error said '(pass --skip-bad-lines ...)', a tokenize flag a stage config has no key for."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(ConfigError) as e:
        resolve_stage_folders(sft_config(tmp_path, bad))
    assert str(e.value) == (f"data_stages[0] (sft).data.dataset: {bad}:1: column 'messages' holds no assistant "
                            f"message: nothing to train on; fix or remove that row, or tokenize the data with "
                            f"`nanoset tokenize --skip-bad-lines` (and --chat for conversations) and list that folder "
                            f"as dataset_folder instead")


def test_demo_config_ends_with_a_packed_document_masked_sft_stage(shards, chat_shards, tmp_path):
    from tests.support import CONFIGS


    config = load_config(CONFIGS / "three-stage.yaml")
    assert config.model.attention == "document" and [s.name for s in config.data_stages] == ["pretrain", "anneal",
                                                                                                "sft"]
    config.general.cache_dir = str(tmp_path / "cache")
    folders = [[str(shards / "shards" / n) for n in ("web", "code")], [str(shards / "shards" / "sft")],
               [str(chat_shards)]]
    plan = DataPlan(config, folders)
    sft = plan.datasets[plan.stages[2].dataset_ids[0]]
    assert sft.packing == "documents" and sft.reader.has_loss_masks and sft.num_long_documents == 0
