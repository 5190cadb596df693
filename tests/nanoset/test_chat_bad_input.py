"""`nanoset tokenize --chat` on bad input: each bad row, template or option is one line naming the file,
line or option; --skip-bad-lines counts the rows it skips."""

from __future__ import annotations

import json
import shutil

import pytest

from nanoset import open_dataset
from tests.support import TOKENIZER, run_cli

BAD_ROWS = [
    {"messages": "hello"},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]},
    {"messages": [{"role": "user", "content": "only a question"}]},
    {"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "y"}]},
    {"prompt": "q", "completion": None},
]
BAD_MESSAGES = [
    "column 'messages' is str, not a list of {role, content} objects",
    "messages[0] is not a {role, content} object",
    "messages[0] has role 'tool'; the roles are system, user, assistant",
    "column 'messages' holds no assistant message: nothing to train on",
    "messages[0].content is int, not text",
    "column 'completion' is NoneType, not text",
]


@pytest.mark.parametrize("k", range(len(BAD_ROWS)))
def test_bad_row_is_one_line_naming_file_and_line(tmp_path, k):
    good = {"prompt": "q", "completion": "a"}
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(BAD_ROWS[k]) + "\n")
    proc = run_cli("tokenize", path, "-o", tmp_path / "out", "--tokenizer", TOKENIZER, "--chat", "--quiet", check=False)
    assert proc.returncode == 1
    assert proc.stderr == f"error: {path}:2: {BAD_MESSAGES[k]} (pass --skip-bad-lines to skip and count such lines)\n"


def test_bad_rows_skipped_and_counted(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"prompt": "q", "completion": "a"}, *BAD_ROWS]))
    proc = run_cli("tokenize", path, "-o", tmp_path / "out", "--tokenizer", TOKENIZER, "--chat", "--quiet",
                   "--skip-bad-lines")
    assert "skipped 6 bad lines" in proc.stdout and open_dataset(tmp_path / "out").num_documents == 1


def test_every_row_skipped_is_named_as_such(tmp_path):
    """A template failing on every row, with --skip-bad-lines: the job said 'no documents found in the input'."""
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in BAD_ROWS))
    proc = run_cli("tokenize", path, "-o", tmp_path / "out", "--tokenizer", TOKENIZER, "--chat", "--skip-bad-lines",
                   check=False)
    assert proc.returncode == 1 and proc.stderr == (
        f"error: {path}: all {len(BAD_ROWS)} rows were bad and skipped (--skip-bad-lines); nothing to tokenize: "
        f"rerun with --overwrite and without --skip-bad-lines to see the first error\n")


def test_template_error_row_and_missing_columns(tmp_path):
    template = tmp_path / "strict.jinja"
    template.write_text("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}"
                        "{% endif %}{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "system", "content": "s"},
                                             {"role": "assistant", "content": "a"}]})
                    + "\n")
    proc = run_cli("tokenize", path, "-o", tmp_path / "o1", "--tokenizer", TOKENIZER, "--chat", "--chat-template",
                   template, "--quiet", check=False)
    assert proc.stderr.startswith(f"error: {path}:1: the chat template raised: first message must be user (pass")
    path.write_text(json.dumps({"text": "plain"}) + "\n")
    proc = run_cli("tokenize", path, "-o", tmp_path / "o2", "--tokenizer", TOKENIZER, "--chat", "--quiet", check=False)
    assert proc.stderr == (f"error: {path}:1: no column 'messages'; the columns there are: text (choose one with "
                           f"--messages-column, or --prompt-column and --completion-column (no 'prompt' + "
                           f"'completion' pair either))\n")
    (tmp_path / "doc.txt").write_text("plain")
    proc = run_cli("tokenize", tmp_path / "doc.txt", "-o", tmp_path / "o3", "--tokenizer", TOKENIZER, "--chat",
                   "--quiet", check=False)
    assert proc.stderr.startswith(f"error: {tmp_path / 'doc.txt'}: a .txt file holds plain text, not conversations")


def test_missing_template_and_template_without_chat(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    shutil.copy(TOKENIZER / "tokenizer.json", tok)
    (tok / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    (tmp_path / "in.jsonl").write_text(json.dumps({"prompt": "q", "completion": "a"}) + "\n")
    proc = run_cli("tokenize", tmp_path / "in.jsonl", "-o", tmp_path / "o", "--tokenizer", tok, "--chat", check=False)
    assert proc.stderr == (f"error: tokenizer {tok / 'tokenizer.json'}: no chat template (no chat_template in "
                           f"{tok / 'tokenizer_config.json'}, no chat_template.jinja beside it); pass --chat-template "
                           f"FILE\n")
    proc = run_cli("tokenize", tmp_path / "in.jsonl", "-o", tmp_path / "o", "--tokenizer", tok, "--chat-template",
                   "x.jinja", check=False)
    assert proc.stderr == "error: --chat-template needs --chat\n"
    # a column option of the other kind of rows was ignored (and the default column read instead)
    for args, line in ((["--messages-column", "conv"], "--messages-column needs --chat"),
                       (["--completion-column", "answer"], "--completion-column needs --chat"),
                       (["--chat", "--text-column", "conv"], "--text-column does not apply with --chat (conversations "
                        "are read from --messages-column, or --prompt-column and --completion-column)")):
        proc = run_cli("tokenize", tmp_path / "in.jsonl", "-o", tmp_path / "o", "--tokenizer", TOKENIZER, *args,
                       check=False)
        assert proc.returncode == 1 and proc.stderr == f"error: {line}\n"
