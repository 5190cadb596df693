"""The shard table (``nanoset-shards.bin``): written beside the manifest by tokenize, convert and write_manifest,
read instead of the manifest's JSON, tied to it by the manifest's sha256; a folder without one (written before
tables existed) gets one at its first open, in the folder or, read-only, in the user cache; a stale, damaged or
foreign table is never trusted; ``verify`` compares the table with the manifest."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from contextlib import contextmanager

import numpy as np
import pytest

from nanoset import Manifest, open_dataset, write_manifest
from nanoset.convert import convert
from nanoset.format import shardtable, writer
from nanoset.format.spec import MANIFEST_NAME, SHARD_TABLE_NAME, UNRECORDED
from tests.nanoset.test_reader_startup import many_shards
from tests.support import one_line_error, run_cli
from tests.support.datasets import write_datatrove


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSET_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def manifest_rows(folder) -> list[tuple]:
    """Each shard as the manifest's JSON says (read with json.loads, independently of nanoset)."""
    d = json.loads((folder / MANIFEST_NAME).read_text())
    return [(s["name"], s["num_tokens"], s["num_documents"], s.get("max_token_id", UNRECORDED),
             s.get("loss_tokens", UNRECORDED)) for s in d["shards"]]


def table_rows(manifest: Manifest) -> list[tuple]:
    t = manifest.table
    return list(zip(t.names, *(getattr(t, c).tolist() for c in shardtable.COLUMNS)))


def decoded(table_file, folder) -> Manifest | None:
    """The table file decoded against the folder's manifest as it is now (None: not valid for it)."""
    with open(folder / MANIFEST_NAME, "rb") as f:
        size, sha = shardtable.manifest_stamp(f)
    return shardtable.decode_table(table_file.read_bytes(), folder / MANIFEST_NAME, size, sha, table_file)


@pytest.fixture
def parses(monkeypatch) -> list:
    """The manifest parses made (each a path): none where a table is read."""
    made = []
    real = shardtable.read_manifest

    def counting(path, f):
        made.append(path)
        return real(path, f)

    monkeypatch.setattr(shardtable, "read_manifest", counting)
    return made


def reference_values(folder) -> tuple:
    ds = open_dataset(folder)
    return (ds.num_tokens, ds.num_documents, ds.max_token_id, ds.fingerprint, [s.name for s in ds.shards],
            ds.tokens(0, ds.num_tokens).tolist())


def test_tokenize_writes_the_table_and_it_lists_exactly_what_the_manifest_lists(fixture_dataset, parses):
    table = decoded(fixture_dataset / SHARD_TABLE_NAME, fixture_dataset)
    assert table is not None and table_rows(table) == manifest_rows(fixture_dataset) and len(table.shards) > 3
    ds = open_dataset(fixture_dataset)
    assert parses == [] and ds.manifest.shards.table_file == fixture_dataset / SHARD_TABLE_NAME
    whole = json.loads((fixture_dataset / MANIFEST_NAME).read_text())
    assert (ds.num_tokens, ds.num_documents) == (whole["num_tokens"], whole["num_documents"])
    assert (ds.manifest.tokenizer.sha256, ds.manifest.build, ds.manifest.encoders) == (
        whole["tokenizer"]["sha256"], whole["build"], whole["encoders"])
    assert ds.manifest.shards[2].sha256 == whole["shards"][2]["sha256"]  # the full records: from the JSON


def test_convert_writes_the_table(tmp_path, parses):
    write_datatrove(tmp_path / "dt", [[[5, 6, 0], [7, 0]], [[8, 9, 0]]])
    convert(tmp_path / "dt", tmp_path / "out")
    table = decoded(tmp_path / "out" / SHARD_TABLE_NAME, tmp_path / "out")
    assert table_rows(table) == manifest_rows(tmp_path / "out") == [("000", 5, 2, 7, UNRECORDED),
                                                                      ("001", 3, 1, 9, UNRECORDED)]
    ds = open_dataset(tmp_path / "out")
    assert parses == [] and ds.tokens(0, 8).tolist() == [5, 6, 0, 7, 0, 8, 9, 0]


