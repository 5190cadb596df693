"""Encoder backends: fastokens (and any backend of the registry) writes the shards tokenizers writes, byte for
byte, for every kind of tokenizer (through the fallback where fastokens cannot load one), with text and with
chats; the fallback says why in one note, ``--backend fastokens`` refuses in one line, and the guards catch a
planted difference."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nanoset import open_dataset
from nanoset.format.spec import MANIFEST_NAME, SHARD_TABLE_NAME
from nanoset.tokenize import backends
from nanoset.tokenize.backends import choose_backend, load_encoder
from nanoset.tokenize.byte_offsets import ByteLevelOffsets
from nanoset.tokenize.job import TokenizeOptions, tokenize
from nanoset.tokenize.tokenizer import PROBE_TEXTS
from tests.support import FIXTURES, TOKENIZER, one_line_error, run_cli
from tests.support.tokenizer_kinds import KINDS, build

fastokens = pytest.importorskip("fastokens")
FASTOKENS = f"fastokens {backends._version('fastokens')}"
TOKENIZERS = f"tokenizers {backends._version('tokenizers')}"
TRICKY = list(PROBE_TEXTS[:-1]) + ["Hello 🤗 x", "<|im_start|>user\nhi<|im_end|>\n", "naïve café\r\n東京 ½ ﬁ Ⅻ"]


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {kind: build(kind, root / kind) for kind in KINDS}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Two JSON-lines files: fixture-style documents with awkward texts among them (about 120 KB)."""
    sys.path.insert(0, str(FIXTURES.parent / "tools"))
    from make_fixtures import code_doc, web_doc

    folder = tmp_path_factory.mktemp("corpus")
    r = random.Random(5)
    for part in range(2):
        docs = [web_doc(r) if i % 3 else code_doc(r) for i in range(150)]
        docs[10:10] = TRICKY
        (folder / f"part-{part}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return folder


def shard_files(folder: Path) -> dict[str, bytes]:
    """The shard files: the manifest and its shard table name the encoders, which differ by backend."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name not in (MANIFEST_NAME, SHARD_TABLE_NAME)}


def run(corpus: Path, tokenizer: Path, out: Path, backend: str, **options) -> dict:
    tokenize(TokenizeOptions(inputs=[str(corpus)], output=out, tokenizer=str(tokenizer), backend=backend,
                             task_bytes=40_000, progress=False, **options))
    return json.loads((out / "nanoset.json").read_text())


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_of_tokenizer_gives_the_same_shards_with_each_backend(kind, kinds, corpus, tmp_path, capsys):
    from tokenizers import Tokenizer

    reference = run(corpus, kinds[kind], tmp_path / "tokenizers", "tokenizers")
    capsys.readouterr()
    auto = run(corpus, kinds[kind], tmp_path / "auto", "auto")
    note = capsys.readouterr().err
    assert shard_files(tmp_path / "auto") == shard_files(tmp_path / "tokenizers")
    assert len(reference["shards"]) >= 3 and reference["encoders"] == [TOKENIZERS]  # several tasks
    tok = Tokenizer.from_file(str(kinds[kind] / "tokenizer.json"))
    eos = tok.token_to_id(json.loads((kinds[kind] / "tokenizer_config.json").read_text())["eos_token"])
    ds = open_dataset(tmp_path / "auto")
    texts = [json.loads(line)["text"] for line in (corpus / "part-0.jsonl").read_text().splitlines()]
    for i in (0, 10, 16, 17, 22):  # the tokenizer's own special tokens included (Llama 3's and SPM's BOS, BERT's
        ids = tok.encode(texts[i]).ids  # CLS and SEP: BERT's SEP is its EOS, not appended twice)
        assert ds.document(i).tolist() == ids + ([] if kind == "wordpiece" else [eos])
    if kind in ("unigram", "wordpiece"):  # fastokens lacks their normalizers: tokenizers, said once
        assert auto["encoders"] == [TOKENIZERS]
        normalizer = "NFKC" if kind == "unigram" else "BertNormalizer"
        assert note == (f"note: encoding with tokenizers: fastokens cannot load {kinds[kind] / 'tokenizer.json'} "
                        f"(ValueError: normalizer error: unsupported normalizer type: {normalizer})\n")
    else:
        assert auto["encoders"] == [FASTOKENS] and note == ""
    bos = {"llama3": "<|begin_of_text|>", "spm": "<s>", "wordpiece": "[CLS]"}
    if kind in bos:  # fastokens adds no special tokens unless asked; tokenizers does
        assert ds.document(0)[0] == tok.token_to_id(bos[kind])


def test_workers_and_task_splits_with_fastokens_write_the_tokenizers_shards(kinds, corpus, tmp_path):
    run(corpus, kinds["llama3"], tmp_path / "reference", "tokenizers")
    args = ["tokenize", corpus, "-o", tmp_path / "split", "--tokenizer", kinds["llama3"], "--task-bytes", 40_000,
            "--quiet", "--workers", 2, "--backend", "fastokens"]
    run_cli(*args, "--num-tasks", 2, "--task-index", 1)
    last = run_cli(*args, "--num-tasks", 2, "--task-index", 0)
    assert "complete" in last.stdout and last.stderr == ""
    assert shard_files(tmp_path / "split") == shard_files(tmp_path / "reference")
    assert json.loads((tmp_path / "split" / "nanoset.json").read_text())["encoders"] == [FASTOKENS]


def test_a_job_begun_with_one_backend_resumes_with_another(kinds, corpus, tmp_path):
    """The backend is not part of the job's plan: killed under tokenizers, resumed under fastokens, the
    folder is the uninterrupted run's, and the manifest names both."""
    run(corpus, kinds["gpt2"], tmp_path / "reference", "tokenizers")
    args = ["tokenize", corpus, "-o", tmp_path / "out", "--tokenizer", kinds["gpt2"], "--task-bytes", 40_000,
            "--quiet", "--workers", 2]
    killed = run_cli(*args, "--backend", "tokenizers", check=False, env={"NANOSET_FAULT_KILL_TASK": "2"})
    assert killed.returncode == 1 and "task 2" in killed.stderr and "SIGKILL" in killed.stderr
    resumed = run_cli(*args)
    assert "already done" in resumed.stdout and " 0 already done" not in resumed.stdout
    assert shard_files(tmp_path / "out") == shard_files(tmp_path / "reference")
    assert json.loads((tmp_path / "out" / "nanoset.json").read_text())["encoders"] == [FASTOKENS, TOKENIZERS]


def test_backend_fastokens_refuses_a_tokenizer_it_cannot_load_in_one_line(kinds, corpus, tmp_path):
    proc = run_cli("tokenize", corpus, "-o", tmp_path / "out", "--tokenizer", kinds["unigram"], "--quiet",
                   "--backend", "fastokens", check=False)
    one_line_error(proc, "--backend fastokens: fastokens cannot load", "unsupported normalizer type: NFKC",
                   "use --backend auto")


def test_without_fastokens_auto_is_tokenizers_and_fastokens_is_refused(kinds, corpus, tmp_path):
    """A machine without its wheel (and without orjson's): auto encodes with tokenizers without a word."""
    code = ("import sys\nsys.modules['fastokens'] = None\nsys.modules['orjson'] = None\n"
            "from nanoset.cli import main\nsys.argv = ['nanoset'] + sys.argv[1:]\nmain()\n")
    base = ["tokenize", str(corpus), "--tokenizer", str(kinds["gpt2"]), "--quiet", "--task-bytes", "40000"]
    proc = subprocess.run([sys.executable, "-c", code, *base, "-o", str(tmp_path / "auto")], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    run(corpus, kinds["gpt2"], tmp_path / "fast", "fastokens")
    assert shard_files(tmp_path / "auto") == shard_files(tmp_path / "fast")
    proc = subprocess.run([sys.executable, "-c", code, *base, "-o", str(tmp_path / "f"), "--backend", "fastokens"],
                          capture_output=True, text=True)
    one_line_error(proc, "--backend fastokens: fastokens is not installed")


def test_a_fastokens_that_cannot_be_imported_is_a_fallback_not_a_traceback(corpus, tmp_path):
    """An installed fastokens whose import fails (its native library missing or built for another system, as in
    a virtualenv shared between machines) stopped every default run with an ImportError traceback."""
    import os

    broken = tmp_path / "site" / "fastokens"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("libgcc_s.so.1: cannot open shared object file")\n')
    env = {"PYTHONPATH": os.pathsep.join([str(broken.parent), os.environ.get("PYTHONPATH", "")])}
    args = ["tokenize", corpus, "--tokenizer", TOKENIZER, "--quiet", "--task-bytes", 40_000]
    proc = run_cli(*args, "-o", tmp_path / "auto", "--workers", 2, env=env)
    assert proc.stderr == ("note: encoding with tokenizers: fastokens cannot be imported (ImportError: libgcc_s.so.1: "
                           "cannot open shared object file)\n")
    run(corpus, TOKENIZER, tmp_path / "reference", "tokenizers")
    assert shard_files(tmp_path / "auto") == shard_files(tmp_path / "reference")
    one_line_error(run_cli(*args, "-o", tmp_path / "strict", "--backend", "fastokens", env=env, check=False),
                   "--backend fastokens: fastokens cannot be imported (ImportError: libgcc_s.so.1",
                   "use --backend auto or tokenizers")


# ---------------------------------------------------------------- chat and offsets ------------


@pytest.mark.parametrize("workers", [1, 2])
def test_chat_shards_and_loss_masks_are_byte_identical(tmp_path, workers):
    args = ["tokenize", FIXTURES / "chat", "--tokenizer", TOKENIZER, "--chat", "--quiet", "--task-bytes", 30_000]
    run_cli(*args, "-o", tmp_path / "reference", "--backend", "tokenizers")
    proc = run_cli(*args, "-o", tmp_path / "auto", "--workers", workers)
    assert proc.stderr == ""
    reference = shard_files(tmp_path / "reference")
    assert shard_files(tmp_path / "auto") == reference and sum(n.endswith(".ds.loss") for n in reference) >= 3
    assert json.loads((tmp_path / "auto" / "nanoset.json").read_text())["encoders"] == [FASTOKENS]


def offsets_both_ways(path: Path, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    fast = load_encoder(path, "fastokens", chat=True)
    return fast.encode_with_offsets(texts)[1], fast.reference().encode_with_offsets(texts)[1]


def test_offsets_from_token_bytes_follow_tokenizers_conventions():
    """A character split over several tokens gives each piece the whole character (an emoji in 4 byte tokens:
    all (6, 7)); an added token spans its text; and every text of the probe set agrees with tokenizers."""
    derived, reference = offsets_both_ways(TOKENIZER / "tokenizer.json", ["Hello 🤗 x", "é<|im_end|>\n"])
    assert derived.tolist() == [[0, 1], [1, 4], [4, 5], [5, 6], [6, 7], [6, 7], [6, 7], [6, 7], [7, 8], [8, 9],
                                [0, 1], [0, 1], [1, 11], [11, 12]]
    assert np.array_equal(derived, reference)
    derived, reference = offsets_both_ways(TOKENIZER / "tokenizer.json", TRICKY)
    assert np.array_equal(derived, reference)


def test_offsets_trimmed_as_a_byte_level_post_processor_trims_them(tmp_path):
    """``trim_offsets`` (with and without ``add_prefix_space``), added tokens made of spaces included."""
    from tokenizers import Tokenizer, processors

    texts = TRICKY + ["a  b\n\nc x\u3000 d", "  x", " \n\n", "x\u3000\u3000"]
    for prefix_space in (False, True):
        tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
        tok.post_processor = processors.ByteLevel(trim_offsets=True, add_prefix_space=prefix_space)
        tok.add_tokens(["  ", "\n\n", " x\u3000"])
        tok.save(str(tmp_path / "tokenizer.json"))
        derived, reference = offsets_both_ways(tmp_path / "tokenizer.json", texts)
        assert np.array_equal(derived, reference)
        assert (derived[:, 0] == derived[:, 1]).any()  # some tokens were trimmed to nothing, as tokenizers does


def nfc_tokenizer(tmp_path: Path) -> Path:
    """The fixture tokenizer with an NFC normalizer (as Qwen2's has): token bytes cannot give its offsets."""
    from tokenizers import Tokenizer, normalizers

    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    tok.normalizer = normalizers.NFC()
    folder = tmp_path / "nfc"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text((TOKENIZER / "tokenizer_config.json").read_text())
    return folder


def test_a_normalizer_keeps_chats_on_tokenizers_with_a_note(tmp_path):
    """NFC (as Qwen2's tokenizers have) moves characters: token bytes cannot give offsets there, so --chat
    encodes with tokenizers (one note) while text still takes fastokens."""
    folder = nfc_tokenizer(tmp_path)
    assert ByteLevelOffsets.of_tokenizer(json.loads((folder / "tokenizer.json").read_text())) == \
        (None, "its normalizer (NFC) moves characters")
    assert choose_backend(folder / "tokenizer.json", "auto", chat=False).backend == "fastokens"
    args = ["tokenize", FIXTURES / "chat", "--tokenizer", folder, "--chat", "--quiet"]
    auto = run_cli(*args, "-o", tmp_path / "auto")
    assert auto.stderr == ("note: encoding with tokenizers: --chat needs character offsets, which fastokens does not "
                           "give and the token bytes give only for byte-level BPE without a normalizer: its "
                           "normalizer (NFC) moves characters\n")
    run_cli(*args, "-o", tmp_path / "reference", "--backend", "tokenizers")
    assert shard_files(tmp_path / "auto") == shard_files(tmp_path / "reference")
    one_line_error(run_cli(*args, "-o", tmp_path / "f", "--backend", "fastokens", check=False),
                   "--backend fastokens: --chat needs character offsets", "normalizer (NFC)")


# ---------------------------------------------------------------- guards ----------------------


def plant_difference(monkeypatch, marker: str) -> None:
    """fastokens 'encodes' every text holding ``marker`` with its first id one higher: a backend bug."""
    real = backends.FastokensEncoder.encode

    def encode(self, texts, add_special_tokens=True):
        ids, lengths = real(self, texts, add_special_tokens)
        ids = ids.copy()
        for start, text in zip(np.cumsum(lengths) - lengths, texts):
            if marker in text:
                ids[start] += 1
        return ids, lengths

    monkeypatch.setattr(backends.FastokensEncoder, "encode", encode)


def test_the_probe_catches_a_difference_and_the_job_falls_back(monkeypatch, corpus, tmp_path, capsys, tokenizer):
    """The probe set is checked with the first task: that task, done by fastokens, is done again by tokenizers,
    and so is every other; the note says where; ``--backend fastokens`` stops with that line."""
    emoji = PROBE_TEXTS[8]
    assert emoji.startswith("emoji: ")
    run(corpus, TOKENIZER, tmp_path / "reference", "tokenizers")
    plant_difference(monkeypatch, emoji)
    manifest = run(corpus, TOKENIZER, tmp_path / "auto", "auto")
    ids = tokenizer.encode(emoji).ids
    difference = (f"{FASTOKENS} and tokenizers differ on a probe text: text 8 ({backends._excerpt(emoji)}) at token "
                  f"0: fastokens gives {[ids[0] + 1] + ids[1:3]}, tokenizers {ids[:3]} (a fastokens bug: please "
                  f"report it)")
    assert capsys.readouterr().err == f"note: encoding with tokenizers (what fastokens encoded is encoded again): " \
                                      f"{difference}\n"
    assert shard_files(tmp_path / "auto") == shard_files(tmp_path / "reference")
    assert manifest["encoders"] == [TOKENIZERS]
    with pytest.raises(ValueError) as e:
        run(corpus, TOKENIZER, tmp_path / "strict", "fastokens")
    assert str(e.value) == f"--backend fastokens: {difference}; use --backend auto or tokenizers"


def test_a_tasks_first_texts_catch_a_difference_and_the_job_falls_back(monkeypatch, corpus, tmp_path, capsys):
    """The difference is in the second task's first texts: the first task, done by fastokens, is redone by
    tokenizers, later ones use tokenizers, and the note says where; a rerun of the folder keeps to it."""
    offset = 0
    for line in (corpus / "part-0.jsonl").read_bytes().splitlines(keepends=True):
        if offset >= 40_000:  # the first line of the second task (task_bytes=40_000)
            marker = json.loads(line)["text"]
            break
        offset += len(line)
    run(corpus, TOKENIZER, tmp_path / "reference", "tokenizers")
    plant_difference(monkeypatch, marker)
    manifest = run(corpus, TOKENIZER, tmp_path / "auto", "auto")
    err = capsys.readouterr().err.splitlines()
    size = (corpus / "part-0.jsonl").stat().st_size
    task_1 = (f"{corpus / 'part-0.jsonl'} bytes 40000-{size} to {corpus / 'part-1.jsonl'} bytes 0-{80_000 - size}, "
              f"2 pieces")
    assert len(err) == 1 and err[0].startswith(
        f"note: encoding with tokenizers (what fastokens encoded is encoded again): {FASTOKENS} and tokenizers "
        f"differ on task 1's first texts ({task_1}): text 0 ({backends._excerpt(marker)}) at token 0: fastokens "
        f"gives [")
    assert shard_files(tmp_path / "auto") == shard_files(tmp_path / "reference")
    assert manifest["encoders"] == [TOKENIZERS]
    with pytest.raises(ValueError) as e:
        run(corpus, TOKENIZER, tmp_path / "strict", "fastokens")
    assert str(e.value).startswith(f"--backend fastokens: {FASTOKENS} and tokenizers differ on task 1's first texts "
                                   f"({task_1}): text 0 (")


def test_a_first_batch_of_skipped_rows_does_not_use_up_the_tasks_guard(monkeypatch, tmp_path, capsys):
    """A parquet batch of bad rows only (1,024 null texts, --skip-bad-lines) gave an empty first batch: that was
    the task's guarded batch, so its first real texts were never compared with tokenizers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [None] * 1024 + [f"document {i}: " + "some words here " * 20 for i in range(50)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    run(tmp_path / "in.parquet", TOKENIZER, tmp_path / "reference", "tokenizers", skip_bad_lines=True)
    plant_difference(monkeypatch, "document 0: ")
    manifest = run(tmp_path / "in.parquet", TOKENIZER, tmp_path / "auto", "auto", skip_bad_lines=True)
    err = capsys.readouterr().err
    assert err == (f"note: encoding with tokenizers (what fastokens encoded is encoded again): {FASTOKENS} and "
                   f"tokenizers differ on task 0's first texts ({tmp_path / 'in.parquet'} rows 0-1074): text 0 "
                   f"('document 0: some words here some words h…') at token 0: fastokens gives [70, 80, 68], "
                   f"tokenizers [69, 80, 68] (a fastokens bug: please report it)\n")
    assert shard_files(tmp_path / "auto") == shard_files(tmp_path / "reference")
    assert manifest["encoders"] == [TOKENIZERS]


# ---------------------------------------------------------------- verify --retokenize ---------


def test_verify_retokenize_passes_on_a_dataset_and_names_a_planted_mismatch(corpus, tmp_path):
    from nanoset.format.spec import Manifest
    from nanoset.format.writer import write_manifest

    out = tmp_path / "ds"
    run(corpus, TOKENIZER, out, "auto")
    n = open_dataset(out).num_documents
    ok = run_cli("verify", out, "--retokenize", n)
    assert ok.stdout.splitlines()[1] == (f"OK: {out}: {n} sampled documents re-encoded from their inputs with "
                                         f"{TOKENIZERS}: ids identical to the shards")
    # a corruption whose checksums were recomputed: verify alone cannot see it
    ds = open_dataset(out)
    start, _ = ds.document_bounds(7)
    shard = ds.shards[0]
    tokens = np.fromfile(shard.tokens_path, dtype=ds.dtype)
    was = int(tokens[start + 3])
    tokens[start + 3] = was + 1
    tokens.tofile(shard.tokens_path)
    import hashlib

    manifest = Manifest.load(out)
    manifest.shards[0].sha256["ds"] = hashlib.sha256(shard.tokens_path.read_bytes()).hexdigest()
    manifest.shards[0].max_token_id = max(manifest.shards[0].max_token_id, was + 1)
    write_manifest(out, manifest)
    run_cli("verify", out)
    bad = run_cli("verify", out, "--retokenize", n, check=False)
    assert bad.returncode == 1
    assert bad.stdout.splitlines()[1:] == [f"document 7 (shard {manifest.shards[0].name}): token ids differ first at "
                                           f"position 3: the shard has {was + 1}, re-encoding gives {was}"]
    one_line_error(bad, f"1 of {n} re-encoded documents differ from the shards")


def test_verify_retokenize_of_chats_compares_loss_masks(tmp_path):
    out = tmp_path / "chat"
    run_cli("tokenize", FIXTURES / "chat", "-o", out, "--tokenizer", TOKENIZER, "--chat", "--quiet")
    ds = open_dataset(out)
    start, stop = ds.document_bounds(0)
    loss = np.fromfile(ds.shards[0].loss_path, dtype=np.uint8)
    flip = int(np.flatnonzero(loss[start:stop])[0])
    loss[start + flip] = 0
    loss.tofile(ds.shards[0].loss_path)
    from nanoset.tokenize.retokenize import RetokenizeMismatch, retokenize

    with pytest.raises(RetokenizeMismatch) as e:
        retokenize(out, ds.num_documents)
    assert e.value.lines == [f"document 0 (shard {ds.manifest.shards[0].name}): loss mask bytes differ first at "
                             f"position {flip}: the shard has 0, re-encoding gives 1"]


def test_verify_retokenize_says_in_one_line_that_inputs_are_gone(corpus, tmp_path):
    import shutil

    moved = tmp_path / "corpus"
    shutil.copytree(corpus, moved)
    out = tmp_path / "ds"
    run(moved, TOKENIZER, out, "auto")
    (moved / "part-1.jsonl").unlink()
    proc = run_cli("verify", out, "--retokenize", 1000, check=False)
    one_line_error(proc, f"cannot re-encode: input {moved / 'part-1.jsonl'} is gone")
    proc = run_cli("verify", out, "--retokenize", 0, check=False)
    one_line_error(proc, "--retokenize must be ≥ 1, got 0")


# ---------------------------------------------------------------- tokens declared beside ------


def declared_folder(tmp_path: Path) -> Path:
    """The fixture tokenizer with its added tokens declared only in tokenizer_config.json (as transformers
    reads them), and an ``<image>`` token new to the vocabulary: tokenizers registers them all before
    encoding (``load_tokenizer``), the ``tokenizer.json`` file alone has none."""
    spec = json.loads((TOKENIZER / "tokenizer.json").read_text())
    spec["added_tokens"] = []
    config = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    record = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    config["added_tokens_decoder"] = {str(i): {"content": t, **record}
                                      for i, t in ((0, "<|endoftext|>"), (1492, "<|im_start|>"), (1493, "<|im_end|>"))}
    config["image_token"] = "<image>"
    folder = tmp_path / "declared"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_tokens_declared_beside_tokenizer_json_are_encoded_as_tokenizers_encodes_them(tmp_path):
    """fastokens loaded the bare tokenizer.json: a ``<|im_start|>`` past the guarded first texts became 10
    byte pieces and ``<image>`` 5, silently; it now encodes with the tokens tokenizers registers."""
    from nanoset.tokenize.tokenizer import load_tokenizer

    folder = declared_folder(tmp_path)
    special = "a <|im_start|> b <image> c<|endoftext|>"
    docs = [f"plain text {i} " * 40 for i in range(20)] + [special]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    reference = run(tmp_path / "in.jsonl", folder, tmp_path / "tokenizers", "tokenizers")
    manifest = run(tmp_path / "in.jsonl", folder, tmp_path / "auto", "auto")
    assert manifest["encoders"] == [FASTOKENS] and reference["encoders"] == [TOKENIZERS]
    assert shard_files(tmp_path / "auto") == shard_files(tmp_path / "tokenizers")
    ids = open_dataset(tmp_path / "auto").document(20).tolist()
    assert ids == load_tokenizer(folder / "tokenizer.json").encode(special).ids + [0]
    assert ids == [66, 222, 1492, 290, 222, 1494, 284, 0, 0]  # "<|endoftext|>" in the text, then the EOS

    chats = [{"messages": [{"role": "user", "content": f"look <image> {i}"}, {"role": "assistant", "content": "ok"}]}
             for i in range(30)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    run_cli("tokenize", tmp_path / "chat.jsonl", "-o", tmp_path / "chat-ref", "--tokenizer", folder, "--chat",
            "--quiet", "--backend", "tokenizers")
    proc = run_cli("tokenize", tmp_path / "chat.jsonl", "-o", tmp_path / "chat", "--tokenizer", folder, "--chat",
                   "--quiet", "--backend", "fastokens")
    assert proc.stderr == ""
    assert shard_files(tmp_path / "chat") == shard_files(tmp_path / "chat-ref")
    assert json.loads((tmp_path / "chat" / "nanoset.json").read_text())["encoders"] == [FASTOKENS]
    assert open_dataset(tmp_path / "chat").document(0).tolist().count(1494) == 1


# ---------------------------------------------------------------- fallback across runs --------


def second_task_first_text(corpus: Path) -> str:
    """The first text of task 1 (task_bytes=40_000)."""
    offset = 0
    for line in (corpus / "part-0.jsonl").read_bytes().splitlines(keepends=True):
        if offset >= 40_000:
            return json.loads(line)["text"]
        offset += len(line)
    raise AssertionError("part-0.jsonl is shorter than one task")


def test_a_fallback_another_machine_records_mid_run_redoes_this_runs_tasks_once(monkeypatch, corpus, tmp_path,
                                                                                 capsys):
    """Another machine saw fastokens differ while this one ran: this one redid its own fastokens tasks with
    fastokens again, saw the fallback again, and so on for ever. It now redoes them once, with tokenizers."""
    from nanoset.tokenize import job

    run(corpus, TOKENIZER, tmp_path / "reference", "tokenizers")
    real, passes = job._run_tasks, []

    def run_tasks(todo, plan, folder, *args):
        passes.append(([t.index for t in todo], args[-2]))
        if len(passes) > 3:
            raise AssertionError(f"endless passes: {passes}")
        if len(passes) == 1:  # what the other machine writes into the shared work folder meanwhile
            folder.record_encoder_fallback("fastokens and tokenizers differ on task 0's first texts (planted)")
        return real(todo, plan, folder, *args)

    monkeypatch.setattr(job, "_run_tasks", run_tasks)
    summary = tokenize(TokenizeOptions(inputs=[str(corpus)], output=tmp_path / "out", tokenizer=str(TOKENIZER),
                                       task_bytes=40_000, progress=False, num_tasks=2, task_index=1))
    assert not summary.complete and summary.tasks_run == 1
    assert passes == [([1], "fastokens"), ([1], "tokenizers")]
    assert capsys.readouterr().err == ("note: encoding with tokenizers (what fastokens encoded is encoded again), as "
                                       "another run of this job did: fastokens and tokenizers differ on task 0's "
                                       "first texts (planted)\n")
    monkeypatch.setattr(job, "_run_tasks", real)
    manifest = run(corpus, TOKENIZER, tmp_path / "out", "auto", num_tasks=2, task_index=0)
    assert shard_files(tmp_path / "out") == shard_files(tmp_path / "reference")
    assert manifest["encoders"] == [TOKENIZERS]


def test_a_run_killed_right_after_marking_a_differing_task_done_redoes_it(monkeypatch, corpus, tmp_path):
    """The task whose first texts differ was marked done before the fallback was recorded: killed in between,
    the rerun kept fastokens' (differing) shards of that task. The fallback is now recorded first."""
    from nanoset.tokenize.tasks import OutputFolder

    run(corpus, TOKENIZER, tmp_path / "reference", "tokenizers")
    plant_difference(monkeypatch, second_task_first_text(corpus))
    real = OutputFolder.mark_done

    def mark_done(self, task, result):
        real(self, task, result)
        if task.index == 1:
            raise KeyboardInterrupt  # the kill, between the marker and what follows it

    monkeypatch.setattr(OutputFolder, "mark_done", mark_done)
    with pytest.raises(KeyboardInterrupt):
        run(corpus, TOKENIZER, tmp_path / "out", "auto")
    monkeypatch.setattr(OutputFolder, "mark_done", real)
    manifest = run(corpus, TOKENIZER, tmp_path / "out", "auto")  # fastokens still differs on that text
    assert shard_files(tmp_path / "out") == shard_files(tmp_path / "reference")
    assert manifest["encoders"] == [TOKENIZERS]


def test_a_backend_that_cannot_run_is_refused_before_the_output_folder_is_touched(tmp_path):
    """``--backend fastokens --overwrite`` with a --chat tokenizer whose offsets fastokens cannot give removed
    the complete dataset there, then refused; an unknown backend passed the Python API on a complete one."""
    folder = nfc_tokenizer(tmp_path)
    out = tmp_path / "out"
    options = dict(inputs=[str(FIXTURES / "chat")], output=out, tokenizer=str(folder), chat=True, progress=False)
    tokenize(TokenizeOptions(**options, backend="tokenizers"))
    before = shard_files(out) | {name: (out / name).read_bytes() for name in (MANIFEST_NAME, SHARD_TABLE_NAME)}
    with pytest.raises(ValueError, match="--backend fastokens: --chat needs character offsets"):
        tokenize(TokenizeOptions(**options, backend="fastokens", overwrite=True))
    with pytest.raises(ValueError) as e:
        tokenize(TokenizeOptions(**options, backend="fast"))
    assert str(e.value) == "--backend 'fast': choose one of auto, fastokens, tokenizers"
    assert sorted(p.name for p in out.iterdir()) == sorted(before)
    assert shard_files(out) | {name: (out / name).read_bytes() for name in (MANIFEST_NAME, SHARD_TABLE_NAME)} == before


def test_a_fallback_after_another_machine_finished_says_which_runs_to_rerun(monkeypatch, corpus, tmp_path):
    """Task index 1 finished with fastokens; index 0 then saw fastokens differ: index 1's task must be encoded
    again, but index 0 said 'other task indices still to run', of runs that had all finished."""
    run(corpus, TOKENIZER, tmp_path / "reference", "tokenizers")
    options = dict(inputs=[str(corpus)], output=tmp_path / "out", tokenizer=str(TOKENIZER), task_bytes=40_000,
                   progress=False, num_tasks=2)
    assert not tokenize(TokenizeOptions(**options, task_index=1)).complete
    with monkeypatch.context() as m:
        plant_difference(m, json.loads((corpus / "part-0.jsonl").read_text().splitlines()[0])["text"])
        summary = tokenize(TokenizeOptions(**options, task_index=0))
    assert not summary.complete and summary.line().endswith(
        "; partial: 1 task of other task indices was encoded by fastokens before it was seen to differ: rerun "
        "those task indices to encode it again")
    assert tokenize(TokenizeOptions(**options, task_index=1)).complete
    assert shard_files(tmp_path / "out") == shard_files(tmp_path / "reference")


# ---------------------------------------------------------------- sampling tokenizers ---------


def test_a_tokenizer_with_bpe_dropout_is_encoded_without_it(corpus, tmp_path):
    """``model.dropout: 0.3`` made two runs write other tokens (52,126 then 52,018), auto blamed fastokens ("a
    fastokens bug") and verify --retokenize advised the same random path: it is set off, said in one note, and
    the shards are those of the tokenizer without it, with each backend, on every run."""
    folder = tmp_path / "dropout" / "tokenizer"  # named as the fixture's: the shards' metadata names it
    folder.mkdir(parents=True)
    spec = json.loads((TOKENIZER / "tokenizer.json").read_text())
    spec["model"]["dropout"] = 0.3
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text((TOKENIZER / "tokenizer_config.json").read_text())
    run(corpus, TOKENIZER, tmp_path / "plain", "tokenizers")
    plain = shard_files(tmp_path / "plain")
    note = (f"note: tokenizer {folder / 'tokenizer.json'} sets model.dropout 0.3, which makes its encoding random; it "
            f"is set off (the output is then a function of the input, the same on every run)")
    for backend in ("tokenizers", "tokenizers", "auto", "fastokens"):
        out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
        proc = run_cli("tokenize", corpus, "-o", out, "--tokenizer", folder, "--backend", backend, "--quiet",
                       "--task-bytes", 40_000)
        assert proc.stderr.splitlines() == [note]  # nothing about fastokens differing
        assert shard_files(out) == plain
        assert json.loads((out / "nanoset.json").read_text())["build"]["sampling_off"] == {"model.dropout": 0.3}
    n = open_dataset(out).num_documents
    assert run_cli("verify", out, "--retokenize", n).stdout.splitlines()[1] == (
        f"OK: {out}: {n} sampled documents re-encoded from their inputs with {TOKENIZERS}: ids identical to the "
        f"shards (the tokenizer's model.dropout 0.3 set off, as tokenize does)")



# ---------------------------------------------------------------- the registry ----------------


class ToyEncoder:
    """A registered fast backend of the tests: the reference's ids, but one higher at the first id of every
    text holding ``marker`` (a planted bug; None: none)."""

    name = "toy"
    label = "toy 1.0"
    marker: str | None = None

    def __init__(self, reference: backends.TokenizersEncoder) -> None:
        self.reference = reference

    def encode(self, texts, add_special_tokens=True):
        ids, lengths = self.reference.encode(texts, add_special_tokens)
        ids = ids.copy()
        for start, text in zip(np.cumsum(lengths) - lengths, texts):
            if self.marker is not None and self.marker in text:
                ids[start] += 1
        return ids, lengths

    def encode_with_offsets(self, texts):
        return self.reference.encode_with_offsets(texts)

    def added_tokens(self):
        return [t.content for t in self.reference.tok.get_added_tokens_decoder().values()]


@pytest.fixture
def toy_only(monkeypatch):
    """The registry holding the toy backend alone (so ``auto`` takes it)."""
    monkeypatch.setattr(backends, "FAST_BACKENDS", {})
    backends.register_backend(backends.FastBackend("toy", lambda: True, "toy is not installed",
                                                   lambda path, chat, reference: ToyEncoder(reference())))
    assert backends.backend_names() == ("auto", "toy", "tokenizers")


def test_a_registered_backend_encodes_the_job_and_falls_back_where_it_differs(toy_only, monkeypatch, corpus,
                                                                               tmp_path, capsys, tokenizer, eos_id):
    """The job takes a registered backend through the registry alone (``auto`` and ``--backend toy``); its ids
    are checked against the reference like fastokens', and a difference on the probe set makes the job fall back
    (the same shards, tokenizers named in the manifest) or, with ``--backend toy``, stop in one line."""
    reference = run(corpus, TOKENIZER, tmp_path / "reference", "tokenizers")
    assert run(corpus, TOKENIZER, tmp_path / "auto", "auto")["encoders"] == ["toy 1.0"]
    assert run(corpus, TOKENIZER, tmp_path / "named", "toy")["encoders"] == ["toy 1.0"]
    assert capsys.readouterr().err == ""
    assert shard_files(tmp_path / "auto") == shard_files(tmp_path / "named") == shard_files(tmp_path / "reference")
    text = json.loads((corpus / "part-0.jsonl").read_text().splitlines()[0])["text"]
    assert open_dataset(tmp_path / "auto").document(0).tolist() == tokenizer.encode(text).ids + [eos_id]

    emoji = PROBE_TEXTS[8]
    monkeypatch.setattr(ToyEncoder, "marker", emoji)
    manifest = run(corpus, TOKENIZER, tmp_path / "differs", "auto")
    ids = tokenizer.encode(emoji).ids
    difference = (f"toy 1.0 and tokenizers differ on a probe text: text 8 ({backends._excerpt(emoji)}) at token 0: "
                  f"toy gives {[ids[0] + 1] + ids[1:3]}, tokenizers {ids[:3]} (a toy bug: please report it)")
    assert capsys.readouterr().err == f"note: encoding with tokenizers (what toy encoded is encoded again): " \
                                      f"{difference}\n"
    assert shard_files(tmp_path / "differs") == shard_files(tmp_path / "reference")
    assert manifest["encoders"] == reference["encoders"] == [TOKENIZERS]
    with pytest.raises(ValueError) as e:
        run(corpus, TOKENIZER, tmp_path / "strict", "toy")
    assert str(e.value) == f"--backend toy: {difference}; use --backend auto or tokenizers"
