"""The key of a tokenize job's options (``nanoset.tokenize.plan_key``): what the job records in its plan besides the
inputs, hashed; the same options give the same key, and each thing that changes the bytes written changes it."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace

import pytest

from nanoset import open_dataset
from nanoset.errors import OptionError
from nanoset.tokenize import TokenizeOptions, plan_key, tokenize
from tests.support import CORPUS, FIXTURES, TOKENIZER


def options(tmp_path, **changes) -> TokenizeOptions:
    return replace(TokenizeOptions(inputs=[str(CORPUS / "web")], output=tmp_path / "out", tokenizer=str(TOKENIZER),
                                   progress=False), **changes)


@pytest.fixture
def tokenizer_copy(tmp_path):
    """A copy of the fixture tokenizer folder, to change one file of."""
    folder = tmp_path / "tok"
    shutil.copytree(TOKENIZER, folder)
    return folder


def test_the_key_is_the_hash_of_the_options_the_job_records_in_its_plan(tmp_path):
    opts = options(tmp_path, task_bytes=200_000)
    tokenize(opts)
    build = dict(open_dataset(opts.output).manifest.build)
    del build["inputs"], build["task_bytes"]  # the inputs, and how they are cut: not options
    assert plan_key(opts) == hashlib.sha256(json.dumps(build, sort_keys=True).encode()).hexdigest()


def test_options_that_do_not_change_the_bytes_do_not_change_the_key(tmp_path):
    key = plan_key(options(tmp_path))
    assert plan_key(options(tmp_path)) == key
    same = [options(tmp_path, workers=3), options(tmp_path, num_tasks=4, task_index=2),
            options(tmp_path, output=tmp_path / "elsewhere"), options(tmp_path, progress=True),
            options(tmp_path, backend="tokenizers"), options(tmp_path, overwrite=True),
            options(tmp_path, inputs=[str(CORPUS / "code")]), options(tmp_path, task_bytes=1 << 16)]
    assert [plan_key(o) for o in same] == [key] * len(same)


def test_each_thing_that_changes_the_bytes_changes_the_key(tmp_path, tokenizer_copy, monkeypatch):
    from nanoset.tokenize import job

    config_file = tokenizer_copy / "tokenizer_config.json"
    declared = json.loads(config_file.read_text())
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    chat = options(tmp_path, chat=True, inputs=[str(FIXTURES / "chat")])
    keys = {"plain": plan_key(options(tmp_path))}
    keys["eos"] = plan_key(options(tmp_path, eos_token="<|im_end|>"))
    keys["text column"] = plan_key(options(tmp_path, text_column="body"))
    keys["shard size"] = plan_key(options(tmp_path, max_tokens_per_shard=1000))
    keys["bad rows"] = plan_key(options(tmp_path, skip_bad_lines=True))
    tokenizer_json = tokenizer_copy / "tokenizer.json"
    tokenizer_json.write_text(json.dumps(json.loads(tokenizer_json.read_text()), indent=1))  # same ids, other sha
    keys["tokenizer sha256"] = plan_key(options(tmp_path, tokenizer=str(tokenizer_copy)))
    config_file.write_text(json.dumps({**declared, "additional_special_tokens": ["<tool>"]}))
    keys["registered tokens"] = plan_key(options(tmp_path, tokenizer=str(tokenizer_copy)))
    config_file.write_text(json.dumps(declared))
    keys["chat"] = plan_key(chat)
    keys["template"] = plan_key(replace(chat, chat_template=str(template)))
    keys["messages column"] = plan_key(replace(chat, messages_column="conversation"))
    keys["prompt column"] = plan_key(replace(chat, prompt_column="question"))
    keys["completion column"] = plan_key(replace(chat, completion_column="answer"))
    config_file.write_text(json.dumps({**declared, "bos_token": "<|im_start|>"}))  # a global the template gets
    keys["special tokens"] = plan_key(replace(chat, tokenizer=str(tokenizer_copy)))
    config_file.write_text(json.dumps(declared))
    assert plan_key(replace(chat, tokenizer=str(tokenizer_copy))) != keys["special tokens"]
    monkeypatch.setattr(job, "MASK_RULE", job.MASK_RULE + 1)
    keys["mask rule"] = plan_key(chat)
    assert len(set(keys.values())) == len(keys), keys


def test_a_tokenizer_or_template_it_cannot_use_is_an_option_error_naming_the_option(tmp_path):
    """So that a caller with other names for its options (the runtime's config) can name its own."""
    with pytest.raises(OptionError) as e:
        plan_key(options(tmp_path, tokenizer=str(tmp_path)))
    assert (e.value.option, str(e.value)) == ("tokenizer", f"{tmp_path}: folder has no tokenizer.json; pass the "
                                                           f"tokenizer.json file itself")
    with pytest.raises(OptionError) as e:
        plan_key(options(tmp_path, chat=True, chat_template=str(tmp_path / "missing.jinja")))
    assert e.value.option == "chat_template" and str(e.value).startswith(f"--chat-template {tmp_path}/missing.jinja: ")
