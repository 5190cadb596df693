"""`nanoset tokenize --chat`: exact ids and loss masks, the char→token rule, determinism, resume, and
the loss masks through the reader, `inspect` and `verify` (bad input: test_chat_bad_input.py)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from nanoset import open_dataset
from nanoset.errors import NanosetError
from nanoset.format.writer import ShardWriter
from nanoset.tokenize.chat import token_loss_mask
from tests.support import FIXTURES, TOKENIZER, run_cli
from tests.support.datasets import same_folder

CHAT = FIXTURES / "chat"
IM_START, IM_END = 1492, 1493


def fixture_conversations() -> list[list[dict]]:
    """The chat fixture read without nanoset, in corpus order (jsonl messages, then parquet prompt/completion)."""
    import pyarrow.parquet as pq

    convs = [json.loads(line)["messages"] for line in (CHAT / "chat-000.jsonl").read_text().splitlines()]
    table = pq.read_table(CHAT / "chat-001.parquet").to_pylist()
    return convs + [[{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["completion"]}]
                    for r in table]


def reference(tokenizer, eos_id: int, messages: list[dict]) -> tuple[list[int], list[int]]:
    """ChatML written piece by piece: each assistant content plus its '<|im_end|>\\n' is trained on; a token
    counts when any of its characters does; EOS appended (trained after an assistant turn)."""
    text, spans = "", []
    for m in messages:
        text += f"<|im_start|>{m['role']}\n"
        if m["role"] == "assistant":
            spans.append((len(text), len(text) + len(m["content"]) + len("<|im_end|>\n")))
        text += m["content"] + "<|im_end|>\n"
    enc = tokenizer.encode(text, add_special_tokens=False)
    mask = [int(any(s < b and e > a for a, b in spans)) for s, e in enc.offsets]
    return enc.ids + [eos_id], mask + [int(messages[-1]["role"] == "assistant")]


@pytest.fixture(scope="module")
def chat_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("chat") / "chat"
    run_cli("tokenize", CHAT, "-o", out, "--tokenizer", TOKENIZER, "--chat", "--task-bytes", 20_000, "--quiet")
    return out


def test_fixture_stream_and_masks_equal_the_reference(chat_dataset, tokenizer, eos_id):
    ds = open_dataset(chat_dataset)
    convs = fixture_conversations()
    assert ds.num_documents == len(convs) == 500 and len(ds.shards) > 3 and ds.has_loss_masks
    ids, masks = zip(*(reference(tokenizer, eos_id, c) for c in convs))
    np.testing.assert_array_equal(ds.tokens(0, ds.num_tokens), np.concatenate(ids))
    np.testing.assert_array_equal(ds.loss_mask(0, ds.num_tokens), np.concatenate(masks))
    manifest = json.loads((chat_dataset / "nanoset.json").read_text())
    template = json.loads((TOKENIZER / "tokenizer_config.json").read_text())["chat_template"]
    import hashlib

    assert manifest["loss_masks"] is True
    assert manifest["chat_template_sha256"] == hashlib.sha256(template.encode()).hexdigest()
    assert sum(s["loss_tokens"] for s in manifest["shards"]) == int(np.concatenate(masks).sum())
    assert all("loss" in s["sha256"] for s in manifest["shards"])


def test_exact_ids_and_mask_of_a_tiny_conversation(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Yes."}]}) + "\n")
    run_cli("tokenize", tmp_path / "in.jsonl", "-o", tmp_path / "out", "--tokenizer", TOKENIZER, "--chat", "--quiet")
    ds = open_dataset(tmp_path / "out")
    nl = 200  # "\n"
    assert ds.document(0).tolist() == [IM_START, 84, 90, 715, 70, 78, nl, 311, 290, 372, 375, 15, IM_END, nl,
                                       IM_START, 331, 264, nl, 41, 74, IM_END, nl,
                                       IM_START, 288, 84, 576, nl, 58, 281, 15, IM_END, nl, 0]
    # trained: "Yes." <|im_end|> "\n" and the appended EOS
    assert ds.loss_mask(0, ds.num_tokens).tolist() == [0] * 27 + [1] * 6


def test_char_to_token_rule_at_boundaries():
    """A token is trained when any of its characters lies in a span (transformers ≥ 5's assistant mask)."""
    offsets = np.array([(0, 2), (2, 5), (5, 6), (6, 6), (6, 9), (9, 9)])
    # span [3, 6): the token at (2, 5) straddles its start: 1 (the first-character rule gave it 0); (5, 6) is
    # inside; the empty token at 6 is outside; span [6, 9) takes the token (6, 9), and the empty one at 9 is out
    assert token_loss_mask(offsets, [(3, 6)]).tolist() == [0, 1, 1, 0, 0, 0]
    assert token_loss_mask(offsets, [(3, 6), (6, 9)]).tolist() == [0, 1, 1, 0, 1, 0]
    assert token_loss_mask(offsets, [(0, 1), (8, 10)]).tolist() == [1, 0, 0, 0, 1, 1]
    # an empty token strictly inside a span is in it; one at a span's edge is not
    assert token_loss_mask(np.array([(4, 4), (3, 3), (6, 6)]), [(3, 6)]).tolist() == [1, 0, 0]
    assert token_loss_mask(offsets, []).tolist() == [0] * 6


def chat_folder(tmp_path, template: str, messages: list[dict]):
    """Tokenize one conversation with a template given as text; the folder's reader."""
    (tmp_path / "t.jinja").write_text(template)
    (tmp_path / "in.jsonl").write_text(json.dumps({"messages": messages}) + "\n")
    run_cli("tokenize", tmp_path / "in.jsonl", "-o", tmp_path / "out", "--tokenizer", TOKENIZER, "--chat",
            "--chat-template", tmp_path / "t.jinja", "--quiet", "--overwrite")
    return open_dataset(tmp_path / "out")


def test_straddling_and_multibyte_tokens_in_a_real_encoding(tmp_path, tokenizer):
    # plain-text markers: "assistant: world" encodes as ... ":" "Ġwor" "ld": "Ġwor" holds the template's space
    # and the content's "wor": it is the answer's first token, trained (the first-character rule left it out)
    ds = chat_folder(tmp_path, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
                     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "world, 日本é"}])
    pieces = [tokenizer.id_to_token(i) for i in ds.document(0).tolist()]
    assert pieces == ["us", "er", ":", "Ġ", "H", "i", "Ċ", "as", "s", "istant", ":", "Ġwor", "ld", ",", "Ġ",
                      "æ", "Ĺ", "¥", "æ", "ľ", "¬", "Ã", "©", "Ċ", "<|endoftext|>"]  # 日, 本, é: byte tokens
    assert ds.loss_mask(0, ds.num_tokens).tolist() == [0] * 11 + [1] * 14

    # no separators: "Hi" + " wo" + "rld" encodes as "H" "i" "Ġwor" "ld": "Ġwor" starts in the assistant's
    # content and ends in the next (user) message: it is trained; the EOS after a final user turn is not
    ds = chat_folder(tmp_path, "{% for m in messages %}{{ m['content'] }}{% endfor %}",
                     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " wo"},
                      {"role": "user", "content": "rld"}])
    assert [tokenizer.id_to_token(i) for i in ds.document(0).tolist()] == ["H", "i", "Ġwor", "ld", "<|endoftext|>"]
    assert ds.loss_mask(0, ds.num_tokens).tolist() == [0, 0, 1, 0, 0]


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_offsets_are_characters_for_wordpiece_and_unigram_tokenizers(kind):
    """Spans are character positions in the rendered text; the encoding's offsets must be too, through a
    normalizer that changes the text (accents stripped, lowercased; NFKC) and a Metaspace pre-tokenizer, with
    multi-byte characters before the span (byte offsets would shift the mask right by their extra bytes)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from nanoset.tokenize.backends import TokenizersEncoder
    from nanoset.tokenize.chat import RenderedChat, encode_chats
    from nanoset.tokenize.chat_template import ChatRenderer, ChatTemplate

    if kind == "wordpiece":
        words = ["<unk>", "user", "assistant", "naive", "cafe", "日", "本", "resume", "world"]
        tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        answer = [("assistant", 0), ("resume", 1), ("日", 1), ("本", 1), ("world", 1), ("<|im_end|>", 1), ("<eos>", 1)]
    else:
        pieces = ["<unk>", "▁", "\n", "user", "assistant", "▁café", "▁日本", "Résumé", "▁world", "ï"]
        tok = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=0))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        answer = [("assistant", 0), ("\n", 0), ("Résumé", 1), ("▁日本", 1), ("▁world", 1), ("<|im_end|>", 1),
                  ("▁", 1), ("\n", 1), ("<eos>", 1)]
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<eos>"])
    chatml = json.loads((TOKENIZER / "tokenizer_config.json").read_text())["chat_template"]
    text, spans = ChatRenderer(ChatTemplate(chatml, "t"), {}).render_with_spans(
        [{"role": "user", "content": "naïve café 日本 🤖"}, {"role": "assistant", "content": "Résumé 日本 world"}])
    ids, loss, _ = encode_chats(TokenizersEncoder(tok), [RenderedChat(text, tuple(spans), True)],
                                tok.token_to_id("<eos>"))
    got = [(tok.id_to_token(i), m) for i, m in zip(ids.tolist(), loss.tolist())]
    assert got[-len(answer):] == answer and sum(loss) == sum(m for _, m in answer)


def test_empty_assistant_content_and_template_ending_with_eos(tmp_path):
    ds = chat_folder(tmp_path, json.loads((TOKENIZER / "tokenizer_config.json").read_text())["chat_template"],
                     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}])
    assert ds.document(0).tolist() == [IM_START, 331, 264, 200, 41, 74, IM_END, 200, IM_START, 288, 84, 576, 200,
                                       IM_END, 200, 0]
    assert ds.loss_mask(0, ds.num_tokens).tolist() == [0] * 13 + [1] * 3
    # a template that writes eos_token itself: no second EOS is appended, and that one is trained
    ds = chat_folder(tmp_path, "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}"
                               "{{ eos_token }}{% endif %}{% endfor %}",
                     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " world"}])
    assert ds.document(0).tolist() == [41, 74, 383, 669, 0] and ds.loss_mask(0, 5).tolist() == [0, 0, 1, 1, 1]


def test_prompt_completion_parquet_and_hf_inputs_equal_jsonl(tmp_path):
    datasets = pytest.importorskip("datasets")
    convs = fixture_conversations()[:40]
    (tmp_path / "a").mkdir()
    with open(tmp_path / "a" / "x.jsonl", "w") as f:
        for c in convs:
            f.write(json.dumps({"messages": c}) + "\n")
    datasets.Dataset.from_dict({"messages": convs}).to_parquet(str(tmp_path / "x.parquet"))
    datasets.Dataset.from_dict({"conv": convs}).save_to_disk(str(tmp_path / "hf"))
    inputs = ((tmp_path / "a", []), (tmp_path / "x.parquet", []), (tmp_path / "hf", ["--messages-column", "conv"]))
    for inp, extra in inputs:
        run_cli("tokenize", inp, "-o", tmp_path / f"out-{inp.name}", "--tokenizer", TOKENIZER, "--chat", "--quiet",
                *extra)
    ref = open_dataset(tmp_path / "out-a")
    for name in ("x.parquet", "hf"):
        ds = open_dataset(tmp_path / f"out-{name}")
        np.testing.assert_array_equal(ds.tokens(0, ds.num_tokens), ref.tokens(0, ref.num_tokens))
        np.testing.assert_array_equal(ds.loss_mask(0, ds.num_tokens), ref.loss_mask(0, ref.num_tokens))


def test_workers_give_byte_identical_folders(tmp_path, chat_dataset):
    run_cli("tokenize", CHAT, "-o", tmp_path / "w3", "--tokenizer", TOKENIZER, "--chat", "--task-bytes", 20_000,
            "--workers", 3, "--quiet")
    assert same_folder(chat_dataset, tmp_path / "w3")


def test_max_tokens_per_shard_cuts_masks_with_their_tokens(tmp_path, chat_dataset):
    run_cli("tokenize", CHAT, "-o", tmp_path / "small", "--tokenizer", TOKENIZER, "--chat", "--task-bytes", 20_000,
            "--max-tokens-per-shard", 1000, "--quiet")
    ds, ref = open_dataset(tmp_path / "small"), open_dataset(chat_dataset)
    assert len(ds.shards) > 25 and all(s.num_tokens <= 1000 for s in ds.shards)
    np.testing.assert_array_equal(ds.tokens(0, ds.num_tokens), ref.tokens(0, ref.num_tokens))
    np.testing.assert_array_equal(ds.loss_mask(0, ds.num_tokens), ref.loss_mask(0, ref.num_tokens))
    assert run_cli("verify", tmp_path / "small").stdout.startswith("OK")


def test_worker_killed_then_rerun_equals_uninterrupted(tmp_path, chat_dataset):
    out = tmp_path / "killed"
    args = ["tokenize", CHAT, "-o", out, "--tokenizer", TOKENIZER, "--chat", "--task-bytes", 20_000, "--workers", 2,
            "--quiet"]
    proc = run_cli(*args, check=False, env={"NANOSET_FAULT_KILL_TASK": "3"})
    assert proc.returncode == 1 and "task 3 (" in proc.stderr and not (out / "nanoset.json").exists()
    stale = out / ".00003_00000.ds.loss.partial-99999"  # what a kill in the middle of task 3 leaves
    stale.write_bytes(b"\x01\x00")
    rerun = run_cli(*args)
    assert "already done)" in rerun.stdout and not stale.exists()
    assert same_folder(chat_dataset, out)


def test_writer_keeps_the_loss_mask_under_a_temporary_name_until_finalize(tmp_path):
    with ShardWriter(tmp_path, "s", np.uint16, "tok", loss_masks=True) as w:
        w.add_documents(np.array([5, 6, 0, 7, 0]), np.array([3, 2]), np.array([0, 1, 1, 0, 1]))
        assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == []
        with pytest.raises(NanosetError, match="loss mask needs one 0/1 value per token id"):
            w.add_documents(np.array([1, 0]), np.array([2]), np.array([1, 2]))
        info = w.finalize()
    assert (tmp_path / "s.ds.loss").read_bytes() == bytes([0, 1, 1, 0, 1]) and info.loss_tokens == 3
    assert sorted(info.sha256) == ["ds", "index", "loss", "metadata"]
    with ShardWriter(tmp_path, "t", np.uint16, "tok") as plain, pytest.raises(NanosetError, match="without loss_masks"):
        plain.add_documents(np.array([1, 0]), np.array([2]), np.array([0, 1]))
    assert not list(tmp_path.glob(".t*"))  # aborted: temporary files removed


def test_reader_api(chat_dataset, fixture_dataset):
    ds = open_dataset(chat_dataset)
    a, b = int(ds.token_offsets[1]), int(ds.token_offsets[2])
    inside = ds.loss_mask(a + 1, b - 1)
    assert inside.dtype == np.uint8 and isinstance(inside.base, (memoryview, np.ndarray)) and not inside.flags.owndata
    across = ds.loss_mask(a - 5, a + 5)
    files = [np.fromfile(chat_dataset / f"{s.name}.ds.loss", "u1") for s in ds.shards[:2]]
    assert across.flags.owndata and across.tolist() == files[0][-5:].tolist() + files[1][:5].tolist()
    assert inside.tolist() == files[1][1:-1].tolist()
    plain = open_dataset(fixture_dataset)
    assert not plain.has_loss_masks and plain.loss_mask(0, 10) is None


def test_inspect_and_verify_chat_folder(chat_dataset, tokenizer, eos_id, tmp_path):
    convs = fixture_conversations()
    masks = [reference(tokenizer, eos_id, c)[1] for c in convs]
    st = json.loads(run_cli("inspect", chat_dataset, "--json", "--samples", 2).stdout)
    trained = sum(map(sum, masks))
    assert st["loss_tokens"] == trained and st["loss_share"] == round(trained / st["num_tokens"], 4)
    first = st["samples"][0]
    assert first["loss_tokens"] == sum(masks[0])
    assert first["marked"] == ("<|im_start|>system\nYou are a crowded guide to Alma.<|im_end|>\n<|im_start|>user\n"
                               "Spell the word library backwards.<|im_end|>\n<|im_start|>assistant\n"
                               "[[The word library backwards is yrarbil.<|im_end|>\n<|endoftext|>]]")
    text = run_cli("inspect", chat_dataset, "--samples", 1).stdout
    assert f"loss masks: {trained:,} of {st['num_tokens']:,} tokens trained on" in text
    assert "[[The word library backwards is yrarbil.<|im_end|>" in text
    assert run_cli("verify", chat_dataset).stdout.endswith(
        "(checksums, shard table, index, token ids, EOS and loss masks)\n")

    bad = tmp_path / "bad"
    shutil.copytree(chat_dataset, bad)
    loss = bad / f"{open_dataset(bad).shards[1].name}.ds.loss"
    data = bytearray(loss.read_bytes())
    data[7] = 2
    loss.write_bytes(bytes(data))
    proc = run_cli("verify", bad, check=False)
    assert proc.returncode == 1 and f"{loss}: sha256" in proc.stderr
    manifest = json.loads((bad / "nanoset.json").read_text())
    manifest["shards"][1]["sha256"]["loss"] = __import__("hashlib").sha256(bytes(data)).hexdigest()
    (bad / "nanoset.json").write_text(json.dumps(manifest))
    proc = run_cli("verify", bad, check=False)
    assert f"{loss}: loss mask value 2 at token 7; only 0 and 1 are valid" in proc.stderr
    loss.write_bytes(bytes(data[:-1]))
    proc = run_cli("inspect", bad, check=False)
    assert proc.stderr == (f"error: {loss}: {len(data) - 1} bytes, expected {len(data)}; the file is truncated or "
                           f"replaced (run `nanoset verify {bad}`)\n")


def test_datatrove_folder_with_loss_files(chat_dataset, tmp_path):
    dt = tmp_path / "dt"
    shutil.copytree(chat_dataset, dt)
    (dt / "nanoset.json").unlink()
    ref, ds = open_dataset(chat_dataset), open_dataset(dt)
    assert ds.format == "datatrove" and ds.has_loss_masks
    np.testing.assert_array_equal(ds.loss_mask(0, ds.num_tokens), ref.loss_mask(0, ref.num_tokens))
    st = json.loads(run_cli("inspect", dt, "--json").stdout)
    assert st["loss_tokens"] == int(ref.loss_mask(0, ref.num_tokens).sum())
    assert run_cli("verify", dt).stdout.endswith("(sizes, index and loss masks (datatrove folder: no checksums))\n")
    missing = dt / f"{ds.shards[2].name}.ds.loss"
    missing.unlink()
    with pytest.raises(NanosetError, match=f"{missing}: missing, while other shards of {dt} have a loss mask"):
        open_dataset(dt)


def copy_with_masks(src, dst, masks: str):
    """A copy of chat folder ``src``: ``masks='none'`` drops the loss masks (a plain folder of the same tokens),
    ``'other'`` flips one mask byte (a re-tokenization with another template), both with a matching manifest."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "nanoset.json").read_text())
    shard = manifest["shards"][0]
    loss = dst / f"{shard['name']}.ds.loss"
    if masks == "none":
        for s in manifest["shards"]:
            (dst / f"{s['name']}.ds.loss").unlink()
            del s["sha256"]["loss"], s["loss_tokens"]
        del manifest["loss_masks"]
    else:
        data = bytearray(loss.read_bytes())
        data[0] ^= 1
        loss.write_bytes(bytes(data))
        shard["sha256"]["loss"] = __import__("hashlib").sha256(bytes(data)).hexdigest()
    (dst / "nanoset.json").write_text(json.dumps(manifest))
    return open_dataset(dst)


