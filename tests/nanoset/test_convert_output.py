"""Where ``nanoset convert`` writes: ``--overwrite`` replaces only a dataset folder (``-o important
--overwrite`` removed ``thesis.tex``; ``-o ~`` would have removed a home folder), a symbolic link OUT is
written through (it reported failure after succeeding and left ``.OUT.old-PID``), and what a killed
conversion left beside OUT is removed by the next one. Also: temporary names of atomic writes are unique
across machines with the same PID."""

from __future__ import annotations

import os
import socket

import pytest

from nanoset import NanosetError, open_dataset
from nanoset.atomic import atomic_write_text
from nanoset.convert import convert
from tests.support import TOKENIZER, one_line_error, run_cli, unwritable
from tests.support.megatron_data import DOCS, STREAM, cache_dir, write_mmidx  # noqa: F401 (cache_dir: autouse)


def test_overwrite_replaces_only_a_dataset_folder(tmp_path):
    prefix = write_mmidx(tmp_path / "mg" / "d", DOCS, "int32")
    important = tmp_path / "important"
    important.mkdir()
    (important / "thesis.tex").write_text("years of work")
    (important / "notes").mkdir()
    one_line_error(run_cli("convert", prefix, "-o", important, "--overwrite", check=False),
                   f"{important}: holds files that are not a dataset's (notes, thesis.tex); --overwrite replaces "
                   f"only a dataset folder: choose another output folder")
    assert (important / "thesis.tex").read_text() == "years of work"
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(NanosetError, match="a-file: is a file, not a folder; choose another output folder"):
        convert(prefix, tmp_path / "a-file", overwrite=True)  # (the command line refuses it before)
    with unwritable(tmp_path / "locked") as locked:  # was "[Errno 13] Permission denied: '.../.o.convert-HOST-PID'"
        why = "Operation not permitted" if os.geteuid() == 0 else "Permission denied"
        one_line_error(run_cli("convert", prefix, "-o", locked / "o", check=False),
                       f"error: {locked}/o: cannot create it in {locked} ({why}); choose another output folder, or "
                       f"make {locked} writable")
    # a dataset folder (a tokenize output, even unfinished, or an earlier conversion) is replaced
    out = tmp_path / "out"
    run_cli("tokenize", TOKENIZER.parent / "corpus" / "sft", "-o", out, "--tokenizer", TOKENIZER, "--quiet")
    (out / ".nanoset-work").mkdir()
    run_cli("convert", prefix, "-o", out, "--overwrite")
    assert open_dataset(out).tokens(0, 15).tolist() == STREAM and not (out / ".nanoset-work").exists()
    run_cli("convert", prefix, "-o", out, "--overwrite")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_symlinked_output_is_written_through(tmp_path):
    prefix = write_mmidx(tmp_path / "mg" / "d", DOCS, "int32")
    real = tmp_path / "storage" / "converted"
    run_cli("convert", prefix, "-o", real)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    proc = run_cli("convert", prefix, "-o", link, "--overwrite")
    assert proc.returncode == 0 and proc.stderr == ""
    assert link.is_symlink() and os.readlink(link) == str(real) and open_dataset(link).num_tokens == 15
    assert sorted(p.name for p in (tmp_path / "storage").iterdir()) == ["converted"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_what_a_killed_conversion_left_is_removed_by_the_next(tmp_path):
    prefix = write_mmidx(tmp_path / "mg" / "d", DOCS, "int32")
    out = tmp_path / "out"
    run_cli("convert", prefix, "-o", out)
    host = socket.gethostname()
    dead = 2**22 + 12345  # above the default pid_max: no such process
    stale = [tmp_path / f".out.convert-{host}-{dead}", tmp_path / f".out.old-{host}-{dead}"]
    other_machine = tmp_path / f".out.convert-elsewhere-{dead}"
    for p in (*stale, other_machine):
        p.mkdir()
        (p / "0.ds").write_bytes(b"\0" * 1000)  # full-size copies, in the issue
    run_cli("convert", prefix, "-o", out, "--overwrite")
    assert [p.exists() for p in stale] == [False, False]
    assert other_machine.exists()  # its process may be alive on that machine: kept


def test_atomic_temporary_names_differ_across_machines_with_one_pid(tmp_path, monkeypatch):
    used = []
    real_replace = os.replace
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    monkeypatch.setattr(os, "replace", lambda a, b: used.append(os.path.basename(a)) or real_replace(a, b))
    atomic_write_text(tmp_path / "nanoset.json", "a")
    atomic_write_text(tmp_path / "nanoset.json", "b")
    assert len(set(used)) == 2 and all(u.startswith(".nanoset.json.tmp-4242-") for u in used)
