"""A rerun after a failure or a change: the corrected command runs (a failed run's work folder is no other
dataset), an unfinished job of other options or of another mask-rule version starts afresh with a note
(its shards are never mixed with the new ones), and a finished dataset is replaced only on request."""

from __future__ import annotations

import json
import os
from pathlib import Path

from nanoset import open_dataset
from tests.support import FIXTURES, TOKENIZER, one_line_error, run_cli
from tests.support.datasets import same_folder

CHAT = FIXTURES / "chat" / "chat-000.jsonl"


def tokenize(*args, check=False):
    return run_cli("tokenize", *args, "--tokenizer", TOKENIZER, "--quiet", check=check)


def rows(path: Path, n: int, bad_at: int | None = None) -> Path:
    lines = [json.dumps({"text": f"document number {i} " * 20}) for i in range(n)]
    if bad_at is not None:
        lines[bad_at] = '{"text": broken'
    path.write_text("\n".join(lines) + "\n")
    return path


def note_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("note: ")]


def test_the_rerun_a_bad_row_error_suggests_runs(tmp_path):
    """A bad row in task 2 of 4: the rerun with --skip-bad-lines (the error's own advice) was refused with
    'holds a different dataset; pass --overwrite'; it now replaces the unfinished job and says so."""
    data = rows(tmp_path / "a.jsonl", 200, bad_at=120)
    out = tmp_path / "out"
    one_line_error(tokenize(data, "-o", out, "--task-bytes", 25_000), f"{data}:121: malformed JSON",
                   "--skip-bad-lines")
    assert (out / ".nanoset-work").is_dir() and not (out / "nanoset.json").exists()
    proc = tokenize(data, "-o", out, "--task-bytes", 25_000, "--skip-bad-lines", check=True)
    assert note_lines(proc) == [f"note: {out}: replaced an unfinished job with other skip_bad_lines (1 of 4 tasks "
                                f"done) by this one"]
    assert "skipped 1 bad lines; complete" in proc.stdout
    fresh = tokenize(data, "-o", tmp_path / "fresh", "--task-bytes", 25_000, "--skip-bad-lines", check=True)
    assert note_lines(fresh) == [] and same_folder(out, tmp_path / "fresh")
    # fixed in the file instead (a bad row in the first task: nothing done): the same command runs again
    edit = rows(tmp_path / "b.jsonl", 200, bad_at=5)
    one_line_error(tokenize(edit, "-o", tmp_path / "edit", "--task-bytes", 50_000), f"{edit}:6: malformed JSON")
    rows(edit, 200)
    proc = tokenize(edit, "-o", tmp_path / "edit", "--task-bytes", 50_000, check=True)
    assert note_lines(proc) == [f"note: {tmp_path / 'edit'}: replaced an unfinished job whose input {edit} changed "
                                f"since it began (0 of 2 tasks done) by this one"]
    assert open_dataset(tmp_path / "edit").num_documents == 200


def test_a_wrong_column_or_a_missing_chat_flag_does_not_block_the_corrected_command(tmp_path):
    data = rows(tmp_path / "a.jsonl", 5)
    out = tmp_path / "out"
    one_line_error(tokenize(data, "-o", out, "--text-column", "body"), "no column 'body'")
    assert len(note_lines(tokenize(data, "-o", out, check=True))) == 1
    chat_out = tmp_path / "chat"
    one_line_error(tokenize(CHAT, "-o", chat_out), "no column 'text'")
    proc = tokenize(CHAT, "-o", chat_out, "--chat", check=True)
    assert note_lines(proc) == [f"note: {chat_out}: replaced an unfinished job with other chat, text_column (0 of 2 "
                                f"tasks done) by this one"]
    assert open_dataset(chat_out).has_loss_masks


def test_an_unfinished_job_of_other_options_starts_afresh_and_a_finished_one_is_kept(tmp_path):
    data = rows(tmp_path / "a.jsonl", 200)
    out = tmp_path / "out"
    base = [data, "-o", out, "--task-bytes", 25_000]
    tokenize(*base, "--num-tasks", 2, "--task-index", 0, check=True)
    proc = tokenize(*base, "--max-tokens-per-shard", 500, check=True)  # all tasks, other shard sizes
    assert note_lines(proc) == [f"note: {out}: replaced an unfinished job with other max_tokens_per_shard (2 of 4 "
                                f"tasks done) by this one"]
    tokenize(data, "-o", tmp_path / "fresh", "--task-bytes", 25_000, "--max-tokens-per-shard", 500, check=True)
    assert same_folder(out, tmp_path / "fresh")
    one_line_error(tokenize(*base), f"{out}: holds a different dataset; pass --overwrite")


