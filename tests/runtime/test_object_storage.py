"""Datasets in object storage, against a real S3 server on the loopback (moto's server mode, started here; the client
is not mocked): what a run reads from ``s3://`` is what it reads from a local folder, through a cache smaller than
the data, and each fault is one line naming the URL and its cause."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from nanoset import open_dataset, storage
from nanoset.errors import NanosetError
from nanoset.remote_cache import ShardCache, shard_cache
from runtime.checkpoint.layout import find_checkpoint
from tests.support import CORPUS, TOKENIZER, one_line_error, run_cli
from tests.support.configs import small_config
from tests.support.harness import error_lines, metrics, train_one

pytest.importorskip("moto.server")
pytest.importorskip("obstore")
BUCKET = "nanoset-test"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3 server on 127.0.0.1 (a free port), a bucket in it, and the environment that names it: the endpoint and
    dummy credentials, as a user's environment would; restored afterwards."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing-secret", "AWS_DEFAULT_REGION": "us-east-1",
           "NANOSET_STORAGE_CACHE_DIR": str(tmp_path_factory.mktemp("shard-cache"))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=BUCKET)
    try:
        yield env
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def upload_folder(folder: Path, url: str) -> None:
    for path in sorted(folder.iterdir()):
        if path.is_file():
            storage.upload(path, f"{url}/{path.name}")


@pytest.fixture(scope="module")
def remote_shards(s3, shards):
    for name in ("web", "code"):
        upload_folder(shards / "shards" / name, f"s3://{BUCKET}/shards/{name}")
    return f"s3://{BUCKET}/shards"


def test_training_on_s3_equals_training_on_local_data_through_a_smaller_cache(remote_shards, shards, tmp_path):
    """Same losses and data hashes, step for step; the cache (500 kB) is smaller than the data (1 MB), so shards
    were evicted and fetched again, and what stays is within the limit."""
    cache = tmp_path / "cache"
    local = small_config(tmp_path, tmp_path / "local", dp=1, steps=6, single_stage=True, name="local.yaml")
    train_one(local, cwd=shards)
    remote = small_config(tmp_path, tmp_path / "remote", dp=1, steps=6, single_stage=True, name="remote.yaml",
                          storage={"cache_dir": str(cache), "cache_limit_gb": 0.0005})
    with_dataset(remote, {"dataset_folder": [f"{remote_shards}/web", f"{remote_shards}/code"],
                          "dataset_weights": [0.7, 0.3]})
    train_one(remote, cwd=tmp_path)
    rows = [(r["step"], r["loss"], r["data_hash"]) for r in metrics(tmp_path / "local") if "val" not in r]
    assert rows and rows == [(r["step"], r["loss"], r["data_hash"]) for r in metrics(tmp_path / "remote")
                             if "val" not in r]
    held = [p for p in (cache / "datasets").rglob("*.ds*") if not p.name.endswith(".lock")]
    assert held and sum(p.stat().st_size for p in held) <= 500_000
    assert not [p for p in (cache / "datasets").rglob(".*tmp-*")]  # no download left half done
    # the local run's step-3 checkpoint resumed with its data moved to s3: steps 4-6 as the local run trained them
    moved = small_config(tmp_path, tmp_path / "moved", dp=1, steps=6, single_stage=True, name="moved.yaml",
                         checkpoints={"resume": str(tmp_path / "local" / "checkpoints" / "step-000003")})
    with_dataset(moved, yaml.safe_load(remote.read_text())["data_stages"][0]["data"]["dataset"])
    train_one(moved, cwd=tmp_path)
    assert [(r["step"], r["loss"], r["data_hash"]) for r in metrics(tmp_path / "moved") if "val" not in r] == rows[3:]


def test_reading_equals_local_and_a_damaged_object_is_one_line(remote_shards, shards, s3, tmp_path):
    os.environ["NANOSET_STORAGE_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        local, remote = open_dataset(shards / "shards" / "web"), open_dataset(f"{remote_shards}/web")
        assert remote.fingerprint == local.fingerprint and remote.num_tokens == local.num_tokens
        assert (remote.tokens(0, remote.num_tokens) == local.tokens(0, local.num_tokens)).all()
        assert remote.document_ends.tolist() == local.document_ends.tolist()
        # the same name and size, other bytes: refused before any use, and nothing kept under the file's name
        damaged = tmp_path / "00000_00000.ds"
        data = bytearray((shards / "shards" / "code" / damaged.name).read_bytes())
        data[100] ^= 1
        damaged.write_bytes(bytes(data))
        storage.upload(damaged, f"s3://{BUCKET}/damaged/{damaged.name}")
        for name in ("00000_00000.ds.index", "nanoset.json", "nanoset-shards.bin"):
            storage.upload(shards / "shards" / "code" / name, f"s3://{BUCKET}/damaged/{name}")
        reader = open_dataset(f"s3://{BUCKET}/damaged")
        with pytest.raises(NanosetError) as e:
            reader.tokens(0, 10)
        assert str(e.value).startswith(f"s3://{BUCKET}/damaged/00000_00000.ds: sha256 ")
        assert "differs from the manifest's" in str(e.value) and "\n" not in str(e.value)
        assert not (shard_cache().folder(storage.location(f"s3://{BUCKET}/damaged")) / damaged.name).exists()
    finally:
        os.environ["NANOSET_STORAGE_CACHE_DIR"] = s3["NANOSET_STORAGE_CACHE_DIR"]


def test_a_missing_bucket_a_missing_dataset_and_a_down_server_are_one_line_each(remote_shards, s3, tmp_path):
    cfg = with_dataset(small_config(tmp_path, tmp_path / "run", dp=1, steps=2, single_stage=True),
                       {"dataset_folder": "s3://no-such-bucket/web"})
    proc = train_one(cfg, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert error_lines(proc.stderr) == [
        "error: data_stages[0] (pretrain).data.dataset.dataset_folder: s3://no-such-bucket/web/nanoset.json: the "
        "bucket 'no-such-bucket' does not exist (or is not visible with these credentials)"]
    with pytest.raises(NanosetError, match=rf"^s3://{BUCKET}/nothing: no Nanoset dataset there \(no nanoset.json"):
        open_dataset(f"s3://{BUCKET}/nothing")
    # a server that stays down: the client's bounded retries, one note, then one line; no credential anywhere
    with_dataset(cfg, {"dataset_folder": f"{remote_shards}/web"})
    proc = train_one(cfg, cwd=tmp_path, check=False, env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{_closed_port()}"})
    lines = error_lines(proc.stderr)
    assert proc.returncode == 1 and len(lines) == 1 and "cannot reach the storage" in lines[0], proc.stderr
    assert "testing-secret" not in proc.stderr


def with_dataset(config: Path, dataset: dict) -> Path:
    """``config`` with its one stage's dataset replaced."""
    d = yaml.safe_load(config.read_text())
    d["data_stages"][0]["data"]["dataset"] = dataset
    config.write_text(yaml.safe_dump(d))
    return config


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tokenize_to_s3_writes_what_a_local_tokenize_writes_and_a_rerun_mends_only_what_differs(s3, shards, tmp_path):
    url = f"s3://{BUCKET}/tokenized/web"
    run_cli("tokenize", CORPUS / "web", "-o", url, "--tokenizer", TOKENIZER, "--task-bytes", 100_000, "--quiet",
            env={"NANOSET_STORAGE_CACHE_DIR": str(tmp_path / "cache")})
    local = shards / "shards" / "web"
    names = sorted(p.name for p in local.iterdir() if p.is_file())
    assert storage.list_names(url) == names
    assert all(storage.read_bytes(f"{url}/{name}") == (local / name).read_bytes() for name in names)
    # a damaged object is mended by a rerun (from the staged copy); the others are left as they are
    def modified(name: str):
        where = storage.location(f"{url}/{name}")
        return storage._fs(where).head(where)["last_modified"]

    before = {name: modified(name) for name in names}
    storage.remove(f"{url}/00003_00000.ds")
    proc = run_cli("tokenize", CORPUS / "web", "-o", url, "--tokenizer", TOKENIZER, "--task-bytes", 100_000,
                   "--quiet", env={"NANOSET_STORAGE_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.stdout.startswith(f"{url}: 3,500 documents")
    assert storage.read_bytes(f"{url}/00003_00000.ds") == (local / "00003_00000.ds").read_bytes()
    after = {name: modified(name) for name in names}
    assert [n for n in names if after[n] != before[n]] == ["00003_00000.ds"]
    proc = run_cli("tokenize", CORPUS / "web", "-o", url, "--tokenizer", TOKENIZER, "--num-tasks", 2,
                   "--task-index", 0, check=False)
    one_line_error(proc, f"error: {url}: --num-tasks 2 needs a folder all the machines share")


def test_inspect_and_verify_read_a_url(remote_shards, shards):
    url = f"{remote_shards}/web"
    proc = run_cli("verify", url)
    assert proc.stdout.startswith(f"OK: {url}: 10 shards, 3,500 documents, 340,467 tokens")
    local = json.loads(run_cli("inspect", shards / "shards" / "web", "--json").stdout)
    remote = json.loads(run_cli("inspect", url, "--json").stdout)
    assert remote.pop("path") == url and local.pop("path") == str(shards / "shards" / "web")
    assert remote == local


def test_the_cache_evicts_the_least_recently_used_refuses_a_file_over_its_limit_and_prefetches(remote_shards, s3,
                                                                                                 tmp_path):
    url = storage.location(f"{remote_shards}/web")
    names = ["00000_00000.ds", "00001_00000.ds", "00002_00000.ds"]  # 38,372, 37,970 and 38,118 bytes
    cache = ShardCache(tmp_path / "cache", limit_bytes=80_000)  # two of them
    first, second = (cache.fetch(url / n, storage.size(url / n)) for n in names[:2])
    os.utime(second, ns=(1, 1))  # used longest ago
    cache.fetch(url / names[0], 38_372)  # still there: no download, and now the most recent
    third = cache.fetch(url / names[2], 38_118)
    assert first.exists() and third.exists() and not second.exists()
    with pytest.raises(NanosetError) as e:
        cache.fetch(url / "00007_00000.ds", 223_344)
    assert str(e.value) == (f"{url}/00007_00000.ds: 0.000223 GB, larger than storage.cache_limit_gb (8e-05); raise "
                            f"the limit above the largest shard")
    # the shards that token ranges lie in, fetched in the background in order (here: shards 3 and 4)
    os.environ["NANOSET_STORAGE_CACHE_DIR"] = str(tmp_path / "prefetch")
    try:
        reader = open_dataset(url.url)
        start = int(reader.token_offsets[3]) + 5
        reader.prefetch(np.array([start]), np.array([int(reader.token_offsets[4]) + 5]))
        folder = shard_cache().folder(url)
        wanted = [f"0000{k}_00000.ds{suffix}" for k in (3, 4) for suffix in ("", ".index")]
        for _ in range(600):  # bounded: 60 s
            if all((folder / name).exists() for name in wanted):
                break
            time.sleep(0.1)
        assert sorted(p.name for p in folder.glob("0*") if not p.name.endswith(".lock")) == sorted(wanted)
    finally:
        os.environ["NANOSET_STORAGE_CACHE_DIR"] = s3["NANOSET_STORAGE_CACHE_DIR"]


def test_checkpoints_on_s3_resume_a_killed_run_on_another_machine_and_count_only_once_complete(s3, shards, tmp_path):
    """Checkpoints to ``s3://``: a run killed while saving step 4 resumes on a machine with no local copy from the
    bucket's latest (step 2, downloaded) and trains steps 3-4 as an uninterrupted run does (the resumed run saves
    in the background); a folder whose upload was cut short (no metadata.json) is no checkpoint; ``keep_last``
    prunes in the bucket; ``export`` reads a checkpoint URL."""
    reference = small_config(tmp_path, tmp_path / "reference", dp=1, steps=4, interval=2, single_stage=True,
                             name="reference.yaml")
    train_one(reference, cwd=shards)
    url = f"s3://{BUCKET}/checkpoints/run"
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, steps=4, interval=2, single_stage=True, name="s3.yaml",
                       checkpoints={"checkpoints_path": url, "keep_last": 1})
    killed = train_one(cfg, cwd=shards, env={"NANOSET_FAULT_KILL_IN_CHECKPOINT": "4"}, check=False)
    assert killed.returncode != 0
    assert storage.read_text(f"{url}/latest") == "step-000002\n"
    assert storage.files_under(f"{url}/step-000002") == storage.files_under(tmp_path / "run/checkpoints/step-000002")
    # an upload cut short: some files of step 3, no metadata.json, named by no latest
    storage.upload(tmp_path / "run/checkpoints/step-000002/.metadata", f"{url}/step-000003/.metadata")
    with pytest.raises(NanosetError, match=r"step-000003: no metadata.json; it is not a complete checkpoint"):
        find_checkpoint(f"{url}/step-000003")
    shutil.rmtree(tmp_path / "run")  # another machine: nothing of the run here

    resumed = small_config(tmp_path, tmp_path / "run", dp=1, steps=4, interval=2, single_stage=True, name="s3.yaml",
                           checkpoints={"checkpoints_path": url, "keep_last": 1, "async_save": True})
    out = train_one(resumed, cwd=shards)
    assert "step-000002 at step 2" in out.stdout + out.stderr
    rows = [(r["step"], r["loss"], r["data_hash"]) for r in metrics(tmp_path / "reference") if "val" not in r]
    assert [(r["step"], r["loss"], r["data_hash"]) for r in metrics(tmp_path / "run") if "val" not in r] == rows[2:]
    assert storage.list_names(url) == ["latest", "step-000004"]  # step 2 pruned, and the cut-short step 3
    assert storage.read_text(f"{url}/latest") == "step-000004\n"

    run_cli("export", f"{url}/step-000004", tmp_path / "hf-s3", cwd=shards)
    run_cli("export", tmp_path / "reference/checkpoints/step-000004", tmp_path / "hf-local", cwd=shards)
    assert (tmp_path / "hf-s3/model.safetensors").read_bytes() == (tmp_path / "hf-local/model.safetensors").read_bytes()
    for command in (["evaluate", "--config", reference, "--dataset", shards / "shards" / "web", "--json"],
                    ["explain", "--config", reference, "--step", 4, "--json"]):
        ours = run_cli(*command, "--checkpoint", f"{url}/step-000004", cwd=shards)
        theirs = run_cli(*command, "--checkpoint", tmp_path / "reference/checkpoints/step-000004", cwd=shards)
        assert json.loads(ours.stdout) == json.loads(theirs.stdout)


def test_tokenize_from_s3_inputs_writes_what_a_local_tokenize_of_them_writes(s3, shards, tmp_path):
    """A folder, and a glob, of inputs under ``s3://``: copied into the cache, tokenized to the bytes of a local
    tokenize of the same files (the folder walked, the glob's matches sorted, as locally)."""
    url = f"s3://{BUCKET}/inputs/web"
    upload_folder(CORPUS / "web", url)
    env = {"NANOSET_STORAGE_CACHE_DIR": str(tmp_path / "cache")}
    run_cli("tokenize", url, "-o", tmp_path / "from-folder", "--tokenizer", TOKENIZER, "--task-bytes", 100_000,
            "--quiet", env=env)
    same_output(tmp_path / "from-folder", shards / "shards" / "web", {str(CORPUS / "web"): url})

    run_cli("tokenize", f"{url}/web-00[02].*", "-o", tmp_path / "from-glob", "--tokenizer", TOKENIZER,
            "--task-bytes", 100_000, "--quiet", env=env)
    run_cli("tokenize", CORPUS / "web" / "web-000.jsonl", CORPUS / "web" / "web-002.parquet", "-o",
            tmp_path / "local-glob", "--tokenizer", TOKENIZER, "--task-bytes", 100_000, "--quiet")
    same_output(tmp_path / "from-glob", tmp_path / "local-glob", {str(CORPUS / "web"): url})
    proc = run_cli("tokenize", f"{url}/nothing-*.jsonl", "-o", tmp_path / "none", "--tokenizer", TOKENIZER,
                   check=False, env=env)
    one_line_error(proc, f"error: {url}/nothing-*.jsonl: no object matches it")


def same_output(got: Path, local: Path, urls: dict[str, str]) -> None:
    """``got`` holds the files of ``local``, byte for byte; its manifest names the inputs' URLs where the local one
    names their paths, and is otherwise the same (the shard table is the manifest's shards as columns)."""
    names = sorted(p.name for p in local.iterdir() if p.is_file())
    assert len(names) > 3 and sorted(p.name for p in got.iterdir() if p.is_file()) == names
    assert [n for n in names if (got / n).read_bytes() != (local / n).read_bytes()] == [
        "nanoset-shards.bin", "nanoset.json"]
    expected = (local / "nanoset.json").read_text()
    for path, url in urls.items():
        expected = expected.replace(f'"{path}/', f'"{url}/')
    assert json.loads((got / "nanoset.json").read_text()) == json.loads(expected)
    ours, theirs = open_dataset(got), open_dataset(local)  # the shard table read back: the same documents
    assert ours.fingerprint == theirs.fingerprint and ours.num_tokens == theirs.num_tokens
    assert ours.document_ends.tolist() == theirs.document_ends.tolist()
