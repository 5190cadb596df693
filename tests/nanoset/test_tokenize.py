"""`nanoset tokenize`: exact token stream, worker-independence, resume after SIGKILL, sharding."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from nanoset import open_dataset
from tests.support import CORPUS, TOKENIZER, run_cli
from tests.support.datasets import big_corpus, same_folder


def test_stream_equals_direct_encode_plus_eos(fixture_dataset, reference_docs):
    ds = open_dataset(fixture_dataset)
    assert ds.num_documents == len(reference_docs) == 9020
    expected = np.concatenate(reference_docs)
    np.testing.assert_array_equal(ds.tokens(0, ds.num_tokens), expected)
    for i in (0, 19, 20, 4520, 9019):
        np.testing.assert_array_equal(ds.document(i), reference_docs[i])
    assert len(ds.shards) > 3  # several tasks made several shards
    assert sorted(s.name for s in ds.shards) == [s.name for s in ds.shards]


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_give_byte_identical_folders(tmp_path, fixture_dataset, workers):
    out = tmp_path / f"w{workers}"
    run_cli("tokenize", CORPUS, "-o", out, "--tokenizer", TOKENIZER, "--task-bytes", 200_000,
            "--workers", workers, "--quiet")
    assert same_folder(fixture_dataset, out)


def test_task_split_across_machines_merges_identically(tmp_path, fixture_dataset):
    out = tmp_path / "split"
    args = ["tokenize", CORPUS, "-o", out, "--tokenizer", TOKENIZER, "--task-bytes", 200_000, "--quiet"]
    first = run_cli(*args, "--num-tasks", 3, "--task-index", 2)
    assert "partial" in first.stdout and not (out / "nanoset.json").exists()
    run_cli(*args, env={"WORLD_SIZE": "3", "RANK": "0"})
    last = run_cli(*args, "--num-tasks", 3, "--task-index", 1)
    assert "complete" in last.stdout
    assert same_folder(fixture_dataset, out)


def test_max_tokens_per_shard(tmp_path, fixture_dataset):
    out = tmp_path / "small"
    run_cli("tokenize", CORPUS, "-o", out, "--tokenizer", TOKENIZER, "--max-tokens-per-shard", 20_000, "--quiet")
    ds, ref = open_dataset(out), open_dataset(fixture_dataset)
    assert all(s.num_tokens <= 20_000 for s in ds.shards) and len(ds.shards) >= 26
    np.testing.assert_array_equal(ds.tokens(0, ds.num_tokens), ref.tokens(0, ref.num_tokens))


def test_rerun_of_complete_dataset_is_a_no_op(fixture_dataset):
    before = {p.name: p.stat().st_mtime_ns for p in fixture_dataset.iterdir()}
    proc = run_cli("tokenize", CORPUS, "-o", fixture_dataset, "--tokenizer", TOKENIZER, "--task-bytes", 200_000,
                   "--quiet")
    assert "ran 0 of" in proc.stdout
    assert {p.name: p.stat().st_mtime_ns for p in fixture_dataset.iterdir()} == before


def test_hf_saved_dataset_input(tmp_path, tokenizer, eos_id):
    datasets = pytest.importorskip("datasets")
    texts = ["first document", "second one", "third: with more words"]
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"content": texts[:2]}),
        "test": datasets.Dataset.from_dict({"content": texts[2:]}),
    }).save_to_disk(str(tmp_path / "hf"))
    run_cli("tokenize", tmp_path / "hf", "-o", tmp_path / "out", "--tokenizer", TOKENIZER,
            "--text-column", "content", "--quiet")
    ds = open_dataset(tmp_path / "out")
    assert [ds.document(i).tolist() for i in range(3)] == [tokenizer.encode(t).ids + [eos_id] for t in texts]


def test_sigkill_then_rerun_equals_uninterrupted(tmp_path):
    corpus = big_corpus(tmp_path / "corpus")
    args = [corpus, "--tokenizer", TOKENIZER, "--task-bytes", 150_000, "--workers", "2", "--quiet"]
    run_cli("tokenize", *args[:1], "-o", tmp_path / "clean", *args[1:])

    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "nanoset.cli", "tokenize", str(corpus), "-o", str(out),
                             *map(str, args[1:])], start_new_session=True)
    markers = out / ".nanoset-work"
    deadline = time.time() + 60
    while len(list(markers.glob("task-*.json"))) < 4 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = sorted(markers.glob("task-*.json"))
    assert 4 <= len(done) and not (out / "nanoset.json").exists()
    # no file with a final name is partial: each .ds matches its metadata and index
    for ds_file in out.glob("*.ds"):
        count = int((out / (ds_file.name + ".metadata")).read_text().splitlines()[1])
        assert ds_file.stat().st_size == 2 * count
        assert int(np.fromfile(out / (ds_file.name + ".index"), "<u8")[-1]) == count
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("*.ds")
            if any(p.name.startswith(m.stem[5:].lstrip("0").zfill(5)) for m in done)}
    assert len(kept) >= 4

    rerun = run_cli("tokenize", corpus, "-o", out, *args[1:])
    assert f"({len(done)} already done)" in rerun.stdout
    assert same_folder(tmp_path / "clean", out)
    for name, mtime in kept.items():  # completed work was not redone
        assert (out / name).stat().st_mtime_ns == mtime
