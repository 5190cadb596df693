"""Small tokenizers of the kinds real models use, trained on the fixture corpus with the ``tokenizers``
trainers (seconds, nothing downloaded): what tests of the encoder backends run on.

* ``gpt2``: byte-level BPE with GPT-2's regex, ``<|endoftext|>``, and the ChatML tokens;
* ``llama3``: Llama 3's split regex, byte-level BPE without its own regex, ``ignore_merges``, a BOS
  added by a template post-processor;
* ``spm``: SentencePiece-style BPE with byte fallback (``▁`` for spaces, a normalizer that prepends and
  replaces, ``<s>`` added in front);
* ``unigram``: a Unigram model behind NFKC (as T5/ALBERT-style tokenizers);
* ``wordpiece``: BERT's normalizer, pre-tokenizer and ``[CLS] ... [SEP]`` template.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import FIXTURES

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
KINDS = ("gpt2", "llama3", "spm", "unigram", "wordpiece")
CHAT_TOKENS = ["<|im_start|>", "<|im_end|>"]


def corpus_texts(limit: int = 3000) -> list[str]:
    """Texts of the fixture corpus (web and sft JSON lines, conversations' contents), for training."""
    texts = []
    for path in (FIXTURES / "corpus" / "web" / "web-000.jsonl", FIXTURES / "chat" / "chat-000.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            texts += [row["text"]] if "text" in row else [m["content"] for m in row["messages"]]
    extra = ["naïve café — 東京 で 寿司 🍣 🇫🇷 ½ ﬁ Ⅻ", "def f(x):\n\treturn x ** 2\r\n", "1234567890 3.14159"]
    return texts[:limit] + extra * 20


def build(kind: str, folder: Path, vocab_size: int = 2000) -> Path:
    """Train a ``kind`` tokenizer into ``folder/tokenizer.json`` (with a tokenizer_config.json naming its EOS
    and, for gpt2, the ChatML template of the fixtures); returns the folder."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    texts = corpus_texts()
    if kind == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        eos = "<|endoftext|>"
    elif kind == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      special_tokens=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        eos = "<|end_of_text|>"
    elif kind == "spm":
        tok = Tokenizer(models.BPE(byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        bytes_ = [f"<0x{b:02X}>" for b in range(256)]
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      special_tokens=["<unk>", "<s>", "</s>", *bytes_])
        eos = "</s>"
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"],
                                          unk_token="<unk>", show_progress=False)
        eos = "</s>"
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, show_progress=False,
                                            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
        eos = "[SEP]"
    else:
        raise ValueError(kind)
    tok.train_from_iterator(texts, trainer=trainer)
    if kind == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B:1",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    elif kind == "spm":
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                           special_tokens=[("<s>", tok.token_to_id("<s>"))])
    elif kind == "wordpiece":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    if kind == "gpt2":
        tok.add_special_tokens(CHAT_TOKENS)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": eos}
    if kind == "gpt2":
        fixture = json.loads((FIXTURES / "tokenizer" / "tokenizer_config.json").read_text())
        config["chat_template"] = fixture["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config) + "\n")
    return folder
