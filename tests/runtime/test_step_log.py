"""The one helper of the step logs (metrics.jsonl, spikes.jsonl, mixing.jsonl): rows past a torn line, the last
step, and the cut after the resumed step (one row per step and kind, the last written, in step order)."""

import json
import os
from pathlib import Path

import pytest

from nanoset.errors import WriteFailed
from runtime.observe.step_log import append_row, cut_after, last_step, read_rows


def test_a_torn_last_line_and_foreign_lines_are_left_out(tmp_path):
    path = tmp_path / "log.jsonl"
    append_row(path, {"step": 1, "loss": 1.5})
    append_row(path, {"step": 2, "loss": 2.5}, durable=True)
    with open(path, "a") as f:
        f.write('["not a row"]\n{"step": "3"}\n{"step": 3, "lo')  # a list, a string step, a crash mid-line
    assert read_rows(path) == [{"step": 1, "loss": 1.5}, {"step": 2, "loss": 2.5}]
    assert last_step(path) == 2
    assert read_rows(tmp_path / "none.jsonl") == [] and last_step(tmp_path / "none.jsonl") == 0


def test_the_cut_keeps_the_last_row_of_each_step_and_kind_up_to_the_step(tmp_path):
    path = tmp_path / "log.jsonl"
    rows = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}, {"step": 2, "val": 7}, {"step": 3, "loss": 3.0},
            {"step": 2, "loss": 12.0}, {"step": 1, "val": 5}]  # step 2 trained again after a kill
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2, "lo')
    cut_after(path, 2, kind=lambda row: "val" in row)
    assert path.read_text().splitlines() == ['{"step": 1, "loss": 1.0}', '{"step": 1, "val": 5}',
                                             '{"step": 2, "loss": 12.0}', '{"step": 2, "val": 7}']
    cut_after(path, 1)  # one kind: the last row of step 1 stands
    assert read_rows(path) == [{"step": 1, "val": 5}]
    cut_after(path, 0)
    assert path.read_text() == "" and [p.name for p in tmp_path.iterdir()] == ["log.jsonl"]  # no temporary left
    cut_after(tmp_path / "none.jsonl", 3)
    assert not (tmp_path / "none.jsonl").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_one_line_naming_the_file():
    with pytest.raises(WriteFailed) as e:
        append_row(Path("/dev/full"), {"step": 1}, durable=True)
    assert str(e.value).startswith("/dev/full: cannot write it (No space left on device)")
