"""`nanoset inspect --json` gives exact values; `nanoset verify` catches corruption."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.support import run_cli


def test_inspect_json_exact(fixture_dataset, reference_docs, tokenizer, eos_id):
    st = json.loads(run_cli("inspect", fixture_dataset, "--json", "--samples", 3).stdout)
    lengths = np.array([len(d) for d in reference_docs])
    assert st["num_tokens"] == int(lengths.sum()) and st["num_documents"] == len(reference_docs)
    assert st["dtype"] == "uint16" and st["vocab_size"] == tokenizer.get_vocab_size() and st["eos_id"] == eos_id
    assert st["num_shards"] == len(st["shards"]) and sum(s["num_tokens"] for s in st["shards"]) == st["num_tokens"]
    assert st["max_token_id"] == int(np.concatenate(reference_docs).max())
    q = np.percentile(lengths, [50, 90, 99], method="lower")
    assert st["document_length"] == {"min": int(lengths.min()), "median": int(q[0]), "p90": int(q[1]),
                                     "p99": int(q[2]), "max": int(lengths.max()),
                                     "mean": round(float(lengths.mean()), 2)}
    assert sum(h["count"] for h in st["histogram"]) == len(reference_docs)
    assert [s["document"] for s in st["samples"]] == [0, 4510, 9019]
    assert st["samples"][1]["text"] == tokenizer.decode(reference_docs[4510].tolist(), skip_special_tokens=False)


def test_inspect_text_report(fixture_dataset):
    out = run_cli("inspect", fixture_dataset).stdout
    assert "documents 9,020" in out and "document length (tokens):" in out and "--- document 0 " in out


@pytest.fixture
def copy(fixture_dataset, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(fixture_dataset, dst)
    return dst


def first_shard(folder):
    return sorted(folder.glob("*.ds"))[0]


def verify_fails(folder, *fragments):
    proc = run_cli("verify", folder, check=False)
    assert proc.returncode == 1, proc.stdout
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1
    for f in fragments:
        assert f in line, line


def test_verify_ok(fixture_dataset):
    assert run_cli("verify", fixture_dataset).stdout.startswith(f"OK: {fixture_dataset}: ")


def test_verify_catches_flipped_byte(copy):
    ds = first_shard(copy)
    data = bytearray(ds.read_bytes())
    data[101] ^= 0x01
    ds.write_bytes(bytes(data))
    verify_fails(copy, f"{ds}: sha256", "differs from the manifest")


def test_verify_catches_truncated_ds(copy):
    ds = first_shard(copy)
    ds.write_bytes(ds.read_bytes()[:-2])
    verify_fails(copy, str(ds), "expected")


def test_verify_catches_broken_index(copy):
    index = copy / (first_shard(copy).name + ".index")
    ends = np.fromfile(index, "<u8")
    ends[5], ends[6] = ends[6], ends[5]
    ends.tofile(index)
    # also refresh the manifest checksum so that the structural check itself is what fires
    manifest = json.loads((copy / "nanoset.json").read_text())
    import hashlib
    manifest["shards"][0]["sha256"]["index"] = hashlib.sha256(index.read_bytes()).hexdigest()
    (copy / "nanoset.json").write_text(json.dumps(manifest))
    verify_fails(copy, str(index), "not strictly increasing at document 6")


def test_verify_catches_missing_eos_and_big_ids(tmp_path):
    from nanoset import Manifest, ShardWriter, TokenizerInfo, write_manifest

    for case, doc, msg in (("eos", [3, 4], "ends with token 4, not EOS 0"), ("vocab", [900, 0], "token id 900")):
        folder = tmp_path / case
        with ShardWriter(folder, "s", np.uint16, "toy") as w:
            w.add_document(doc)
            info = w.finalize()
        write_manifest(folder, Manifest(TokenizerInfo("toy", 500, eos_id=0), "uint16", [info]))
        verify_fails(folder, msg)


def test_verify_checks_the_recorded_largest_id(copy):
    manifest = json.loads((copy / "nanoset.json").read_text())
    shard = manifest["shards"][0]
    actual = int(np.fromfile(copy / (shard["name"] + ".ds"), dtype="<u2").max())
    assert shard["max_token_id"] == actual  # tokenize records it per shard
    shard["max_token_id"] = actual - 1
    (copy / "nanoset.json").write_text(json.dumps(manifest))
    verify_fails(copy, f"{copy / shard['name']}.ds: largest token id {actual} differs from the manifest's {actual - 1}")


def test_verify_retokenize_names_tokens_registered_since_the_dataset_was_made(tmp_path):
    """tokenizer_config.json edited after tokenizing (a token added): tokenizer.json's sha256 still matched, so
    every document holding the token's text was a mismatch, with 're-create it' as the advice."""
    from tests.support import TOKENIZER, one_line_error

    folder = tmp_path / "tok"
    shutil.copytree(TOKENIZER, folder)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": f"call <tool> {i}"}) + "\n" for i in range(4)))
    run_cli("tokenize", tmp_path / "in.jsonl", "-o", tmp_path / "out", "--tokenizer", folder, "--quiet")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "extra_special_tokens": ["<tool>"]}))
    one_line_error(run_cli("verify", tmp_path / "out", "--retokenize", 4, check=False),
                   f"cannot re-encode: the tokens registered from the files beside {folder / 'tokenizer.json'} "
                   f"changed since the dataset was made (now '<tool>', then none); --retokenize needs the tokenizer "
                   f"that made it")
