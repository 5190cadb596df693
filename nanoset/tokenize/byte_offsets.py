"""Character offsets from token ids, for a byte-level BPE without a normalizer: each token's bytes, mapped back
to characters with tokenizers' conventions. fastokens gives ids only; these offsets are what let ``--chat``
loss masks use it, equal to the offsets tokenizers reports."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte alphabet, inverted: the character standing for each byte -> the byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_CHAR_BYTE = _bytes_to_unicode()
_SPACE_CHAR = "\u0120"  # "Ġ": the byte alphabet's space
# Rust's char::is_whitespace (Unicode White_Space), which tokenizers' offset trimming uses; not str.isspace
_WHITESPACE = frozenset(map(chr, [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028,
                                  0x2029, 0x202F, 0x205F, 0x3000]))
_SPLITTERS = {"Split", "Digits", "Punctuation"}  # pre-tokenizers that cut the text without changing it


def _spaces(token: str, reverse: bool = False) -> int:
    """How many leading (trailing) characters of ``token`` tokenizers' offset trimming counts as spaces."""
    n = 0
    for c in reversed(token) if reverse else token:
        if c != _SPACE_CHAR and c not in _WHITESPACE:
            break
        n += 1
    return n


@dataclass
class ByteLevelOffsets:
    """Character offsets of a byte-level BPE encoding from its ids alone, as tokenizers reports them.

    Each token covers a run of the text's UTF-8 bytes (its own bytes, in order), so its offsets are the
    characters of its first and last byte: a character split over several tokens gives every piece the
    whole character's span (an emoji in 4 tokens: all ``(6, 7)``), an added token spans its content, and a
    ``ByteLevel`` post-processor with ``trim_offsets`` trims leading and trailing spaces as tokenizers does."""

    nbytes: np.ndarray  # UTF-8 length of each id's text; -1: an id byte-level BPE cannot produce
    lead: np.ndarray | None  # spaces trimmed off the start / end of each id (None: no trimming)
    trail: np.ndarray | None
    keep_prefix_space: bool  # trimming spares one leading space of a first token (add_prefix_space)

    @staticmethod
    def of_tokenizer(config: dict) -> tuple[ByteLevelOffsets | None, str]:
        """The offsets of the tokenizer described by ``config`` (a parsed ``tokenizer.json``), or None and
        why the token bytes do not give them."""
        model = config.get("model") or {}
        if config.get("normalizer") is not None:
            return None, f"its normalizer ({config['normalizer'].get('type')}) moves characters"
        if model.get("type") != "BPE":
            return None, f"a {model.get('type')} model is not byte-level BPE"
        if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") or model.get("dropout"):
            return None, "its BPE model uses subword affixes or dropout"
        pre = config.get("pre_tokenizer") or {}
        steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
        levels = [p for p in steps if p.get("type") == "ByteLevel"]
        if len(levels) != 1 or any(p.get("type") not in _SPLITTERS | {"ByteLevel"} for p in steps):
            return None, "its pre-tokenizer is not byte-level (or changes the text)"
        if levels[0].get("add_prefix_space") or any(p.get("behavior") == "Removed" for p in steps):
            return None, "its pre-tokenizer adds or removes text"
        post = config.get("post_processor") or {}
        procs = post.get("processors", []) if post.get("type") == "Sequence" else [post] if post else []
        if any(p.get("type") not in ("ByteLevel", "TemplateProcessing") for p in procs):
            return None, f"its post-processor ({post.get('type')}) is not one whose offsets are known"
        trims = [p for p in procs if p.get("type") == "ByteLevel" and p.get("trim_offsets")]
        added = config.get("added_tokens") or []
        if any(t.get("lstrip") or t.get("rstrip") for t in added):
            return None, "its added tokens take in surrounding spaces (lstrip/rstrip)"
        vocab: dict[str, int] = model.get("vocab") or {}
        size = 1 + max([*vocab.values(), *(t["id"] for t in added)], default=-1)
        nbytes = np.full(size, -1, dtype=np.int64)
        lead = np.zeros(size, dtype=np.int64)
        trail = np.zeros(size, dtype=np.int64)
        for token, i in vocab.items():
            if all(c in _CHAR_BYTE for c in token):
                nbytes[i] = len(token)
                lead[i], trail[i] = _spaces(token), _spaces(token, reverse=True)
        token_of = {i: token for token, i in vocab.items()} if added else {}
        for t in added:
            content, i = t["content"], t["id"]
            n = len(content.encode("utf-8"))
            if nbytes[i] >= 0 and (bytes(_CHAR_BYTE[c] for c in token_of[i]) != content.encode("utf-8")
                                   or (trims and (lead[i], trail[i]) != (_spaces(content),
                                                                         _spaces(content, reverse=True)))):
                return None, f"its added token {content!r} is also a different vocabulary entry"
            nbytes[i] = n
            lead[i], trail[i] = _spaces(content), _spaces(content, reverse=True)
        if not trims:
            return ByteLevelOffsets(nbytes, None, None, False), ""
        return ByteLevelOffsets(nbytes, lead, trail, bool(trims[0].get("add_prefix_space"))), ""

    def of(self, texts: list[str], ids: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
        """Offsets (one ``[start, end)`` row per id, characters of its own text) of ``texts`` encoded as
        ``ids`` (flat) with ``lengths`` ids each; None when the ids do not cover the texts byte for byte."""
        if ids.size and int(ids.max()) >= len(self.nbytes):
            return None
        nb = self.nbytes[ids]
        if nb.size and int(nb.min()) < 0:
            return None
        data = np.frombuffer("".join(texts).encode("utf-8"), dtype=np.uint8)
        chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        char_bounds = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(chars, out=char_bounds[1:])
        token_bounds = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=token_bounds[1:])
        byte_ends = np.cumsum(nb)
        ascii_only = len(data) == char_bounds[-1]
        if ascii_only:
            char_of_byte = None
            doc_byte_bounds = char_bounds
        else:
            starts = (data & 0xC0) != 0x80  # the first byte of each character
            char_of_byte = np.cumsum(starts) - 1
            doc_byte_bounds = np.append(np.flatnonzero(starts), len(data))[char_bounds]
        if not np.array_equal(np.concatenate([[0], byte_ends])[token_bounds], doc_byte_bounds):
            return None
        if char_of_byte is None:
            start, end = byte_ends - nb, byte_ends.copy()
        else:
            start, end = char_of_byte[byte_ends - nb], char_of_byte[byte_ends - 1] + 1
        doc = np.repeat(np.arange(len(texts)), lengths)
        start -= char_bounds[doc]
        end -= char_bounds[doc]
        if self.lead is not None:
            lead, trail = self.lead[ids], self.trail[ids]
            if self.keep_prefix_space:
                first = (np.arange(len(ids)) == token_bounds[doc]) | (start == 0)
                lead = np.where(first & (lead == 1), 0, lead)
            start = np.where(lead > 0, np.minimum(start + lead, end), start)
            end = np.where((trail > 0) & (end >= trail), np.maximum(end - trail, start), end)
        return np.stack([start, end], axis=1)


# ---------------------------------------------------------------- choosing and guarding -------
