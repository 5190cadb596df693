"""Tokenizer folders read as transformers (≥ 5) reads them: the special tokens a template gets (a
``bos_token`` only in ``special_tokens_map.json`` rendered as ""), the tokens declared beside
``tokenizer.json`` but missing from its added tokens (encoded as text pieces: a rendered
``<|endoftext|>`` was 7 of them), the template source (``chat_template.jinja`` before the config's key),
and a template file that is not UTF-8 (a traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanoset import open_dataset
from nanoset.tokenize.chat_template import ChatRenderer, load_chat_template, special_token_strings
from nanoset.tokenize.tokenizer import load_tokenizer, resolve_tokenizer
from tests.support import TOKENIZER, one_line_error, run_cli

transformers = pytest.importorskip("transformers", minversion="5")

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TEMPLATE = ("{{ bos_token }}{{ image_token | default('') }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' "
            "+ m['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ eos_token }}{% endif %}")
CONVERSATION = [{"role": "user", "content": "Hi <image> there"}, {"role": "assistant", "content": "Yes <tool>."}]


def tokenizer_json(without_added: bool) -> dict:
    spec = json.loads((TOKENIZER / "tokenizer.json").read_text())
    if without_added:  # the tokens stay in the vocabulary, but tokenizer.json no longer adds them
        spec["added_tokens"] = []
    return spec


def record(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True}


LAYOUTS = {
    # the older layout: the config names EOS only; BOS and the extra tokens are in special_tokens_map.json
    "bos only in special_tokens_map.json": (False, {"eos_token": "<|endoftext|>"},
                                            {"bos_token": "<|im_start|>", "additional_special_tokens": ["<tool>"]}),
    # tokens declared in the config's added_tokens_decoder but missing from tokenizer.json's added tokens
    "added_tokens_decoder only": (True, {"eos_token": "<|endoftext|>", "bos_token": "<|im_start|>",
                                         "added_tokens_decoder": {str(i): record(t) for i, t in
                                                                  zip((0, 1492, 1493), SPECIALS)}}, None),
    # named, extra and model-specific tokens new to the vocabulary (new ids, in transformers' order)
    "extra and model-specific tokens": (True, {"eos_token": {"content": "<|endoftext|>", "__type": "AddedToken"},
                                               "image_token": "<image>", "pad_token": "<pad>",
                                               "extra_special_tokens": ["<tool>", "<|im_end|>"]},
                                        {"bos_token": "<|im_start|>"}),
    # special_tokens_map.json records as transformers writes them, and a config with added_tokens_decoder:
    # special_tokens_map.json is then not read at all
    "config with decoder ignores special_tokens_map.json": (
        False, {"eos_token": "<|im_end|>", "added_tokens_decoder": {"1492": record("<|im_start|>")}},
        {"bos_token": {"content": "<|im_start|>", "lstrip": False, "normalized": False, "rstrip": False,
                       "single_word": False}}),
}


def folder_for(tmp_path: Path, layout: str) -> Path:
    without_added, config, special_map = LAYOUTS[layout]
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(without_added)))
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    if special_map is not None:
        (folder / "special_tokens_map.json").write_text(json.dumps(special_map))
    return folder


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_special_tokens_and_encoding_equal_transformers(tmp_path, layout):
    folder = folder_for(tmp_path, layout)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    path = folder / "tokenizer.json"
    eos = resolve_tokenizer(str(folder)).info.eos_token
    globals_ = special_token_strings(path, eos)
    assert globals_ == hf.special_tokens_map
    text = ChatRenderer(load_chat_template(path), globals_).render(CONVERSATION)
    assert text == hf.apply_chat_template(CONVERSATION, tokenize=False)
    ours = load_tokenizer(path)
    assert ours.encode(text, add_special_tokens=False).ids == hf(text, add_special_tokens=False)["input_ids"]
    assert ours.get_vocab_size(with_added_tokens=True) == len(hf)


def test_a_rendered_special_token_missing_from_tokenizer_json_is_one_id(tmp_path, eos_id):
    folder = folder_for(tmp_path, "added_tokens_decoder only")
    messages = [{"role": "user", "content": "Hi <|endoftext|>"}, {"role": "assistant", "content": "Yes."}]
    (tmp_path / "in.jsonl").write_text(json.dumps({"messages": messages}) + "\n")
    run_cli("tokenize", tmp_path / "in.jsonl", "-o", tmp_path / "out", "--tokenizer", folder, "--chat", "--quiet")
    ds = open_dataset(tmp_path / "out")
    ids = ds.document(0).tolist()
    # <|im_start|> (the BOS and two headers), <|im_end|>, the user's <|endoftext|> and the EOS: one id each
    assert ids[:2] == [1492, 1492] and ids.count(1492) == 3 and ids.count(1493) == 2 and ids.count(eos_id) == 2
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert ids == hf.apply_chat_template(messages, return_dict=True)["input_ids"] + [eos_id]
    assert ds.manifest.build["registered_tokens"][0] == {"content": "<|endoftext|>", "lstrip": False,
                                                          "normalized": False, "rstrip": False,
                                                          "single_word": False, "special": True}


def test_chat_template_jinja_wins_over_the_config_key(tmp_path):
    folder = folder_for(tmp_path, "bos only in special_tokens_map.json")
    (folder / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    template = load_chat_template(folder / "tokenizer.json")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert template.source == hf.chat_template and template.origin == str(folder / "chat_template.jinja")
    assert ChatRenderer(template, {}).render(CONVERSATION) == "[Hi <image> there][Yes <tool>.]"


def test_a_template_file_that_is_not_utf8_is_one_line(tmp_path):
    folder = folder_for(tmp_path, "bos only in special_tokens_map.json")
    (folder / "chat_template.jinja").write_bytes(b"{{ 'caf\xe9' }}")
    (tmp_path / "in.jsonl").write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    one_line_error(run_cli("tokenize", tmp_path / "in.jsonl", "-o", tmp_path / "out", "--tokenizer", folder, "--chat",
                           "--quiet", check=False),
                   f"{folder / 'chat_template.jinja'}: not UTF-8 text (byte 7 is b'\\xe9'); save the template as UTF-8")
    one_line_error(run_cli("tokenize", tmp_path / "in.jsonl", "-o", tmp_path / "out", "--tokenizer", TOKENIZER,
                           "--chat", "--chat-template", folder / "chat_template.jinja", "--quiet", check=False),
                   f"--chat-template {folder / 'chat_template.jinja'}: not UTF-8 text")
