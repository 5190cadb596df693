"""What tokenize says while and after it runs: a progress line now and then when stderr is no terminal
(a Slurm log), a tokens/s of the tasks this run tokenized (it counted those already done: 'ran 0 of 14
tasks ... 7,797,611 tokens/s'), and a full disk as one line naming the file."""

from __future__ import annotations

import builtins
import os
import re

import pytest

from nanoset.errors import NanosetError
from nanoset.format import writer
from nanoset.tokenize.job import TokenizeOptions, tokenize
from tests.support import CORPUS, TOKENIZER, run_cli


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path):
    out = tmp_path / "out"
    args = ["tokenize", CORPUS, "-o", out, "--tokenizer", TOKENIZER, "--task-bytes", 200_000]
    proc = run_cli(*args, env={"NANOSET_PROGRESS_SECONDS": "0"})
    lines = proc.stderr.splitlines()
    total = int(re.search(r"ran (\d+) of", proc.stdout)[1])
    assert len(lines) == total > 3
    for k, line in enumerate(lines, 1):
        assert re.fullmatch(rf"{out}: {k} of {total} tasks, [\d,]+ documents, [\d,]+ tokens, [\d,]+ tokens/s, \d+s",
                            line), line
    assert lines[-1].startswith(f"{out}: {total} of {total} tasks, 9,020 documents, ")
    assert run_cli(*args, "--quiet", "--overwrite", env={"NANOSET_PROGRESS_SECONDS": "0"}).stderr == ""
    # the default interval: no line in a run this short (the summary says the rest)
    assert run_cli(*args, "--overwrite").stderr == ""


def test_tokens_per_second_counts_only_the_tasks_this_run_tokenized(tmp_path):
    out = tmp_path / "out"

    def run(**kw):
        return tokenize(TokenizeOptions(inputs=[str(CORPUS)], output=out, tokenizer=str(TOKENIZER), task_bytes=200_000,
                                        progress=False, **kw))

    first = run(num_tasks=2, task_index=0)
    rest = run()
    assert first.tokens_run + rest.tokens_run == rest.tokens and 0 < rest.tokens_run < rest.tokens
    again = run()
    assert (again.tasks_run, again.tokens_run) == (0, 0) and " 0 tokens/s tokenized" in again.line()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """Writing a shard to a full disk raised '[Errno 28] No space left on device' naming no file; the shard's
    writes go to /dev/full here (a real ENOSPC from the kernel)."""
    real_open = builtins.open

    def full_disk(path, mode="r", *args, **kwargs):
        if ".ds.partial-" in str(path) and "w" in mode:
            return real_open("/dev/full", mode, *args, **kwargs)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(writer, "open", full_disk, raising=False)
    out = tmp_path / "out"
    with pytest.raises(NanosetError) as e:
        tokenize(TokenizeOptions(inputs=[str(CORPUS / "web")], output=out, tokenizer=str(TOKENIZER), progress=False))
    assert re.fullmatch(rf"{out}/\.00000_00000\.ds\.partial-\d+: cannot write it \(No space left on device\); free "
                        rf"some space \(or fix the cause\) and rerun the same command: finished work is kept",
                        str(e.value)), str(e.value)
    assert not list(out.glob(".*.partial-*"))  # nothing half written is left


def test_a_number_in_an_environment_variable_that_is_none_is_one_line(tmp_path):
    """NANOSET_PROGRESS_SECONDS=soon was a ValueError traceback; the other variables say the same line."""
    args = ["tokenize", CORPUS, "-o", tmp_path / "out", "--tokenizer", TOKENIZER]
    for env, line in [({"NANOSET_PROGRESS_SECONDS": "soon"}, "NANOSET_PROGRESS_SECONDS='soon' is not a number"),
                      ({"NANOSET_PROGRESS_SECONDS": "-1"}, "NANOSET_PROGRESS_SECONDS=-1.0 must be ≥ 0"),
                      ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer")]:
        proc = run_cli(*args, env=env, check=False)
        assert proc.returncode == 1 and proc.stderr == f"error: environment variable {line}\n", (env, proc.stderr)
    # the shard maps' bound is read where shards are first mapped: inside the command, not at import
    run_cli(*args, "--quiet")
    proc = run_cli("inspect", tmp_path / "out", env={"NANOSET_MAX_OPEN_SHARDS": "0"}, check=False)
    assert proc.returncode == 1 and proc.stderr == "error: environment variable NANOSET_MAX_OPEN_SHARDS=0 must be ≥ 1\n"
