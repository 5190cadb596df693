"""The docs stay true to the code: every config key is documented with its default, every page is linked."""

from __future__ import annotations

import dataclasses
import json
import re
import typing

from runtime.config import Config
from tests.support import ROOT

MISSING = dataclasses.MISSING


def schema_keys(cls: type = Config, prefix: str = "") -> dict[str, str]:
    """Every key path of the schema → its default as docs/config.md writes it (JSON, or ``required``)."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        path = f"{prefix}{f.name}"
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        if typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            out.update(schema_keys(typing.get_args(tp)[0], f"{path}[]."))
            continue
        records = [a for a in args if dataclasses.is_dataclass(a)]
        if records:
            if f.default is not MISSING:  # a section that may be null (model.rope_scaling)
                out[path] = json.dumps(f.default)
            for record in records:
                out.update(schema_keys(record, f"{path}."))
            continue
        if f.default is not MISSING:
            out[path] = json.dumps(f.default)
        elif f.default_factory is not MISSING:
            out[path] = json.dumps(f.default_factory())
        else:
            out[path] = "required"
    return out


def documented_keys(text: str) -> dict[str, str]:
    rows = re.findall(r"^\| `([a-z0-9_\[\].]+)` \| (required|`[^`]*`) \|", text, re.M)
    return {key: default.strip("`") for key, default in rows}


def test_every_config_key_is_documented_with_its_default():
    expected = schema_keys()
    documented = documented_keys((ROOT / "docs" / "config.md").read_text())
    assert {k: documented.get(k) for k in expected} == expected
    assert sorted(set(documented) - set(expected)) == []  # no key that the schema lacks
    assert len(expected) > 80 and expected["general.seed"] == "42" and expected["data_stages[].name"] == "required"


def schema_ranges(cls: type = Config, prefix: str = "") -> dict[str, str]:
    """Every numeric key path of the schema → its valid range as the config check says it (``≥ 0``, ...)."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path, tp = f"{prefix}{f.name}", hints[f.name]
        if "range" in f.metadata:
            out[path] = str(f.metadata["range"])
        if typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            out.update(schema_ranges(typing.get_args(tp)[0], f"{path}[]."))
            continue
        for arg in typing.get_args(tp) or [tp]:
            if dataclasses.is_dataclass(arg):
                out.update(schema_ranges(arg, f"{path}."))
    return out


def test_every_range_other_than_positive_is_in_its_row():
    """docs/config.md says a key is > 0 unless its row says otherwise: each other range is in its row."""
    rows = dict(re.findall(r"^\| `([a-z0-9_\[\].]+)` \| (.*)$", (ROOT / "docs" / "config.md").read_text(), re.M))
    ranges = schema_ranges()
    assert ranges["general.seed"] == "in [0, 18446744073709551615]" and ranges["data_stages[].data.prefetch"] == "≥ 0"
    unsaid = {key: valid for key, valid in ranges.items() if valid != "> 0"
              and valid.replace("18446744073709551615", "2^64 − 1") not in rows[key]}
    assert unsaid == {}


def test_every_docs_page_is_linked_from_the_readme_and_the_readme_is_short():
    readme = (ROOT / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and all(f"(docs/{p})" in readme for p in pages), pages
    assert len(readme.splitlines()) <= 250


def test_relative_links_in_the_docs_point_at_files_that_exist():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), (page.name, target)


def test_the_minimal_config_of_the_config_page_trains_on_the_fixtures(shards, tmp_path):
    """The first YAML block of docs/config.md, as it stands, in a folder holding the tokenized fixtures."""
    import shutil

    import yaml

    from tests.support.harness import metrics, train_one

    text = (ROOT / "docs" / "config.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    work = tmp_path / "work"
    shutil.copytree(shards / "shards" / "web", work / "shards" / "web")
    (work / "minimal.yaml").write_text(block)
    train_one(work / "minimal.yaml", work)
    rows = metrics(work / "runs" / "minimal")
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert {r["stage"] for r in rows} == {"pretrain"} and all(r["tokens"] == 2 * 128 for r in rows)
    data = yaml.safe_load(block)
    assert set(data) == {"general", "model", "tokens", "optimizer", "data_stages"}


def test_the_readme_code_map_names_every_module_folder_and_root_module():
    """Each package's folders (``format/``, ``data/order/``, …) and the modules at its root (``cli.py``, ``engine.py``,
    …) appear in the README's code map, under their package's line."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Code map", 1)[1].split("```", 2)[1]
    sections = re.split(r"^(?=\S)", block, flags=re.M)
    missing = []
    for package in ("nanoset", "runtime"):
        (section,) = [s for s in sections if s.startswith(f"{package}/")]
        words = set(re.findall(r"[\w./]+", section))
        folders = {p.parent.relative_to(ROOT / package).as_posix() + "/" for p in (ROOT / package).rglob("*.py")
                   if p.parent != ROOT / package}
        modules = {p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"}
        missing += [f"{package}/{name}" for name in sorted(folders | modules) if name not in words]
    assert missing == []


def test_the_architecture_page_maps_every_module_to_test_files_that_exist():
    """docs/architecture.md's module → tests table names every module of both packages (package ``__init__``s
    aside) exactly once, each with at least one test file, and every file it names exists."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    table = page.split("## Module → tests", 1)[1].split("\n## ", 1)[0]
    named: list[str] = []
    for row in [line for line in table.splitlines() if line.startswith("| `")]:
        modules_cell, tests_cell = row.strip("|").split("|")
        modules, tests = re.findall(r"`([^`]+)`", modules_cell), re.findall(r"`([^`]+)`", tests_cell)
        assert tests and all(t.startswith("tests/") and (ROOT / t).is_file() for t in tests), row
        named += modules
    every = sorted(p.relative_to(ROOT).as_posix() for package in ("nanoset", "runtime")
                   for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py")
    assert sorted(named) == every