def old_rule(plan_or_manifest: dict) -> dict:
    """What nanoset wrote before mask rules were recorded: no mask_rule in the chat options."""
    build = plan_or_manifest["build"]
    del build["chat"]["mask_rule"]
    plan_or_manifest.pop("loss_mask_rule", None)
    return plan_or_manifest


def test_a_chat_job_begun_under_another_mask_rule_is_not_mixed_with_the_new_one(tmp_path):
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    base = ["--chat", "--task-bytes", 20_000]
    tokenize(CHAT, "-o", out, *base, "--num-tasks", 3, "--task-index", 0, check=True)
    plan = out / ".nanoset-work" / "plan.json"
    plan.write_text(json.dumps(old_rule(json.loads(plan.read_text())), sort_keys=True))
    proc = tokenize(CHAT, "-o", out, *base, check=True)
    assert len(note_lines(proc)) == 1 and "with other chat.mask_rule (" in proc.stderr
    tokenize(CHAT, "-o", fresh, *base, check=True)
    assert same_folder(out, fresh)
    manifest = json.loads((out / "nanoset.json").read_text())
    assert manifest["build"]["chat"]["mask_rule"] == 2 and manifest["loss_mask_rule"] == 2
    st = json.loads(run_cli("inspect", out, "--json", "--samples", 0).stdout)
    assert st["loss_mask_rule"] == 2


def test_a_dataset_of_the_old_rule_stays_readable_and_says_so(tmp_path):
    out = tmp_path / "old"
    tokenize(CHAT, "-o", out, "--chat", check=True)
    path = out / "nanoset.json"
    path.write_text(json.dumps(old_rule(json.loads(path.read_text())), indent=1, sort_keys=True) + "\n")
    ds = open_dataset(out)
    assert ds.has_loss_masks and ds.manifest.loss_mask_rule == 1
    text = run_cli("inspect", out, "--samples", 0).stdout
    assert "loss-mask rule 1: a token is trained when its first character lies in an assistant span" in text
    one_line_error(tokenize(CHAT, "-o", out, "--chat"),
                   f"{out}: was made with loss-mask rule 1; this nanoset writes rule 2", "pass --overwrite")
    assert os.path.getsize(path) > 0 and open_dataset(out).manifest.loss_mask_rule == 1


def test_verify_retokenize_of_an_old_rule_dataset_compares_its_ids_not_its_masks(tmp_path, tokenizer):
    """Re-encoding makes masks of today's rule: a sound dataset of rule 1 was reported as 'does not match its
    inputs and tokenizer: re-create it', one line per conversation. Its ids are still compared."""
    import hashlib

    import numpy as np
    from tokenizers import __version__ as tokenizers_version

    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}")
    chats = [{"messages": [{"role": "user", "content": f"Question {i}?"},
                           {"role": "assistant", "content": f"The answer is {i}"}]} for i in range(3)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    out = tmp_path / "old"
    tokenize(tmp_path / "chat.jsonl", "-o", out, "--chat", "--chat-template", template, check=True)
    ds = open_dataset(out)
    loss = np.fromfile(ds.shards[0].loss_path, dtype=np.uint8)
    for d in range(3):  # rule 1: the token merging ': ' 's space with the answer's first word was not trained
        start, stop = ds.document_bounds(d)
        first = start + int(np.flatnonzero(loss[start:stop])[0])
        assert tokenizer.decode([int(ds.tokens(first, first + 1)[0])]) == " The"
        loss[first] = 0
    loss.tofile(ds.shards[0].loss_path)
    manifest = old_rule(json.loads((out / "nanoset.json").read_text()))
    manifest["shards"][0]["sha256"]["loss"] = hashlib.sha256(loss.tobytes()).hexdigest()
    manifest["shards"][0]["loss_tokens"] = int(loss.sum())
    (out / "nanoset.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    proc = run_cli("verify", out, "--retokenize", 3)
    assert proc.stdout.splitlines()[1] == (
        f"OK: {out}: 3 sampled documents re-encoded from their inputs with tokenizers {tokenizers_version}: ids "
        f"identical to the shards (loss masks not compared: made with loss-mask rule 1, this nanoset makes rule 2)")
