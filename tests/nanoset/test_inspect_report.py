"""What ``inspect`` says: cut samples end with "…", a ``--tokenizer`` that is not the data's says so, the
header names the tokenizer as a name, the rows ``--skip-bad-lines`` skipped are shown (and all listed in
the dataset folder), and the tokenizer recorded by a relative ``--tokenizer`` decodes from anywhere."""

from __future__ import annotations

import json

from tokenizers import Tokenizer, models, pre_tokenizers

from nanoset import open_dataset
from nanoset.stats import SAMPLE_CHARS, collect_stats
from tests.support import ROOT, TOKENIZER, run_cli


def test_a_cut_sample_ends_with_an_ellipsis(tmp_path, tokenizer):
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps({"text": "word " * 300}) + "\n" + json.dumps({"text": "short"}) + "\n")
    run_cli("tokenize", data, "-o", tmp_path / "out", "--tokenizer", TOKENIZER, "--quiet")
    long, short = collect_stats(tmp_path / "out", samples=2)["samples"]
    full = tokenizer.decode(open_dataset(tmp_path / "out").document(0).tolist(), skip_special_tokens=False)
    assert long["text"] == full[:SAMPLE_CHARS] + "…" and short["text"] == "short<|endoftext|>"


def test_another_tokenizer_is_named_in_a_word(tmp_path, fixture_dataset):
    small = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    small.pre_tokenizer = pre_tokenizers.Whitespace()
    small.save(str(tmp_path / "small.json"))
    st = collect_stats(fixture_dataset, samples=1, tokenizer=str(tmp_path / "small.json"))
    largest = st["max_token_id"]
    assert st["decoder_warning"] == (f"--tokenizer {tmp_path / 'small.json'} has 2 ids, but the data holds id "
                                     f"{largest:,}: it is not the tokenizer the data was made with, the samples are "
                                     f"garbage")
    assert f"  warning: --tokenizer {tmp_path / 'small.json'} has 2 ids" in run_cli(
        "inspect", fixture_dataset, "--tokenizer", tmp_path / "small.json", "--samples", 1).stdout
    # large enough for the ids, but another vocabulary size: said too
    big = json.loads((TOKENIZER / "tokenizer.json").read_text())
    big["model"]["vocab"]["zzzzqq"] = len(big["model"]["vocab"]) + len(big["added_tokens"])
    (tmp_path / "big.json").write_text(json.dumps(big))
    vocab = st["vocab_size"]
    assert collect_stats(fixture_dataset, samples=1, tokenizer=str(tmp_path / "big.json"))["decoder_warning"] == (
        f"--tokenizer {tmp_path / 'big.json'} has {vocab + 1:,} ids, the data's tokenizer {vocab:,}: another "
        f"vocabulary, the samples are likely garbage")
    assert collect_stats(fixture_dataset, samples=1, tokenizer=str(TOKENIZER))["decoder_warning"] is None


def test_header_quotes_the_tokenizer_name(fixture_dataset):
    out = run_cli("inspect", fixture_dataset, "--samples", 0).stdout.splitlines()
    assert out[2].startswith("  dtype uint16   tokenizer 'tokenizer'   vocab ")


def test_skipped_rows_are_shown_and_listed(tmp_path):
    data = tmp_path / "a.jsonl"
    lines = [json.dumps({"text": f"row {i}"}) for i in range(40)]
    for i in (3, 9, 17, 21, 30, 33, 38):
        lines[i] = '{"text": broken' if i % 2 else '{"text": 5}'
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    proc = run_cli("tokenize", data, "-o", out, "--tokenizer", TOKENIZER, "--quiet", "--skip-bad-lines",
                   "--task-bytes", 300)
    why = {True: "malformed JSON (Expecting value at column 10)", False: "column 'text' is int, not text"}
    listed = [f"{data}:{i + 1}: {why[bool(i % 2)]}" for i in (3, 9, 17, 21, 30, 33, 38)]
    assert proc.stdout.splitlines()[1:] == [f"  the first rows skipped (all 7 in {out / 'nanoset-skipped.txt'}):",
                                            *[f"    {e}" for e in listed[:5]]]
    assert (out / "nanoset-skipped.txt").read_text() == "".join(e + "\n" for e in listed)
    assert json.loads((out / "nanoset.json").read_text())["skipped_examples"] == listed[:5]
    text = run_cli("inspect", out, "--samples", 0).stdout
    assert (f"  skipped bad lines while tokenizing: 7 (all of them in {out / 'nanoset-skipped.txt'}); the first:\n"
            + "".join(f"    {e}\n" for e in listed[:5])) in text
    assert run_cli("verify", out).stdout.startswith("OK")
    run_cli("tokenize", tmp_path / "a.jsonl", "-o", out, "--tokenizer", TOKENIZER, "--quiet", "--skip-bad-lines",
            "--overwrite")  # one task now: the same list
    assert (out / "nanoset-skipped.txt").read_text() == "".join(e + "\n" for e in listed)
    data.write_text("\n".join(json.dumps({"text": f"row {i}"}) for i in range(3)) + "\n")
    run_cli("tokenize", data, "-o", out, "--tokenizer", TOKENIZER, "--quiet", "--overwrite")
    assert not (out / "nanoset-skipped.txt").exists()


def test_a_relative_tokenizer_path_still_decodes_from_another_folder(tmp_path):
    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps({"text": "hello world"}) + "\n")
    run_cli("tokenize", data, "-o", tmp_path / "out", "--tokenizer", "data_fixtures/tokenizer", "--quiet", cwd=ROOT)
    manifest = json.loads((tmp_path / "out" / "nanoset.json").read_text())
    assert manifest["tokenizer"]["path"] == str(TOKENIZER / "tokenizer.json")
    st = json.loads(run_cli("inspect", tmp_path / "out", "--json", "--samples", 1, cwd=tmp_path).stdout)
    assert st["samples"][0]["text"] == "hello world<|endoftext|>"