def test_opening_many_shards_parses_no_json_and_stats_no_shard_file(tmp_path, parses, monkeypatch):
    """The two costs of 100,000 shards: the manifest's parse (~1.5 s) and 200,000 stats (0.3-0.6 s)."""
    infos = many_shards(tmp_path / "d", 3000)
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda *a, **k: stats.append(a[0]) or real_stat(*a, **k))
    ds = open_dataset(tmp_path / "d")
    assert parses == [] and len(stats) < 10, stats[:20]
    assert ds.num_documents == 3000 and ds.max_token_id == 500 and ds.document(2999).tolist() == [2999 % 500 + 1, 7, 0]
    assert table_rows(ds.manifest) == [(s.name, 3, 1, s.max_token_id, UNRECORDED) for s in infos]


def test_an_older_folder_gets_its_table_at_first_open_the_same_bytes_tokenize_writes(tmp_path, parses):
    folder = tmp_path / "d"
    many_shards(folder, 40)
    written = (folder / SHARD_TABLE_NAME).read_bytes()
    (folder / SHARD_TABLE_NAME).unlink()  # a folder written before tables existed
    first = reference_values(folder)
    assert parses == [folder / MANIFEST_NAME] and (folder / SHARD_TABLE_NAME).read_bytes() == written
    assert reference_values(folder) == first and len(parses) == 1  # the second open reads the table


@contextmanager
def read_only(folder):
    """``folder`` cannot be written, by root too (this machine runs the tests as root, CI as a user)."""
    folder.chmod(0o555)
    immutable = os.geteuid() == 0
    if immutable and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        folder.chmod(0o755)
        pytest.skip("root, and no immutable attribute on this file system: cannot make a folder read-only")
    try:
        with pytest.raises(PermissionError):
            (folder / "probe").touch()
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def test_a_read_only_older_folder_keeps_its_table_in_the_user_cache(tmp_path, cache, parses):
    folder = tmp_path / "d"
    many_shards(folder, 40)
    written = (folder / SHARD_TABLE_NAME).read_bytes()
    (folder / SHARD_TABLE_NAME).unlink()
    with read_only(folder):
        first = reference_values(folder)
        sha = hashlib.sha256((folder / MANIFEST_NAME).read_bytes()).hexdigest()
        cached = cache / "shard-tables" / f"{sha}.bin"
        assert not (folder / SHARD_TABLE_NAME).exists() and cached.read_bytes() == written
        assert reference_values(folder) == first and parses == [folder / MANIFEST_NAME]
        assert open_dataset(folder).manifest.shards.table_file == cached


def test_an_unwritable_folder_and_cache_still_open(tmp_path, cache, parses, monkeypatch):
    folder = tmp_path / "d"
    many_shards(folder, 20)
    (folder / SHARD_TABLE_NAME).unlink()

    def nowhere(path, _write):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(shardtable, "atomic_write", nowhere)
    assert reference_values(folder)[:3] == (60, 20, 20) and open_dataset(folder).manifest.shards.table_file is None
    assert len(parses) == 2 and not (folder / SHARD_TABLE_NAME).exists()  # parsed again: nothing kept


@pytest.mark.parametrize("how", ["rewritten by hand", "crash between the manifest and its table"])
def test_a_stale_table_is_detected_and_rebuilt(tmp_path, parses, monkeypatch, how):
    folder = tmp_path / "d"
    many_shards(folder, 30)
    old_table = (folder / SHARD_TABLE_NAME).read_bytes()
    if how == "rewritten by hand":  # the same shards, another largest id for one of them
        d = json.loads((folder / MANIFEST_NAME).read_text())
        d["shards"][7]["max_token_id"] = 499
        (folder / MANIFEST_NAME).write_text(json.dumps(d, separators=(",", ":")))
    else:  # the new manifest is in place, its table never written: the old one stays
        manifest = Manifest.load(folder)
        records = list(manifest.shards)
        records[7].max_token_id = 499
        real = writer.atomic_write
        monkeypatch.setattr(writer, "atomic_write", lambda p, w: None if p.name == SHARD_TABLE_NAME else real(p, w))
        write_manifest(folder, Manifest(manifest.tokenizer, manifest.dtype, records))
        monkeypatch.setattr(writer, "atomic_write", real)
    assert (folder / SHARD_TABLE_NAME).read_bytes() == old_table and decoded(folder / SHARD_TABLE_NAME, folder) is None
    ds = open_dataset(folder)
    assert parses == [folder / MANIFEST_NAME] and int(ds.manifest.table.max_token_id[7]) == 499
    assert table_rows(ds.manifest) == manifest_rows(folder)
    assert table_rows(decoded(folder / SHARD_TABLE_NAME, folder)) == manifest_rows(folder)  # rebuilt in place


