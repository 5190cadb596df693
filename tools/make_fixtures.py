"""Generate the committed fixtures: a small synthetic corpus in several formats and a BPE tokenizer.

    python tools/make_fixtures.py   # rewrites data_fixtures/corpus, data_fixtures/chat and data_fixtures/tokenizer

The text is produced from seeded templates (nothing is downloaded): three datasets with
different styles - ``web`` prose, ``code`` and ``sft`` question/answer pairs - so that blends
and stage switches have something visibly different to train on; and ``chat``, conversations for
``nanoset tokenize --chat`` (outside ``corpus/``, whose files all hold a ``text`` column). The
output is byte-identical on every run (gzip headers carry no time).
"""

from __future__ import annotations

import gzip
import io
import json
import random
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "data_fixtures"

NOUNS = ("river valley harbour library engine garden market bridge forest tower island village mountain "
         "orchard lantern compass archive mill canal meadow station observatory workshop").split()
ADJS = ("quiet ancient bright narrow busy golden hidden northern wooden broad gentle stormy silver "
        "crowded distant careful patient curious").split()
VERBS = ("visited described repaired measured painted guarded crossed studied mapped built opened "
         "remembered admired explored").split()
PEOPLE = ("the miller, the teacher, a traveller, the captain, an old sailor, the mayor, a young engineer, "
          "the librarian, a farmer, the astronomer").split(", ")
PLACES = "Korvath Alma Senn Ivel Dunmore Tarrow Belcastle Orrin Wexley Marrowgate Linden Quay".split()
SEASONS = "spring summer autumn winter".split()
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHAT_TOKENS = ["<|im_start|>", "<|im_end|>"]  # added after training: the ids of the other corpora do not move


def sentence(r: random.Random) -> str:
    t = r.randrange(5)
    a, n, v, p = r.choice(ADJS), r.choice(NOUNS), r.choice(VERBS), r.choice(PLACES)
    who = r.choice(PEOPLE)
    if t == 0:
        return f"In {r.choice(SEASONS)} {who} {v} the {a} {n} near {p}."
    if t == 1:
        return f"The {n} of {p} is {a}, and its {r.choice(NOUNS)} is {r.choice(ADJS)}."
    if t == 2:
        return f"Every year {r.randrange(2, 90)} people walk from {p} to {r.choice(PLACES)} to see the {n}."
    if t == 3:
        return f"{who.capitalize()} said that the {a} {n} was {v} in {r.randrange(1700, 2000)}."
    return f"Beyond the {n} lies {p}, where the {r.choice(NOUNS)} is always {a}."


def web_doc(r: random.Random) -> str:
    title = f"{r.choice(ADJS).capitalize()} {r.choice(NOUNS)}s of {r.choice(PLACES)}"
    paras = [" ".join(sentence(r) for _ in range(r.randrange(2, 6))) for _ in range(r.randrange(1, 4))]
    return title + "\n\n" + "\n\n".join(paras)


def code_doc(r: random.Random) -> str:
    name = f"{r.choice(VERBS)[:-1]}_{r.choice(NOUNS)}"
    args = r.sample(["count", "size", "offset", "limit", "step", "total", "width"], r.randrange(1, 4))
    lines = [f"def {name}({', '.join(args)}):", f'    """Return the {r.choice(ADJS)} {r.choice(NOUNS)} value."""']
    acc = r.choice(["result", "value", "acc"])
    lines.append(f"    {acc} = {r.randrange(0, 10)}")
    for _ in range(r.randrange(1, 4)):
        a = r.choice(args)
        kind = r.randrange(3)
        if kind == 0:
            lines += [f"    for i in range({a}):", f"        {acc} += i * {r.randrange(1, 9)}"]
        elif kind == 1:
            lines += [f"    if {a} > {r.randrange(1, 50)}:", f"        {acc} -= {a}"]
        else:
            lines.append(f"    {acc} = {acc} * {r.randrange(2, 5)} + {a}")
    lines.append(f"    return {acc}")
    return "\n".join(lines) + "\n"


def sft_doc(r: random.Random) -> str:
    kind = r.randrange(3)
    if kind == 0:
        a, b = r.randrange(1, 100), r.randrange(1, 100)
        q, ans = f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    elif kind == 1:
        p, n = r.choice(PLACES), r.choice(NOUNS)
        q, ans = f"Where is the {n} of {p}?", f"The {n} of {p} stands beside the {r.choice(ADJS)} {r.choice(NOUNS)}."
    else:
        w = r.choice(NOUNS)
        q, ans = f"Spell the word {w} backwards.", f"The word {w} backwards is {w[::-1]}."
    return f"### Question:\n{q}\n### Answer:\n{ans}"


