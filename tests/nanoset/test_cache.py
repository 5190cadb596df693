"""The one cache of derived data (``nanoset.cache``): its root rule, its keys, and its policy — a damaged entry is
computed again, a cache that cannot be written costs a recomputation at the next start and one note, never an
error. The users (largest ids, packings, schedule counts) test the policy through their own paths."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest

from nanoset import cache as cache_module
from nanoset.cache import DerivedCache, cache_root, file_stamp, user_cache_root
from nanoset.errors import WriteFailed
from tests.support import assert_one_cache_note


def counting(value):
    """A compute function returning ``value`` and counting its calls in ``.calls``."""

    def compute():
        compute.calls += 1
        return value

    compute.calls = 0
    return compute


def test_the_root_is_the_configured_folder_else_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSET_CACHE_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root(tmp_path / "run") == tmp_path / "run"
    assert cache_root(None) == user_cache_root() == tmp_path / "env"
    monkeypatch.delenv("NANOSET_CACHE_DIR")
    assert cache_root(None) == tmp_path / "xdg" / "nanoset"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root(None) == tmp_path / "home" / ".cache" / "nanoset"
    assert DerivedCache("packing").folder == tmp_path / "home" / ".cache" / "nanoset" / "packing"


def test_an_array_is_computed_once_per_key_and_read_back(tmp_path):
    table = np.arange(6, dtype=np.int64).reshape(3, 2)
    compute = counting(table)
    cache = DerivedCache("kind", tmp_path)
    assert cache.array(["a", 1], compute).tolist() == table.tolist() and compute.calls == 1
    (path,) = (tmp_path / "kind").iterdir()  # one entry, no temporary file left
    assert path.suffix == ".npy"
    back = cache.array(["a", 1], compute)
    assert isinstance(back, np.memmap) and back.tolist() == table.tolist() and compute.calls == 1
    cache.array(["a", 2], compute)  # another key: another entry
    assert compute.calls == 2 and len(list((tmp_path / "kind").iterdir())) == 2
    cache.array("v1-readable-8", compute)  # a string key is the entry's name
    assert (tmp_path / "kind" / "v1-readable-8.npy").is_file()
    with pytest.raises(ValueError, match="a cache entry name must be a plain file name, got '../x'"):
        cache.array("../x", compute)


@pytest.mark.parametrize("damage", [b"", b"not an array", b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order'"])
def test_a_damaged_array_is_computed_again_and_replaced(tmp_path, damage):
    table = np.array([[7, 8]], dtype=np.int64)
    compute = counting(table)
    cache = DerivedCache("kind", tmp_path)
    cache.array("k", compute)
    (path,) = (tmp_path / "kind").iterdir()
    path.write_bytes(damage)
    assert cache.array("k", compute).tolist() == [[7, 8]] and compute.calls == 2
    assert np.load(path).tolist() == [[7, 8]]  # replaced: read back from now on
    assert cache.array("k", compute).tolist() == [[7, 8]] and compute.calls == 2


def test_an_array_its_check_refuses_is_computed_again(tmp_path):
    cache = DerivedCache("kind", tmp_path)
    cache.array("k", counting(np.zeros(3, dtype=np.int64)))
    compute = counting(np.ones(4, dtype=np.int64))
    assert cache.array("k", compute, lambda a: len(a) == 4).tolist() == [1, 1, 1, 1] and compute.calls == 1


def test_a_record_holds_its_key_one_file_per_slot(tmp_path):
    cache = DerivedCache("records", tmp_path)
    compute = counting({"value": [3]})
    assert cache.record({"folder": "/d", "files": [("a", 1)]}, compute, "d") == {"folder": "/d", "files": [["a", 1]],
                                                                                  "value": [3]}
    (path,) = (tmp_path / "records").iterdir()
    assert json.loads(path.read_text()) == {"folder": "/d", "files": [["a", 1]], "value": [3]}
    assert cache.record({"folder": "/d", "files": [("a", 1)]}, compute, "d")["value"] == [3] and compute.calls == 1
    changed = counting({"value": [4]})  # the files changed: the slot's record is replaced, not added to
    assert cache.record({"folder": "/d", "files": [("a", 2)]}, changed, "d")["value"] == [4]
    assert list((tmp_path / "records").iterdir()) == [path] and json.loads(path.read_text())["files"] == [["a", 2]]


@pytest.mark.parametrize("damage", ["", "{\"folder\": ", "[1, 2]", "{\"folder\": \"/d\"}", "\udcff"])
def test_a_damaged_or_foreign_record_is_computed_again(tmp_path, damage):
    cache = DerivedCache("records", tmp_path)
    cache.record({"folder": "/d"}, counting({"value": 1}), "d")
    (path,) = (tmp_path / "records").iterdir()
    path.write_bytes(damage.encode("utf-8", "surrogateescape"))
    compute = counting({"value": 1})
    valid = lambda r: r.get("value") == 1  # noqa: E731
    assert cache.record({"folder": "/d"}, compute, "d", valid)["value"] == 1 and compute.calls == 1
    assert json.loads(path.read_text()) == {"folder": "/d", "value": 1}


def test_an_unwritable_cache_is_one_note_and_a_recomputation_at_the_next_start(tmp_path, capsys):
    """Neither an error nor silence: the value is used, computed again next time, and the note said once per
    process and root; once the root is writable, the entry is written and read back."""
    root = tmp_path / "file"
    root.write_text("a file where the cache folder should be")
    compute = counting(np.arange(4, dtype=np.int64))
    assert DerivedCache("kind", root).array("k", compute).tolist() == [0, 1, 2, 3]
    assert_one_cache_note(capsys.readouterr().err, root, "kind", r"k\.npy")
    record = counting({"value": 2})
    assert DerivedCache("other", root).record({"k": 1}, record)["value"] == 2
    assert DerivedCache("kind", root).array("k", compute).tolist() == [0, 1, 2, 3]
    assert compute.calls == 2 and record.calls == 1 and capsys.readouterr().err == ""  # said once for the root
    root.unlink()
    assert DerivedCache("kind", root).array("k", compute).tolist() == [0, 1, 2, 3] and compute.calls == 3
    assert DerivedCache("kind", root).array("k", compute).tolist() == [0, 1, 2, 3] and compute.calls == 3
    assert capsys.readouterr().err == ""


def test_a_full_disk_is_the_same_note_naming_the_cause(tmp_path, capsys, monkeypatch):
    def full(path, array):
        raise WriteFailed(path, "No space left on device")

    monkeypatch.setattr(cache_module, "atomic_write_array", full)
    compute = counting(np.zeros(2, dtype=np.int64))
    assert DerivedCache("kind", tmp_path).array("k", compute).tolist() == [0, 0]
    assert_one_cache_note(capsys.readouterr().err, tmp_path, "kind", r"k\.npy", "No space left on device")
    assert not list((tmp_path / "kind").iterdir())


def test_a_read_only_cache_is_the_same_note(tmp_path, capsys, monkeypatch):
    """A read-only filesystem (EROFS) as the root: the same note, the value used."""
    real_mkdir = Path.mkdir

    def read_only(self, *a, **k):
        if self.is_relative_to(tmp_path / "ro"):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert DerivedCache("kind", tmp_path / "ro").record({"k": 1}, counting({"v": 1}))["v"] == 1
    assert_one_cache_note(capsys.readouterr().err, tmp_path / "ro", "kind", r"[0-9a-f]{32}\.json",
                          "Read-only file system")


def test_a_file_stamp_changes_with_a_rewrite_that_keeps_size_and_mtime(tmp_path):
    import os

    f = tmp_path / "f"
    f.write_bytes(b"abcd")
    before = file_stamp(f)
    st = f.stat()
    f.write_bytes(b"wxyz")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = file_stamp(f)
    assert after[:2] == before[:2] and after != before  # status-change time (or inode) tells
