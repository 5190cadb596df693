"""Readers hold a bounded number of open files and memory maps, whatever the number of shards.

A dataset of 5,000 tiny shards is opened (as a datatrove folder, then as a Nanoset folder), read
in full, inspected and verified, and trained from through loader workers - all in a process
limited to 256 open files (``ulimit -n 256``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from tests.support import ROOT

NUM_SHARDS = 5000


def shard_docs(k: int) -> list[list[int]]:
    """Shard ``k``: two documents whose ids say which shard they are from."""
    return [[1 + (7 * k) % 8000, 1 + k % 97, 0], [1 + (3 * k) % 8100, 0]]


def write_raw_shards(folder: Path) -> None:
    """The three datatrove files per shard, written directly (no fsync: 15,000 files in a second)."""
    folder.mkdir()
    for k in range(NUM_SHARDS):
        docs = shard_docs(k)
        tokens = np.concatenate([np.array(d, dtype="<u2") for d in docs])
        ends = np.cumsum([len(d) for d in docs]).astype("<u8")
        (folder / f"{k:05d}.ds").write_bytes(tokens.tobytes())
        (folder / f"{k:05d}.ds.index").write_bytes(ends.tobytes())
        (folder / f"{k:05d}.ds.metadata").write_text(f"toy|2\n{len(tokens)}\n{len(tokens)}")


def write_manifest_for(folder: Path) -> None:
    from nanoset import Manifest, ShardInfo, TokenizerInfo, write_manifest

    shards = []
    for k in range(NUM_SHARDS):
        sha = {role: hashlib.sha256((folder / f"{k:05d}{suffix}").read_bytes()).hexdigest()
               for role, suffix in (("ds", ".ds"), ("index", ".ds.index"), ("metadata", ".ds.metadata"))}
        flat = [t for d in shard_docs(k) for t in d]
        shards.append(ShardInfo(f"{k:05d}", 5, 2, sha, max_token_id=max(flat)))
    write_manifest(folder, Manifest(TokenizerInfo("toy", 8192, eos_id=0), "uint16", shards))


SCRIPT = textwrap.dedent('''
    import json, os, resource, sys
    import numpy as np

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    sys.path.insert(0, {tests!r})
    from tests.nanoset.test_reader_limits import NUM_SHARDS, shard_docs
    from nanoset import open_dataset
    from nanoset.stats import collect_stats
    from nanoset.verify import verify_dataset

    def fds():
        return len(os.listdir("/proc/self/fd"))

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    folder = sys.argv[1]
    docs = [np.array(d) for k in range(NUM_SHARDS) for d in shard_docs(k)]
    stream = np.concatenate(docs)
    fd0, map0 = fds(), maps()
    ds = open_dataset(folder)
    assert ds.num_tokens == len(stream) and ds.num_documents == len(docs)
    assert np.array_equal(ds.tokens(0, ds.num_tokens), stream)
    assert all(np.array_equal(ds.document(i), docs[i]) for i in range(len(docs)))
    assert all(ds.document_at(int(p)) == i for i, p in enumerate(np.cumsum([len(d) for d in docs]) - 1))
    stats = collect_stats(folder, samples=2)
    report = verify_dataset(folder)
    print(json.dumps({{"fd_growth": fds() - fd0, "map_growth": maps() - map0,
                      "num_shards": stats["num_shards"], "max_token_id": stats["max_token_id"],
                      "verify": report}}))
''')


def run_script(template: str, folder: Path, tmp_path: Path) -> str:
    """Run ``template`` (formatted with the tests folder) as a script on ``folder``, 16 shards mapped at most;
    returns its stdout."""
    script = tmp_path / "script.py"
    script.write_text(template.format(tests=str(ROOT)))
    proc = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "NANOSET_MAX_OPEN_SHARDS": "16",
                               "NANOSET_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def run_limited(folder: Path, tmp_path: Path) -> dict:
    return json.loads(run_script(SCRIPT, folder, tmp_path).strip().splitlines()[-1])


def test_5000_shards_under_ulimit_256(tmp_path):
    folder = tmp_path / "many"
    write_raw_shards(folder)
    expected_max = max(t for k in range(NUM_SHARDS) for d in shard_docs(k) for t in d)
    for kind in ("datatrove", "nanoset"):
        if kind == "nanoset":
            write_manifest_for(folder)
        got = run_limited(folder, tmp_path)
        assert got["num_shards"] == NUM_SHARDS and got["max_token_id"] == expected_max
        assert got["verify"].startswith(f"OK: {folder}: {NUM_SHARDS} shards, 10,000 documents, 25,000 tokens")
        # 16 shards × (tokens + index) maps at most; before, every shard touched kept two fds and two maps
        assert got["fd_growth"] <= 32 + 4, got
        assert got["map_growth"] <= 32 + 40, got


LOADER_SCRIPT = textwrap.dedent('''
    import multiprocessing, resource, sys
    import numpy as np

    if __name__ == "__main__":
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        multiprocessing.set_start_method("forkserver")  # workers unpickle the dataset: readers reopen there
        sys.path.insert(0, {tests!r})
        from tests.support.data import stage_loader
        from tests.support.configs import make_config
        from tests.nanoset.test_reader_limits import NUM_SHARDS, shard_docs
        from runtime.data import DataPlan

        folder, L, G = sys.argv[1], 16, 8
        stream = np.concatenate([np.array(d) for k in range(NUM_SHARDS) for d in shard_docs(k)])
        steps = -(-((len(stream) - 1) // L) // G)  # one full epoch: every window, so every shard
        stage = {{"name": "s", "start_training_step": 1,
                  "data": {{"use_position_ids": True, "dataset": {{"dataset_folder": folder}}}}}}
        plan = DataPlan(make_config(dp=1, accum=1, mbs=G, train_steps=steps, seq=L, stages=[stage]))
        seen = set()
        for step, batch in enumerate(stage_loader(plan, plan.stages[0], 0, 1, workers=2), start=1):
            _, loc = plan.global_batch(step)
            want = np.stack([stream[s * L : s * L + L + 1] for s in loc.sample.tolist()])
            got = np.concatenate([batch["input_ids"].numpy(), batch["label_ids"].numpy()[:, -1:]], axis=1)
            assert np.array_equal(got, want), step
            seen.update(loc.sample.tolist())
        print(len(seen), steps)
''')


def test_loader_workers_read_5000_shards_under_ulimit_256(tmp_path):
    folder = tmp_path / "many"
    write_raw_shards(folder)  # a datatrove folder: validation also scans all 5,000 shards for the largest id
    stdout = run_script(LOADER_SCRIPT, folder, tmp_path)
    windows = (NUM_SHARDS * 5 - 1) // 16
    assert stdout.split() == [str(windows), str(-(-windows // 8))]


def test_views_outlive_eviction_and_pickled_readers_reopen(tmp_path):
    import pickle

    from nanoset import open_dataset
    from nanoset.format.mapcache import DEFAULT_MAX_OPEN_SHARDS, set_max_open_shards, shared_cache

    folder = tmp_path / "three"
    folder.mkdir()
    for k in range(3):
        (folder / f"{k}.ds").write_bytes(np.array([10 + k, 20 + k, 0], dtype="<u2").tobytes())
        (folder / f"{k}.ds.index").write_bytes(np.array([3], dtype="<u8").tobytes())
        (folder / f"{k}.ds.metadata").write_text("toy|2\n3\n3")
    set_max_open_shards(1)
    try:
        ds = open_dataset(folder)
        first = ds.tokens(0, 3)  # a view into shard 0's map
        assert ds.tokens(3, 9).tolist() == [11, 21, 0, 12, 22, 0] and len(shared_cache()) == 2
        assert first.tolist() == [10, 20, 0]  # shard 0 was evicted; its view still reads its map
        copy = pickle.loads(pickle.dumps(ds))
        assert [s._map_keys for s in copy.shards] != [s._map_keys for s in ds.shards]
        assert copy.tokens(0, 9).tolist() == [10, 20, 0, 11, 21, 0, 12, 22, 0]
        assert copy.document(2).tolist() == [12, 22, 0]
    finally:
        set_max_open_shards(DEFAULT_MAX_OPEN_SHARDS)


def test_default_open_shards_follow_a_low_ulimit(tmp_path):
    """With no NANOSET_MAX_OPEN_SHARDS, ``ulimit -n 64`` is enough to inspect and verify 300 shards (the fixed
    default of 64 shards kept 128 descriptors); forcing 64 shards there is one line naming what to change."""
    import resource

    folder = tmp_path / "three-hundred"
    folder.mkdir()
    for k in range(300):
        (folder / f"{k:03d}.ds").write_bytes(np.array([1 + k, 0], dtype="<u2").tobytes())
        (folder / f"{k:03d}.ds.index").write_bytes(np.array([2], dtype="<u8").tobytes())
        (folder / f"{k:03d}.ds.metadata").write_text("toy|2\n2\n2")

    def nanoset(*args, **env):
        env = {**{k: v for k, v in os.environ.items() if k != "NANOSET_MAX_OPEN_SHARDS"}, **env}
        return subprocess.run([sys.executable, "-m", "nanoset.cli", *args], capture_output=True, text=True, env=env,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))

    verified = nanoset("verify", str(folder))
    assert verified.returncode == 0, verified.stderr[-2000:]
    assert verified.stdout.startswith(f"OK: {folder}: 300 shards, 300 documents, 600 tokens, largest id 300")
    inspected = nanoset("inspect", str(folder), "--json")
    assert inspected.returncode == 0 and json.loads(inspected.stdout)["max_token_id"] == 300, inspected.stderr[-2000:]
    forced = nanoset("verify", str(folder), NANOSET_MAX_OPEN_SHARDS="64")
    lines = forced.stderr.strip().splitlines()
    assert forced.returncode == 1 and len(lines) == 1, forced.stderr[-2000:]
    assert lines[0].endswith("cannot map it (Too many open files): set $NANOSET_MAX_OPEN_SHARDS lower (shards kept "
                             "mapped, now 64) or raise `ulimit -n`"), lines[0]
