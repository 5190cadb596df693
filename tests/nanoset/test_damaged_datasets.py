"""Dataset folders edited by hand or damaged: inspect and verify name the file and the problem in one
line, never a traceback, and an explicit ``--tokenizer`` that cannot be loaded is an error, not ignored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from nanoset.errors import NanosetError
from nanoset.format.open import open_dataset
from nanoset.format.spec import Manifest
from nanoset.stats import SAMPLE_CHARS, collect_stats
from tests.support import TOKENIZER, one_line_error, run_cli


def datatrove_shard(folder: Path, name: str, ends: list[int], tokens: list[int]) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.ds").write_bytes(np.array(tokens, dtype="<u2").tobytes())
    (folder / f"{name}.ds.index").write_bytes(np.array(ends, dtype="<u8").tobytes())
    (folder / f"{name}.ds.metadata").write_text(f"toy|2\n{len(tokens)}\n{len(tokens)}")


@pytest.mark.parametrize("ends", [[3, 3, 5], [4, 2, 5]])
def test_inspect_names_an_index_whose_ends_do_not_increase(tmp_path, ends):
    # an empty or backwards document made log2 of a length ≤ 0 and np.bincount raised a ValueError
    datatrove_shard(tmp_path / "d", "a", ends, [1, 2, 0, 3, 0])
    one_line_error(run_cli("inspect", tmp_path / "d", check=False),
                   f"{tmp_path / 'd' / 'a.ds.index'}: document ends not strictly increasing at document 1; "
                   f"the shard is corrupt (run `nanoset verify {tmp_path / 'd'}`)")


def test_inspect_of_a_folder_without_documents(tmp_path):
    datatrove_shard(tmp_path / "d", "a", [], [])  # samples of no documents picked document -1
    stats = collect_stats(tmp_path / "d", samples=2)
    assert (stats["num_documents"], stats["num_tokens"], stats["samples"], stats["max_token_id"]) == (0, 0, [], -1)


def test_explicit_tokenizer_that_cannot_be_loaded_is_an_error(tmp_path, fixture_dataset):
    missing = tmp_path / "nope" / "tokenizer.json"
    one_line_error(run_cli("inspect", fixture_dataset, "--tokenizer", missing, check=False),
                   f"tokenizer '{missing}': no such file or folder")
    moved = tmp_path / "copy"
    shutil.copytree(fixture_dataset, moved)  # the recorded tokenizer, when gone, only means no decoding
    manifest = json.loads((moved / "nanoset.json").read_text())
    manifest["tokenizer"]["path"] = str(missing)
    (moved / "nanoset.json").write_text(json.dumps(manifest))
    assert "ids" in collect_stats(moved, samples=1)["samples"][0]


@pytest.mark.parametrize("edit, error", [
    (lambda d: [1, 2], "malformed manifest (a JSON list, not an object)"),
    (lambda d: {k: v for k, v in d.items() if k != "tokenizer"}, "malformed manifest (KeyError: 'tokenizer')"),
    (lambda d: {**d, "shards": [{**d["shards"][0], "extra": 1}]}, "unexpected keyword argument 'extra'"),
    (lambda d: {**d, "shards": [{**d["shards"][0], "num_tokens": None}]},
     "malformed manifest (TypeError: shard '00000_00000': name, num_tokens or num_documents is not"),
])
def test_malformed_manifest_is_one_line(tmp_path, fixture_dataset, edit, error):
    folder = tmp_path / "copy"
    shutil.copytree(fixture_dataset, folder)
    path = folder / "nanoset.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    with pytest.raises(NanosetError, match=f"^{path}: .*re-run `nanoset tokenize`$") as e:
        Manifest.load(folder)
    assert error in str(e.value)
    one_line_error(run_cli("verify", folder, check=False), f"{path}: ", error)


def test_samples_are_not_decoded_with_a_changed_tokenizer(tmp_path, fixture_dataset, tokenizer):
    """The manifest records the tokenizer's path and sha256: another file at that path (a retrained or
    edited tokenizer) decoded the ids into the wrong text without a word."""
    folder = tmp_path / "copy"
    shutil.copytree(fixture_dataset, folder)
    other = tmp_path / "tok" / "tokenizer.json"
    other.parent.mkdir()
    other.write_text(json.dumps({**json.loads((Path(TOKENIZER) / "tokenizer.json").read_text()), "normalizer": None}))
    manifest = json.loads((folder / "nanoset.json").read_text())
    manifest["tokenizer"]["path"] = str(other)
    (folder / "nanoset.json").write_text(json.dumps(manifest))
    sample = collect_stats(folder, samples=1)["samples"][0]
    assert "text" not in sample and sample["undecoded"] == (
        f"{other} is not the tokenizer the data was made with (sha256 differs): pass --tokenizer to decode")
    decoded = collect_stats(folder, samples=1, tokenizer=str(TOKENIZER))["samples"][0]
    ids = open_dataset(folder).document(0).tolist()
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert decoded["text"] == text[:SAMPLE_CHARS] + ("…" if len(text) > SAMPLE_CHARS else "")


def test_more_samples_than_documents(tmp_path):
    datatrove_shard(tmp_path / "d", "a", [3, 5], [1, 2, 0, 3, 0])
    stats = collect_stats(tmp_path / "d", samples=10**12)  # linspace of 10^12 positions: out of memory
    assert [(s["document"], s["ids"]) for s in stats["samples"]] == [(0, [1, 2, 0]), (1, [3, 0])]


def test_verify_names_a_missing_metadata_file_as_missing(tmp_path, fixture_dataset):
    """Every other shard file that is gone is 'missing; the dataset is incomplete'; the metadata file was a bare
    '[Errno 2] No such file or directory' from the checksum read."""
    folder = tmp_path / "copy"
    shutil.copytree(fixture_dataset, folder)
    (folder / "00000_00000.ds.metadata").unlink()
    one_line_error(run_cli("verify", folder, check=False),
                   f"error: {folder / '00000_00000.ds.metadata'}: missing; the dataset is incomplete (re-run "
                   f"`nanoset tokenize`)")
