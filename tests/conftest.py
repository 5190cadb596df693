"""Shared fixtures: the committed corpus and tokenizer, reference encodings, tokenized shards."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.support import CORPUS, FIXTURES, TOKENIZER, read_texts_in_corpus_order, run_cli

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))  # tools/make_fixtures.py


@pytest.fixture(autouse=True, scope="session")
def _nanoset_cache_dir(tmp_path_factory):
    """Largest-token-id scan records (nanoset.format.maxid) go to a temporary cache, never the user's."""
    os.environ["NANOSET_CACHE_DIR"] = str(tmp_path_factory.mktemp("nanoset-cache"))


@pytest.fixture(scope="session")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))


@pytest.fixture(scope="session")
def eos_id(tokenizer) -> int:
    return tokenizer.token_to_id("<|endoftext|>")


@pytest.fixture(scope="session")
def reference_docs(tokenizer, eos_id) -> list[np.ndarray]:
    """Direct ``Tokenizer.encode`` of every fixture document, plus EOS, in corpus order."""
    return [np.array(tokenizer.encode(t).ids + [eos_id]) for t in read_texts_in_corpus_order()]


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """``build(folder)`` run once for the whole test session: by the first pytest-xdist worker that asks, the others
    waiting on a lock and then reading the same folder (without xdist: once in this process). For data the tests
    read and never change: every worker would otherwise tokenize or train the same thing again."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/, shared by this session's workers (popen-gw0/, popen-gw1/, ...)
    folder, done = base / f"shared-{name}", base / f"shared-{name}.done"
    with FileLock(str(base / f"shared-{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def fixture_dataset(tmp_path_factory) -> Path:
    """The whole fixture corpus tokenized once (several tasks, several shards)."""
    def build(folder: Path) -> None:
        run_cli("tokenize", CORPUS, "-o", folder / "all", "--tokenizer", TOKENIZER, "--task-bytes", 200_000, "--quiet")

    return built_once(tmp_path_factory, "ds", build) / "all"


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> Path:
    """A folder holding shards/web, shards/code and shards/sft from the fixture corpora (cwd for configs)."""
    from nanoset.tokenize.job import TokenizeOptions, tokenize

    def build(root: Path) -> None:
        for name in ("web", "code", "sft"):
            tokenize(TokenizeOptions(inputs=[str(CORPUS / name)], output=root / "shards" / name,
                                     tokenizer=str(TOKENIZER), task_bytes=100_000, progress=False))

    return built_once(tmp_path_factory, "work", build)


@pytest.fixture(scope="session")
def chat_shards(tmp_path_factory) -> Path:
    """``nanoset tokenize data_fixtures/chat --chat``: the fixture conversations with their loss masks."""
    def build(folder: Path) -> None:
        run_cli("tokenize", FIXTURES / "chat", "-o", folder / "chat", "--tokenizer", TOKENIZER, "--chat", "--quiet")

    return built_once(tmp_path_factory, "chat", build) / "chat"


@dataclass(frozen=True)
class ReferenceRun:
    config: Path
    run_dir: Path
    rows: list[dict]
    stdout: str


@pytest.fixture(scope="session")
def two_stage_run(shards, tmp_path_factory) -> ReferenceRun:
    """The tests' reference run, uninterrupted: ``small_config``'s two stages, dp=2 under torchrun, 12 steps, the
    anneal from step 8, checkpoints every 3 steps. Shared by every file that asks: read it, and copy its folder to
    train on from it."""
    from tests.support.configs import small_config
    from tests.support.harness import metrics, torchrun

    def build(folder: Path) -> None:
        proc = torchrun(small_config(folder, folder / "run"), 2, cwd=shards)
        (folder / "stdout.txt").write_text(proc.stdout)

    folder = built_once(tmp_path_factory, "two-stage-run", build)
    return ReferenceRun(folder / "cfg.yaml", folder / "run", metrics(folder / "run"),
                        (folder / "stdout.txt").read_text())