def test_a_loaded_manifest_edited_and_written_again_gets_the_table_of_its_edited_records(tmp_path):
    """A loaded manifest's columns were read before its records were edited: written again, its table (and the
    totals of its JSON) were the old ones."""
    folder = tmp_path / "d"
    many_shards(folder, 30)
    manifest = Manifest.load(folder)
    manifest.shards[7].max_token_id = 600
    write_manifest(folder, manifest)
    assert manifest_rows(folder)[7][3] == json.loads((folder / MANIFEST_NAME).read_text())["max_token_id"] == 600
    assert table_rows(decoded(folder / SHARD_TABLE_NAME, folder)) == manifest_rows(folder)
    assert open_dataset(folder).max_token_id == 600


def reseal(data: bytes, at: int, value: bytes) -> bytes:
    """``data`` with ``value`` written at ``at`` and its closing sha256 made right again."""
    body = bytearray(data[: -shardtable.DIGEST])
    body[at : at + len(value)] = value
    return bytes(body) + hashlib.sha256(body).digest()


def column_at(shards: int, column: str, shard: int) -> int:
    """Where a shard's value of a column lies in the table file of ``shards`` shards."""
    return shardtable.HEADER.size + 8 * (shards * shardtable.COLUMNS.index(column) + shard)


def names_at(shards: int) -> int:
    return shardtable.HEADER.size + 8 * shards * len(shardtable.COLUMNS)


@pytest.mark.parametrize("damage", ["truncated", "a byte flipped", "empty", "another layout version",
                                    "another manifest's table", "a name cut short"])
def test_a_damaged_or_foreign_table_is_ignored_and_rebuilt(tmp_path, parses, damage):
    folder, other = tmp_path / "d", tmp_path / "e"
    many_shards(folder, 30)
    reference = reference_values(folder)
    table = folder / SHARD_TABLE_NAME
    good = table.read_bytes()
    many_shards(other, 31)
    bad = {"truncated": good[:-1], "a byte flipped": good[:100] + bytes([good[100] ^ 1]) + good[101:], "empty": b"",
           "another layout version": reseal(good, 8, (2).to_bytes(4, "little")),
           "another manifest's table": (other / SHARD_TABLE_NAME).read_bytes(),
           "a name cut short": reseal(good, names_at(30) + 5, b"\0")}[damage]
    table.write_bytes(bad)
    parses.clear()
    assert reference_values(folder) == reference and parses == [folder / MANIFEST_NAME] and table.read_bytes() == good


def test_verify_checks_the_table_against_the_manifest(tmp_path):
    """A table whose stamp is right is read as it is (checking it means parsing the manifest): verify does that."""
    folder = tmp_path / "d"
    many_shards(folder, 30)
    table = folder / SHARD_TABLE_NAME
    assert run_cli("verify", folder).stdout.endswith("verified (checksums, shard table, index, token ids and EOS)\n")
    good = table.read_bytes()
    table.write_bytes(reseal(good, column_at(30, "max_token_id", 7), np.int64(3).tobytes()))
    assert int(open_dataset(folder).manifest.table.max_token_id[7]) == 3
    one_line_error(run_cli("verify", folder, check=False),
                   f"error: {table}: the shard table disagrees with {folder / MANIFEST_NAME} (shard '00000_00007': "
                   f"max_token_id 3, the manifest says 8); delete {table}: it is built again from the manifest at "
                   f"the next open")
    table.write_bytes(reseal(good, names_at(30), b"X"))  # shard 0's name: 'X0000_00000'
    one_line_error(run_cli("verify", folder, check=False),
                   "(shard 0 is 'X0000_00000', the manifest says '00000_00000')")
    table.unlink()
    assert "OK: " in run_cli("verify", folder).stdout and table.read_bytes() == good


def test_a_manifest_damaged_after_its_table_was_written_is_its_one_line_error(tmp_path):
    """The table of the manifest as it was does not hide that it is now unreadable."""
    folder = tmp_path / "d"
    many_shards(folder, 3)
    (folder / MANIFEST_NAME).write_text('{"format": "nanoset", "version": 1, "shards": [')
    one_line_error(run_cli("inspect", folder, check=False),
                   f"error: {folder / MANIFEST_NAME}: cannot read the manifest (", "re-run `nanoset tokenize`")