def test_fingerprint_covers_loss_masks_only_where_present(chat_dataset, fixture_dataset, tmp_path):
    """Resume and the moved-dataset match compare fingerprints: other masks, or no masks, over the same
    tokens are other data; a plain folder's fingerprint is what it was before masks existed."""
    import hashlib

    def tokens_only(ds):
        payload = [(s.name, s.num_tokens, s.num_documents, s.sha256.get("ds"), s.sha256.get("index"))
                   for s in ds.manifest.shards]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    chat = open_dataset(chat_dataset)
    plain = copy_with_masks(chat_dataset, tmp_path / "plain", "none")
    other = copy_with_masks(chat_dataset, tmp_path / "other", "other")
    assert not plain.has_loss_masks
    assert np.array_equal(plain.tokens(0, plain.num_tokens), chat.tokens(0, chat.num_tokens))
    assert plain.fingerprint == tokens_only(plain) == tokens_only(chat) == tokens_only(other)
    assert open_dataset(fixture_dataset).fingerprint == tokens_only(open_dataset(fixture_dataset))
    assert len({chat.fingerprint, plain.fingerprint, other.fingerprint}) == 3
    assert open_dataset(shutil.copytree(chat_dataset, tmp_path / "copy")).fingerprint == chat.fingerprint
    # datatrove: names and sizes, and the masks' presence
    dt_chat, dt_plain = tmp_path / "dt-chat", tmp_path / "dt-plain"
    shutil.copytree(chat_dataset, dt_chat)
    shutil.copytree(plain.folder, dt_plain)
    (dt_chat / "nanoset.json").unlink()
    (dt_plain / "nanoset.json").unlink()
    assert open_dataset(dt_chat).fingerprint != open_dataset(dt_plain).fingerprint


