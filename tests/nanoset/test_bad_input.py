"""Every bad input gets one clear error line (file, line or offset, what to do) and exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanoset import open_dataset
from tests.support import TOKENIZER, one_line_error, run_cli


def tokenize(tmp_path: Path, *inputs, extra=(), out="out"):
    return run_cli("tokenize", *inputs, "-o", tmp_path / out, "--tokenizer", TOKENIZER, "--quiet", *extra,
                   check=False)


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_malformed_json_line_names_file_and_line(tmp_path):
    f = write_lines(tmp_path / "a.jsonl",
                    [b'{"text": "ok"}', b'{"text": "also ok"}', b'{"text": broken', b'{"text": "x"}'])
    one_line_error(tokenize(tmp_path, f), f"{f}:3: malformed JSON", "--skip-bad-lines")


def test_skip_bad_lines_skips_and_counts(tmp_path, tokenizer, eos_id):
    f = write_lines(tmp_path / "a.jsonl", [b'{"text": "ok"}', b'{"text": broken', b'[1, 2]', b'{"text": null}',
                                           b'{"text": "x \xff"}', b'{"text": "last"}'])
    proc = tokenize(tmp_path, f, extra=["--skip-bad-lines"])
    assert proc.returncode == 0 and "skipped 4 bad lines" in proc.stdout
    ds = open_dataset(tmp_path / "out")
    assert [ds.document(i).tolist() for i in range(ds.num_documents)] == [
        tokenizer.encode("ok").ids + [eos_id], tokenizer.encode("last").ids + [eos_id]]
    assert ds.manifest.skipped_lines == 4


def test_missing_text_column_lists_columns(tmp_path):
    f = write_lines(tmp_path / "a.jsonl", [json.dumps({"content": "x", "id": 1}).encode()])
    one_line_error(tokenize(tmp_path, f), f"{f}:1: no column 'text'", "content, id", "--text-column")


def test_missing_column_in_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "a.parquet")
    one_line_error(tokenize(tmp_path, tmp_path / "a.parquet"), "no column 'text'", "body")


def test_non_utf8_names_file_and_offset(tmp_path):
    f = write_lines(tmp_path / "a.jsonl", [b'{"text": "fine"}', b'{"text": "caf\xe9"}'])
    one_line_error(tokenize(tmp_path, f), f"{f}: invalid UTF-8 at byte offset 30 (line 2)")
    t = tmp_path / "doc.txt"
    t.write_bytes(b"hello \xc3\x28 world")
    one_line_error(tokenize(tmp_path, t, out="o2"), f"{t}: invalid UTF-8 at byte offset 6")


def test_empty_inputs(tmp_path):
    (tmp_path / "empty").mkdir()
    one_line_error(tokenize(tmp_path, tmp_path / "empty"), "holds no input files")
    one_line_error(tokenize(tmp_path, tmp_path / "nope*.jsonl"), "no such file or folder")
    f = tmp_path / "blank.jsonl"
    f.write_text("\n\n")
    one_line_error(tokenize(tmp_path, f), "no documents found")
    bad = tmp_path / "notes.csv"
    bad.write_text("a,b")
    one_line_error(tokenize(tmp_path, bad, out="o3"), "unsupported input type")


def test_output_holding_another_dataset_needs_overwrite(tmp_path):
    a = write_lines(tmp_path / "a.jsonl", [b'{"text": "one"}'])
    b = write_lines(tmp_path / "b.jsonl", [b'{"text": "two"}'])
    assert tokenize(tmp_path, a).returncode == 0
    one_line_error(tokenize(tmp_path, b), "holds a different dataset", "--overwrite")
    assert tokenize(tmp_path, b, extra=["--overwrite"]).returncode == 0
    assert open_dataset(tmp_path / "out").manifest.build["inputs"][0]["path"] == str(b)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.md").write_text("mine")
    one_line_error(tokenize(tmp_path, a, out="other"), "holds other files")


def test_tokenizer_errors(tmp_path):
    f = write_lines(tmp_path / "a.jsonl", [b'{"text": "one"}'])
    proc = run_cli("tokenize", f, "-o", tmp_path / "o", "--tokenizer", "some-org/not-cached", check=False)
    one_line_error(proc, "not in the local Hugging Face cache", "nothing is downloaded",
                   "fetch it first with `huggingface-cli download some-org/not-cached tokenizer.json`")
    proc = run_cli("tokenize", f, "-o", tmp_path / "o", "--tokenizer", TOKENIZER, "--eos-token", "<nope>", check=False)
    one_line_error(proc, f"--eos-token '<nope>' is not in tokenizer {TOKENIZER / 'tokenizer.json'}; its special "
                         f"tokens are: '<|endoftext|>', '<|pad|>', '<|im_start|>', '<|im_end|>'")


def test_a_mistyped_tokenizer_path_is_not_sent_to_the_hub(tmp_path, monkeypatch):
    """A path that does not exist suggested `huggingface-cli download /abs/path/gpt3.json tokenizer.json`."""
    from nanoset.tokenize.tokenizer import looks_like_repo_id

    f = write_lines(tmp_path / "a.jsonl", [b'{"text": "one"}'])
    (tmp_path / "gpt2.json").write_text("{}")
    for spec, near in [(tmp_path / "gpt3.json", f" ({tmp_path} holds gpt2.json)"), (tmp_path / "no" / "tok", "")]:
        proc = run_cli("tokenize", f, "-o", tmp_path / "o", "--tokenizer", spec, check=False)
        assert one_line_error(proc) == (f"error: tokenizer {str(spec)!r}: no such file or folder{near}; pass a path "
                                        f"to a tokenizer.json")
    shapes = {"gpt2": True, "meta-llama/Llama-3.1-8B": True, "Qwen/Qwen2.5-0.5B": True, "gpt3.json": False,
              "org/tok.json": False, "./tok": False, "a/b/c": False, "/abs/org": False, "~/tok": False}
    assert {spec: looks_like_repo_id(spec) for spec in shapes} == shapes
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)  # "models/" is a folder here: "models/tok" is a path into it, mistyped
    assert not looks_like_repo_id("models/tok") and looks_like_repo_id("other/tok")


def bare_tokenizer(path: Path, specials: list[str], eos_in_vocabulary: bool = True) -> Path:
    """The fixture tokenizer as a bare tokenizer.json (GPT-2's shape: no tokenizer_config.json beside it) with
    ``specials`` as its only added tokens; ``eos_in_vocabulary`` False renames every end-of-text name away."""
    spec = json.loads((TOKENIZER / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    if not eos_in_vocabulary:
        vocab["<|notext|>"] = vocab.pop("<|endoftext|>")
    base = len(vocab)
    spec["added_tokens"] = [{"id": base + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, t in enumerate(specials)]
    path.write_text(json.dumps(spec))
    return path


def test_the_eos_of_a_bare_tokenizer_file(tmp_path, tokenizer):
    """GPT-2's tokenizer.json adds no token (<|endoftext|> is only in its vocabulary): it was refused with "its
    special tokens are: none", and --eos-token '</s>' then said "its special tokens are: []"."""
    f = write_lines(tmp_path / "a.jsonl", [b'{"text": "one"}'])
    gpt2 = bare_tokenizer(tmp_path / "gpt2.json", [])
    proc = run_cli("tokenize", f, "-o", tmp_path / "o", "--tokenizer", gpt2, "--quiet")
    assert proc.stderr == (f"note: tokenizer {gpt2} declares no EOS token; every document ends with '<|endoftext|>' "
                           f"(id 0), the end-of-text token of its vocabulary, as transformers does: pass --eos-token "
                           f"TOKEN for another\n")
    assert open_dataset(tmp_path / "o").document(0).tolist() == tokenizer.encode("one").ids + [0]
    proc = run_cli("tokenize", f, "-o", tmp_path / "o2", "--tokenizer", gpt2, "--eos-token", "</s>", check=False)
    one_line_error(proc, f"error: --eos-token '</s>' is not in tokenizer {gpt2}; it has no special tokens; its "
                         f"vocabulary holds '<|endoftext|>'")
    lone = bare_tokenizer(tmp_path / "lone.json", ["<mask>", "<|stop|>"], eos_in_vocabulary=False)  # <mask>: no EOS
    proc = run_cli("tokenize", f, "-o", tmp_path / "o3", "--tokenizer", lone, "--quiet")
    assert proc.stderr == (f"note: tokenizer {lone} declares no EOS token; every document ends with '<|stop|>' (id "
                           f"1493), its only special token, as transformers does: pass --eos-token TOKEN for "
                           f"another\n")
    assert open_dataset(tmp_path / "o3").document(0).tolist()[-1] == 1493
    for specials, listed in [([], "it has no special tokens"),
                             (["<a>", "<b>"], "its special tokens are: '<a>', '<b>'")]:
        none = bare_tokenizer(tmp_path / "none.json", specials, eos_in_vocabulary=False)
        proc = run_cli("tokenize", f, "-o", tmp_path / "o4", "--tokenizer", none, check=False)
        one_line_error(proc, f"error: tokenizer {none} declares no EOS token; pass --eos-token TOKEN ({listed})")


def test_conversations_without_chat_say_to_add_it(tmp_path):
    """Chat rows tokenized without --chat got "no column 'text' ... (choose one with --text-column)"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = write_lines(tmp_path / "a.jsonl", [json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()])
    one_line_error(tokenize(tmp_path, f), f"error: {f}:1: no column 'text'; the columns there are: messages, "
                                          f"which hold conversations: add --chat (or choose a text column with "
                                          f"--text-column)")
    pq.write_table(pa.table({"prompt": ["a"], "completion": ["b"]}), tmp_path / "pc.parquet")
    one_line_error(tokenize(tmp_path, tmp_path / "pc.parquet", out="o2"),
                   "the columns there are: prompt, completion, which hold conversations: add --chat")


def test_bad_option_values(tmp_path):
    f = write_lines(tmp_path / "a.jsonl", [b'{"text": "one"}'])
    one_line_error(tokenize(tmp_path, f, extra=["--workers", "0"]), "--workers must be ≥ 1")
    one_line_error(tokenize(tmp_path, f, extra=["--num-tasks", "2", "--task-index", "2"]),
                   "--task-index must be in [0, 2)")


@pytest.mark.parametrize("config, error", [
    ("{bad", "tokenizer_config.json: not valid JSON (Expecting property name"),
    ('["x"]', "tokenizer_config.json: a JSON list, not an object; fix or remove it"),
    ('{"eos_token": "<nope>"}', "tokenizer_config.json: eos_token '<nope>' is not in the tokenizer"),
])
def test_broken_tokenizer_config_is_an_error_not_another_eos(tmp_path, config, error):
    """A tokenizer_config.json that could not be read (or named an EOS the tokenizer lacks) was ignored: the
    EOS was then guessed from the special tokens, possibly another one than the model was trained with."""
    from nanoset.errors import NanosetError
    from nanoset.tokenize.tokenizer import resolve_tokenizer

    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text((TOKENIZER / "tokenizer.json").read_text())
    (tmp_path / "tok" / "tokenizer_config.json").write_text(config)
    with pytest.raises(NanosetError, match=f"^{tmp_path / 'tok'}/" + error.replace("(", "\\(").replace("[", "\\[")):
        resolve_tokenizer(str(tmp_path / "tok"))
    (tmp_path / "tok" / "tokenizer_config.json").write_text('{"eos_token": {"content": "<|endoftext|>"}}')
    assert resolve_tokenizer(str(tmp_path / "tok")).info.eos_token == "<|endoftext|>"


def test_an_eos_only_declared_beside_the_tokenizer_is_refused_without_listing_it_as_a_candidate(tmp_path):
    """An EOS that only tokenizer_config.json's added_tokens_decoder adds is refused; the refusal listed that very
    token among "its special tokens", the candidates to pass instead. It names where the token comes from, and
    lists only tokens of tokenizer.json itself."""
    from nanoset.errors import NanosetError
    from nanoset.tokenize.tokenizer import resolve_tokenizer

    spec = json.loads((TOKENIZER / "tokenizer.json").read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<|im_end|>"]
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    decoder = {"1493": {"content": "<|im_end|>", "special": True, "lstrip": False, "rstrip": False,
                        "normalized": False, "single_word": False}}
    (folder / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    with pytest.raises(NanosetError) as e:
        resolve_tokenizer(str(folder), eos_token="<|im_end|>")
    assert str(e.value) == (f"--eos-token '<|im_end|>' is not in tokenizer {folder / 'tokenizer.json'} (only "
                            f"{folder / 'tokenizer_config.json'} declares it); its special tokens are: "
                            f"'<|endoftext|>', '<|pad|>', '<|im_start|>'")