def qa_pair(r: random.Random) -> tuple[str, str]:
    kind = r.randrange(4)
    if kind == 0:
        a, b = r.randrange(1, 100), r.randrange(1, 100)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if kind == 1:
        p, n = r.choice(PLACES), r.choice(NOUNS)
        return f"Where is the {n} of {p}?", f"The {n} of {p} stands beside the {r.choice(ADJS)} {r.choice(NOUNS)}."
    if kind == 2:
        w = r.choice(NOUNS)
        return f"Spell the word {w} backwards.", f"The word {w} backwards is {w[::-1]}."
    return f"Tell me about {r.choice(PLACES)}.", " ".join(sentence(r) for _ in range(r.randrange(1, 4)))


def chat_messages(r: random.Random) -> list[dict[str, str]]:
    """A conversation: an optional system prompt, then one to three user/assistant exchanges."""
    messages = []
    if r.random() < 0.5:
        messages.append({"role": "system", "content": f"You are a {r.choice(ADJS)} guide to {r.choice(PLACES)}."})
    for _ in range(r.randrange(1, 4)):
        q, a = qa_pair(r)
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return messages


def make_chat(root: Path) -> None:
    """``chat-000.jsonl`` (messages lists, multi-turn, system prompts) and ``chat-001.parquet`` (prompt and
    completion columns): the conversations of ``nanoset tokenize --chat``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    r = random.Random(4321)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    with open(root / "chat-000.jsonl", "w", encoding="utf-8") as f:
        for i in range(300):
            f.write(json.dumps({"id": f"chat-{i}", "messages": chat_messages(r)}) + "\n")
    pairs = [qa_pair(r) for _ in range(200)]
    pq.write_table(pa.table({"prompt": [q for q, _ in pairs], "completion": [a for _, a in pairs]}),
                   root / "chat-001.parquet", row_group_size=64)


def gzip_text(path: Path, mode: str, encoding: str):
    """A text file written through gzip with no time in its header, so that reruns are byte-identical."""
    return io.TextIOWrapper(gzip.GzipFile(path, mode.replace("t", "b"), mtime=0), encoding=encoding)


def write_jsonl(path: Path, docs: list[str], opener=open) -> None:
    with opener(path, "wt", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": f"{path.stem}-{i}", "text": d}) + "\n")


def write_parquet(path: Path, docs: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": docs, "length": [len(d) for d in docs]})
    pq.write_table(table, path, row_group_size=256)


def write_zst(path: Path, docs: list[str]) -> None:
    import zstandard

    data = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    path.write_bytes(zstandard.ZstdCompressor(level=10).compress(data))


def make_corpus(root: Path) -> None:
    r = random.Random(1234)
    shutil.rmtree(root, ignore_errors=True)
    web, code, sft = root / "web", root / "code", root / "sft"
    for d in (web, code / "files", sft):
        d.mkdir(parents=True)
    write_jsonl(web / "web-000.jsonl", [web_doc(r) for _ in range(1500)])
    write_jsonl(web / "web-001.jsonl.gz", [web_doc(r) for _ in range(1000)], opener=gzip_text)
    write_parquet(web / "web-002.parquet", [web_doc(r) for _ in range(1000)])
    write_zst(code / "snippets-000.jsonl.zst", [code_doc(r) for _ in range(2500)])
    for i in range(20):
        (code / "files" / f"module_{i:02d}.txt").write_text("\n".join(code_doc(r) for _ in range(4)))
    (sft / "sft-000.json").write_text(json.dumps([{"text": sft_doc(r)} for _ in range(1500)], indent=0))
    write_parquet(sft / "sft-001.parquet", [sft_doc(r) for _ in range(1500)])


def all_texts() -> list[str]:
    r = random.Random(1234)
    return [web_doc(r) for _ in range(3500)] + [code_doc(r) for _ in range(2580)] + [sft_doc(r) for _ in range(3000)]


def make_tokenizer(out: Path, vocab_size: int = 4096) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(all_texts(), trainer=trainer)
    tok.add_special_tokens(CHAT_TOKENS)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "chat_template": CHATML_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config) + "\n")


if __name__ == "__main__":
    make_corpus(ROOT / "corpus")
    make_chat(ROOT / "chat")
    make_tokenizer(ROOT / "tokenizer")
    print(f"wrote {ROOT / 'corpus'}, {ROOT / 'chat'} and {ROOT / 'tokenizer'}")
