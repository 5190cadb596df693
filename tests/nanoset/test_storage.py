"""The storage seam (nanoset.storage): one spelling per location, and the local backend's answers."""

from __future__ import annotations

import numpy as np
import pytest

from nanoset import storage
from nanoset.errors import NanosetError
from nanoset.remote_cache import local_file
from nanoset.storage import Location, location


def test_one_spelling_per_location(tmp_path):
    assert location("S3://bucket//data/set/").url == "s3://bucket/data/set"
    assert location(Location("s3://b/k")) == Location("s3://b/k")
    assert str(location("s3://b/k") / "x.ds") == "s3://b/k/x.ds"
    assert location("s3://b/k/x.ds").parent.url == "s3://b/k" and location("s3://b/k/x.ds").name == "x.ds"
    assert location(tmp_path / "a" / ".." / "a").url == str(tmp_path / "a" / ".." / "a")  # a local path as given
    assert location("data/x").path.name == "x" and not location("data/x").remote
    assert storage.is_url("gs://b/x") and not storage.is_url("/data/x") and not storage.is_url("C:/x")
    assert storage.resolved("s3://b//k/") == "s3://b/k" and storage.resolved(tmp_path / "a" / "..") == str(tmp_path)
    with pytest.raises(NanosetError, match="no bucket"):
        location("s3://")


def test_local_backend(tmp_path):
    (tmp_path / "b.ds").write_bytes(bytes(range(10)))
    (tmp_path / "a.ds").write_bytes(b"")
    (tmp_path / "sub").mkdir()
    assert storage.list_names(tmp_path, "*.ds") == ["a.ds", "b.ds"]
    assert storage.list_names(tmp_path / "missing") == []
    (tmp_path / "sub" / "c.ds").write_bytes(b"c")
    assert storage.files_under(tmp_path) == ["a.ds", "b.ds", "sub/c.ds"]
    assert storage.files_under(tmp_path / "missing") == []
    assert storage.sizes(tmp_path, ["b.ds", "a.ds", "c.ds"]) == [10, 0, None]
    assert storage.read_range(tmp_path / "b.ds", 3, 6) == bytes([3, 4, 5])
    assert storage.size(tmp_path / "b.ds") == 10
    assert storage.is_file(tmp_path / "b.ds") and storage.is_dir(tmp_path / "sub") and not storage.is_file(tmp_path)
    assert list(storage.map_range(tmp_path / "b.ds", "u1", 2, 3)) == [2, 3, 4]
    assert local_file(tmp_path / "b.ds") == tmp_path / "b.ds"
    with storage.open_read(tmp_path / "b.ds") as f:
        assert np.frombuffer(f.read(), "u1").sum() == 45


def test_a_url_without_the_extra_installed_is_one_line():
    """obstore made unimportable: local paths work as ever, a URL names the extra to install."""
    import subprocess
    import sys

    from tests.support import ROOT

    code = "import sys; sys.modules['obstore'] = None; from nanoset.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "inspect", "s3://bucket/data"], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        "error: s3://bucket/data/nanoset.json: reading s3:// needs its library: pip install 'nanoset[s3]'")
