"""The command line used the wrong way: the output folder inside the input, replacing a folder that
holds other files, paths that are not folders, nonsense counts. One error line, or the right result."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from nanoset import open_dataset
from tests.support import TOKENIZER, one_line_error, run_cli, unwritable


def corpus(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": f"alpha {i}"}) + "\n" for i in range(50)))
    (folder / "sub" / "b.json").write_text(json.dumps([{"text": f"beta {i}"} for i in range(30)]))
    return folder


def tokenize_cli(*args, check=False):
    return run_cli("tokenize", *args, "--tokenizer", TOKENIZER, "--quiet", check=check)


def test_output_inside_the_input_folder_is_not_read_as_input(tmp_path, tokenizer, eos_id):
    data = corpus(tmp_path / "data")
    out = data / "tokenized"
    tokenize_cli(data, "-o", out, check=True)
    first = (out / "nanoset.json").read_bytes()
    # rerun: its own nanoset.json (a .json file in the input folder) was an input, so the plan differed:
    # 'holds a different dataset', and with --overwrite a FileNotFoundError once the manifest was cleared
    proc = tokenize_cli(data, "-o", out, check=True)
    assert "ran 0 of 1 tasks (1 already done)" in proc.stdout
    tokenize_cli(data, "-o", out, "--overwrite", check=True)
    assert (out / "nanoset.json").read_bytes() == first
    ds = open_dataset(out)
    texts = [f"alpha {i}" for i in range(50)] + [f"beta {i}" for i in range(30)]
    assert [ds.document(i).tolist() for i in range(ds.num_documents)] == [
        tokenizer.encode(t).ids + [eos_id] for t in texts]


def test_output_folder_equal_to_the_input_folder(tmp_path):
    data = corpus(tmp_path / "data")
    one_line_error(tokenize_cli(data / "sub", "-o", data / "sub", "--overwrite"),
                   f"{data / 'sub'}: its input files are all in the output folder {data / 'sub'}, where tokenize "
                   f"writes; choose another output folder")
    assert (data / "sub" / "b.json").is_file() and sorted(p.name for p in (data / "sub").iterdir()) == ["b.json"]


def test_overwrite_removes_only_what_tokenize_writes(tmp_path):
    data = corpus(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    keep = ["notes.dsv", "budget.dss.csv", "a.ds.txt", "README", ".hidden"]
    gone = ["old.ds", "old.ds.index", "old.ds.metadata", "old.ds.loss", ".old.ds.partial-12", ".nanoset.json.tmp-7"]
    for name in keep + gone:
        (out / name).write_text("x")
    tokenize_cli(data, "-o", out, "--overwrite", check=True)
    left = {p.name for p in out.iterdir()}
    assert set(keep) <= left and not set(gone) & left  # a substring match deleted notes.dsv and budget.dss.csv


def test_filesystem_errors_are_one_line(tmp_path):
    data = corpus(tmp_path / "data")
    (tmp_path / "afile").write_text("x")
    one_line_error(tokenize_cli(data, "-o", tmp_path / "afile" / "out"),  # was "[Errno 20] Not a directory: ..."
                   f"error: {tmp_path}/afile/out: {tmp_path}/afile is a file, not a folder; choose another -o folder")
    one_line_error(tokenize_cli(data, "-o", "/proc/nanoset-nope/out"),  # was a bare "[Errno 2]" naming /proc/...
                   "error: /proc/nanoset-nope/out: cannot create it in /proc (No such file or directory); choose "
                   "another -o folder")
    one_line_error(tokenize_cli(data, "-o", tmp_path / "o", "--num-tasks", "0"), "--num-tasks must be ≥ 1, got 0")


def test_an_output_folder_that_cannot_be_written_is_one_line(tmp_path):
    """An existing -o folder nothing can be created in was "[Errno 1] Operation not permitted:
    '.../.nanoset-work.tmp-...'" (or "[Errno 13] Permission denied"), naming a temporary folder; one in a
    folder that cannot be written, or a dataset finished there that is rerun, are the same rule."""
    data = corpus(tmp_path / "data")
    with unwritable(tmp_path / "locked") as locked:
        why = "Operation not permitted" if os.geteuid() == 0 else "Permission denied"
        one_line_error(tokenize_cli(data, "-o", locked),
                       f"error: {locked}: cannot write in it ({why}); choose another -o folder, or make it writable")
        one_line_error(tokenize_cli(data, "-o", locked / "out"),
                       f"error: {locked}/out: cannot create it in {locked} ({why}); choose another -o folder, or "
                       f"make {locked} writable")
        assert list(locked.iterdir()) == []
    tokenize_cli(data, "-o", locked / "done", check=True)
    with unwritable(locked / "done"):  # a finished dataset in a place that cannot be written: nothing to write
        assert "ran 0 of 1 tasks (1 already done)" in tokenize_cli(data, "-o", locked / "done", check=True).stdout


@pytest.mark.parametrize("raised, line", [
    (KeyboardInterrupt(), "error: interrupted; rerun the same command to resume"),
    (EOFError("stream ended"), "error: aborted (EOFError('stream ended'))"),
])
def test_ctrl_c_says_that_a_rerun_resumes(monkeypatch, capsys, raised, line):
    # click turns KeyboardInterrupt into Abort, so the CLI's own Ctrl-C message was never printed
    import nanoset.tokenize.job
    from nanoset import cli

    def interrupted(opts):
        raise raised

    monkeypatch.setattr(nanoset.tokenize.job, "tokenize", interrupted)
    monkeypatch.setattr(sys, "argv", ["nanoset", "tokenize", "in", "-o", "out", "--tokenizer", "tok"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 130 and capsys.readouterr().err.strip() == line


def test_files_removed_by_another_job_on_the_folder_are_explained(tmp_path, monkeypatch):
    """Another job with --overwrite (or the same --task-index) removing our files mid-run surfaced as a bare
    '[Errno 2] No such file or directory: .../.nanoset-work/.task-000000.json.tmp-PID'."""
    from nanoset.errors import NanosetError
    from nanoset.tokenize.job import TokenizeOptions, tokenize
    from nanoset.tokenize.tasks import OutputFolder

    data = corpus(tmp_path / "data")
    out = tmp_path / "out"
    real = OutputFolder.mark_done

    def other_job_clears_first(self, task, result):
        OutputFolder(out).clear()
        real(self, task, result)

    monkeypatch.setattr(OutputFolder, "mark_done", other_job_clears_first)
    with pytest.raises(NanosetError, match=f"^{out}: .task-000000.json.tmp-[0-9]+-[0-9a-f]+ was removed while this "
                                           f"run wrote it: is another `nanoset tokenize` writing to this folder"):
        tokenize(TokenizeOptions(inputs=[str(data)], output=out, tokenizer=str(TOKENIZER), progress=False))


def test_an_input_touched_during_a_job_is_named(tmp_path):
    """Touching an input between two --task-index runs said 'holds a different dataset': name the file."""
    data = corpus(tmp_path / "data")
    out = tmp_path / "out"
    tokenize_cli(data, "-o", out, "--num-tasks", "2", "--task-index", "0", "--task-bytes", "500", check=True)
    os.utime(data / "sub" / "b.json", ns=(1, 1))
    one_line_error(tokenize_cli(data, "-o", out, "--num-tasks", "2", "--task-index", "1", "--task-bytes", "500"),
                   f"{out}: holds an unfinished job on these inputs, but {data / 'sub' / 'b.json'} was modified "
                   f"since it began; pass --overwrite to start over")


def test_sigterm_stops_the_workers_and_a_rerun_resumes(tmp_path):
    """``kill`` (SIGTERM) ended the driver at once and left its workers writing, orphaned, until their
    tasks were done; now it unwinds like Ctrl-C: workers stopped, one line, exit 143, rerun resumes."""
    import signal
    import subprocess
    import time

    data = tmp_path / "data"
    data.mkdir()
    line = json.dumps({"text": "alpha beta gamma delta " * 60}) + "\n"
    for i in range(2):
        (data / f"{i}.jsonl").write_text(line * 5_000)
    out = tmp_path / "out"
    args = ["tokenize", data, "-o", out, "--tokenizer", TOKENIZER, "--quiet", "--workers", "2", "--task-bytes", 2 << 20]
    proc = subprocess.Popen([sys.executable, "-m", "nanoset.cli", *map(str, args)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(out.glob(".*.partial-*")) and time.time() < deadline:  # the workers are writing
        time.sleep(0.05)
    workers = [int(p.name) for p in Path("/proc").iterdir()
               if p.name.isdigit() and _parent(p) == proc.pid and b"spawn_main" in _cmdline(p)]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip() == "error: terminated; rerun the same command to resume"
    assert len(workers) >= 2 and not [w for w in workers if _alive(w)]
    done = run_cli(*args)
    assert "; complete" in done.stdout and open_dataset(out).num_documents == 10_000


def _parent(proc_dir: Path) -> int | None:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(proc_dir: Path) -> bytes:
    try:
        return (proc_dir / "cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped by init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