def test_chat_markers_that_are_not_tokens_are_said_recorded_and_inspected(tmp_path, chat_dataset):
    """A ChatML template over a tokenizer without <|im_start|> as a token split each marker into 7 pieces of
    text without a word, and inspect decoded them back, so it looked right."""
    from tokenizers import Tokenizer

    folder = tmp_path / "tok"
    folder.mkdir()
    spec = json.loads((TOKENIZER / "tokenizer.json").read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in ("<|im_start|>", "<|im_end|>")]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text((TOKENIZER / "tokenizer_config.json").read_text())
    pieces = {m: len(Tokenizer.from_str(json.dumps(spec)).encode(m, add_special_tokens=False).ids)
              for m in ("<|im_start|>", "<|im_end|>")}
    assert pieces == {"<|im_start|>": 10, "<|im_end|>": 9}  # this small vocabulary's pieces
    out = tmp_path / "out"
    proc = run_cli("tokenize", CHAT, "-o", out, "--tokenizer", folder, "--chat", "--quiet", "--backend", "tokenizers")
    assert proc.stderr.splitlines() == [
        f"note: the chat template's markers are not tokens of tokenizer {folder / 'tokenizer.json'}, so each is "
        f"encoded as text, in pieces ('<|im_start|>' into 10, '<|im_end|>' into 9); list them in extra_special_tokens "
        f"of its tokenizer_config.json to make each one token"]
    assert open_dataset(out).manifest.build["chat"]["split_markers"] == [["<|im_start|>", 10], ["<|im_end|>", 9]]
    assert ("  chat markers that are not tokens, encoded as text: '<|im_start|>' in 10 tokens, '<|im_end|>' in 9 "
            "tokens") in run_cli("inspect", out, "--samples", 0).stdout.splitlines()
    # markers that are tokens: nothing said, nothing recorded (chat plans keep their bytes)
    assert "split_markers" not in open_dataset(chat_dataset).manifest.build["chat"]
    assert "chat markers" not in run_cli("inspect", chat_dataset, "--samples", 0).stdout
