"""``nanoset inspect``: statistics, a length histogram, a per-shard table and decoded samples
(for data with loss masks also the share of tokens trained on, and samples with trained spans marked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nanoset.errors import NanosetError
from nanoset.format.open import open_dataset
from nanoset.format.reader import NanosetReader, index_problem
from nanoset.format.spec import LOSS_MASK_RULES, SKIPPED_NAME, UNRECORDED, TokenizerInfo

SAMPLE_CHARS = 400
CUT = "…"  # ends a sample cut at SAMPLE_CHARS
OPEN, CLOSE = "[[", "]]"
CHUNK = 1 << 24


def count_loss_tokens(ds: NanosetReader) -> int:
    """Tokens with loss 1: from the manifest when it records them per shard, else counted (a full read)."""
    recorded = ds.manifest.table.loss_tokens if ds.manifest is not None else None
    if recorded is not None and not (recorded == UNRECORDED).any():
        return int(recorded.sum())
    total = 0
    for shard in ds.shards:
        for start in range(0, shard.num_tokens, CHUNK):
            total += int(np.count_nonzero(shard.loss[start : start + CHUNK]))
    return total


def mark_trained(decoder, ids: list[int], loss: np.ndarray) -> str:
    """The decoded document with each run of trained tokens wrapped in ``[[...]]``. Runs are decoded
    apart; the tokens of one character always share its mask, so no character is cut in two."""
    loss = np.asarray(loss, dtype=bool)
    cuts = np.flatnonzero(np.diff(loss.astype(np.int8))) + 1
    out = []
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(ids)]):
        text = decoder.decode(ids[a:b], skip_special_tokens=False)
        out.append(OPEN + text + CLOSE if loss[a] else text)
    return "".join(out)


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending with "…" when it was cut."""
    return text if len(text) <= limit else text[:limit] + CUT


def truncate_marked(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, closing a trained span the cut leaves open, ending with "…"
    when it was cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return (cut + CLOSE if cut.rfind(OPEN) > cut.rfind(CLOSE) else cut) + CUT


def _length_stats(lengths: np.ndarray) -> dict[str, float]:
    q = np.percentile(lengths, [50, 90, 99], method="lower")
    return {"min": int(lengths.min()), "median": int(q[0]), "p90": int(q[1]), "p99": int(q[2]),
            "max": int(lengths.max()), "mean": round(float(lengths.mean()), 2)}


def _histogram(lengths: np.ndarray) -> list[dict[str, int]]:
    """Power-of-two buckets [2^k, 2^(k+1)) of document length in tokens."""
    exps = np.floor(np.log2(lengths)).astype(np.int64)
    counts = np.bincount(exps)
    return [{"lo": 1 << k, "hi": (1 << (k + 1)) - 1, "count": int(c)} for k, c in enumerate(counts) if c]


def _decoder(given: str | None, recorded: TokenizerInfo | None, max_id: int) -> tuple[Any, str | None, str | None]:
    """The tokenizer to decode samples with, or None and why not, and a warning when ``--tokenizer`` is not
    the dataset's: ``--tokenizer`` (an error if it cannot be loaded), else the one the dataset records if it is
    still there unchanged (another file at its path would decode the ids into the wrong text)."""
    from nanoset.tokenize.tokenizer import find_tokenizer_file, load_tokenizer

    if given is not None:
        path = find_tokenizer_file(given)
        tok = load_tokenizer(path)
        return tok, None, _other_vocabulary(given, tok.get_vocab_size(with_added_tokens=True), path, recorded, max_id)
    if recorded is None:
        return None, "tokenizer unknown: pass --tokenizer to decode", None
    try:
        path = find_tokenizer_file(recorded.path or recorded.name)
    except NanosetError:
        return None, "tokenizer not found: pass --tokenizer to decode", None
    if not recorded.matches_file(path):
        return None, (f"{path} is not the tokenizer the data was made with (sha256 differs): pass --tokenizer to "
                      f"decode"), None
    try:
        return load_tokenizer(path), None, None
    except NanosetError:
        return None, f"{path} cannot be loaded: pass --tokenizer to decode", None


def _other_vocabulary(given: str, vocab: int, path: Path, recorded: TokenizerInfo | None, max_id: int) -> str | None:
    """Why ``--tokenizer`` may decode the ids into the wrong text, if it may: ids past its vocabulary, another
    vocabulary size or another tokenizer file than the dataset records."""
    if max_id >= vocab:
        return (f"--tokenizer {given} has {vocab:,} ids, but the data holds id {max_id:,}: it is not the tokenizer "
                f"the data was made with, the samples are garbage")
    if recorded is not None and recorded.vocab_size is not None and recorded.vocab_size != vocab:
        return (f"--tokenizer {given} has {vocab:,} ids, the data's tokenizer {recorded.vocab_size:,}: another "
                f"vocabulary, the samples are likely garbage")
    if recorded is not None and not recorded.matches_file(path):
        return f"--tokenizer {given} is not the tokenizer file the data was made with (sha256 differs)"
    return None


def _document_lengths(ds) -> np.ndarray:
    """Every document's length in tokens; an index whose ends do not increase (a damaged or hand-made
    datatrove shard) is named, as ``verify`` names it, instead of breaking the histogram."""
    parts = []
    for shard in ds.shards:
        lengths = np.diff(np.asarray(shard.ends, dtype=np.int64), prepend=0)
        if problem := index_problem(lengths):
            raise NanosetError(f"{shard.index_path}: {problem}; the shard is corrupt "
                               f"(run `nanoset verify {ds.folder}`)")
        parts.append(lengths)
    return np.concatenate(parts)


def collect_stats(path: Path, samples: int = 2, tokenizer: str | None = None) -> dict[str, Any]:
    """Everything ``inspect`` shows, as plain JSON-able values."""
    if samples < 0:
        raise NanosetError(f"--samples must be ≥ 0, got {samples}")
    ds = open_dataset(path)
    ds.check_sizes()
    lengths = _document_lengths(ds)
    max_id = ds.max_token_id
    tok_info = ds.tokenizer
    decoder, undecoded, decoder_warning = _decoder(tokenizer, tok_info, max_id)
    count = min(samples, ds.num_documents)  # --samples 1000000000 allocated that many positions
    picks = sorted(set(np.linspace(0, ds.num_documents - 1, count).round().astype(int).tolist())) if count else []
    sample_docs = []
    for i in picks:
        ids = np.asarray(ds.document(i)).tolist()
        entry: dict[str, Any] = {"document": i, "num_tokens": len(ids)}
        loss = ds.loss_mask(*ds.document_bounds(i))
        if decoder is not None:
            entry["text"] = truncate(decoder.decode(ids, skip_special_tokens=False), SAMPLE_CHARS)
            if loss is not None:
                entry["marked"] = truncate_marked(mark_trained(decoder, ids, loss), SAMPLE_CHARS)
        else:
            entry["ids"] = ids[:64]
            entry["undecoded"] = undecoded
            if loss is not None:
                entry["loss"] = np.asarray(loss[:64]).tolist()
        if loss is not None:
            entry["loss_tokens"] = int(np.count_nonzero(loss))
        sample_docs.append(entry)
    loss_tokens = count_loss_tokens(ds) if ds.has_loss_masks else None
    return {
        "path": str(path),
        "format": ds.format,
        "num_shards": len(ds.shards),
        "num_tokens": ds.num_tokens,
        "num_documents": ds.num_documents,
        "dtype": ds.dtype.name,  # Megatron data may hold any integer dtype
        "tokenizer": tok_info.name if tok_info else None,
        "vocab_size": tok_info.vocab_size if tok_info else None,
        "eos_id": tok_info.eos_id if tok_info else None,
        "max_token_id": max_id,
        "skipped_lines": ds.manifest.skipped_lines if ds.manifest else None,
        "loss_tokens": loss_tokens,
        "loss_share": round(loss_tokens / ds.num_tokens, 4) if loss_tokens is not None and ds.num_tokens else None,
        "loss_mask_rule": ds.manifest.loss_mask_rule if ds.manifest is not None and ds.has_loss_masks else None,
        # chat markers of the template that the tokenizer encodes in several pieces (tokenize --chat recorded them)
        "split_markers": ((ds.manifest.build.get("chat") or {}).get("split_markers") or []) if ds.manifest else [],
        "skipped_examples": list(ds.manifest.skipped_examples) if ds.manifest else [],
        "decoder_warning": decoder_warning,
        "document_length": _length_stats(lengths) if len(lengths) else None,
        "histogram": _histogram(lengths) if len(lengths) else [],
        "shards": [{"name": s.name, "num_tokens": s.num_tokens, "num_documents": s.num_documents,
                    "bytes": s.num_tokens * s.dtype.itemsize} for s in ds.shards],  # sizes checked above
        "samples": sample_docs,
    }


def _vocab_text(st: dict[str, Any]) -> str:
    if st["vocab_size"] is None:  # datatrove folders and Megatron data record neither vocabulary size nor EOS
        source = "Megatron data" if st["format"] == "megatron" else f"{st['format']} folder"
        return f"vocab unknown ({source}; largest id {st['max_token_id']})   eos unknown"
    return f"vocab {st['vocab_size']}   eos {st['eos_id']}   largest id {st['max_token_id']}"


def render_text(st: dict[str, Any]) -> str:
    """The human-readable report of ``collect_stats``."""
    out = [
        f"{st['path']}  ({st['format']})",
        f"  shards {st['num_shards']:,}   documents {st['num_documents']:,}   tokens {st['num_tokens']:,}",
        f"  dtype {st['dtype']}   tokenizer {repr(st['tokenizer']) if st['tokenizer'] else 'unknown'}   "
        + _vocab_text(st),
    ]
    if st["skipped_lines"]:
        out.append(f"  skipped bad lines while tokenizing: {st['skipped_lines']:,}"
                   + (f" (all of them in {Path(st['path']) / SKIPPED_NAME}); the first:" if st["skipped_examples"]
                      else ""))
        out.extend(f"    {line}" for line in st["skipped_examples"])
    if st.get("loss_tokens") is not None:
        out.append(f"  loss masks: {st['loss_tokens']:,} of {st['num_tokens']:,} tokens trained on "
                   f"({100 * st['loss_share']:.1f}%); samples mark them [[...]]")
        rule = st.get("loss_mask_rule")
        out.append(f"  loss-mask rule {rule}: {LOSS_MASK_RULES.get(rule, 'unknown to this nanoset')}" if rule
                   else "  loss-mask rule: not recorded (masks not made by nanoset tokenize --chat)")
    if st.get("split_markers"):
        out.append("  chat markers that are not tokens, encoded as text: "
                   + ", ".join(f"{m!r} in {n} tokens" for m, n in st["split_markers"]))
    if st["document_length"]:
        dl = st["document_length"]
        out.append("  document length (tokens): " + "  ".join(f"{k} {dl[k]:,}" for k in
                                                              ("min", "median", "p90", "p99", "max", "mean")))
        top = max(h["count"] for h in st["histogram"])
        for h in st["histogram"]:
            bar = "#" * max(1, round(40 * h["count"] / top))
            out.append(f"    {h['lo']:>8,}-{h['hi']:<9,} {h['count']:>10,}  {bar}")
    out.append("  shard                          documents          tokens        bytes")
    for s in st["shards"][:50]:
        out.append(f"  {s['name']:<28} {s['num_documents']:>11,} {s['num_tokens']:>15,} {s['bytes']:>12,}")
    if len(st["shards"]) > 50:
        out.append(f"  ... {len(st['shards']) - 50} more shards (see --json)")
    if st.get("decoder_warning"):
        out.append(f"  warning: {st['decoder_warning']}")
    for smp in st["samples"]:
        body = smp.get("marked", smp.get("text", f"ids {smp.get('ids')} ({smp.get('undecoded')})"))
        trained = f", {smp['loss_tokens']} with loss" if "loss_tokens" in smp else ""
        out.append(f"  --- document {smp['document']:,} ({smp['num_tokens']} tokens{trained}) ---")
        out.extend("  " + line for line in body.splitlines()[:12])
    return "\n".join(out)


def recorded_decoder(ds: NanosetReader, folder: str | Path, given: str | None = None) -> Any:
    """The tokenizer that decodes ``ds`` (``given``, else the one the dataset records), or a ``NanosetError``
    naming the folder and why it cannot be decoded."""
    decoder, undecoded, _ = _decoder(given, ds.tokenizer, ds.max_token_id)
    if decoder is None:
        raise NanosetError(f"{folder}: cannot decode its token ids: {undecoded}")
    return decoder


def collect_document(path: Path, n: int, tokenizer: str | None = None) -> dict[str, Any]:
    """Document ``n`` (0-based, as ``explain`` numbers documents) whole: its ids, its text decoded verbatim (the
    EOS that ends every document left out of ``text``, kept in ``ids``), and for data with loss masks its mask
    and the text with the trained runs in ``[[...]]``."""
    ds = open_dataset(path)
    ds.check_sizes()
    if not 0 <= n < ds.num_documents:
        raise NanosetError(f"--document {n}: {path} has documents 0-{ds.num_documents - 1}")
    decoder, undecoded, warning = _decoder(tokenizer, ds.tokenizer, ds.max_token_id)
    if decoder is None:
        raise NanosetError(f"{path}: cannot decode document {n}: {undecoded}")
    ids = np.asarray(ds.document(n)).tolist()
    eos = ds.tokenizer.eos_id if ds.tokenizer is not None else None
    body = ids[:-1] if ids and eos is not None and ids[-1] == eos else ids
    out: dict[str, Any] = {"path": str(path), "document": n, "num_tokens": len(ids), "ends_with_eos": body != ids,
                           "ids": ids, "text": decoder.decode(body, skip_special_tokens=False),
                           "decoder_warning": warning}
    loss = ds.loss_mask(*ds.document_bounds(n))
    if loss is not None:
        out["loss_mask"] = np.asarray(loss, dtype=np.int64).tolist()
        out["loss_tokens"] = int(np.count_nonzero(loss))
        out["marked"] = mark_trained(decoder, ids, loss)
    return out


def render_document(doc: dict[str, Any]) -> str:
    """``inspect --document``: a header line, the text verbatim and unindented, and for data with loss masks the
    text again with the trained tokens in ``[[...]]``."""
    eos = " + EOS" if doc["ends_with_eos"] else ""
    trained = f", {doc['loss_tokens']} with loss" if "loss_tokens" in doc else ""
    out = [f"--- {doc['path']} document {doc['document']:,} ({doc['num_tokens']} tokens{eos}{trained}) ---"]
    if doc.get("decoder_warning"):
        out.insert(0, f"warning: {doc['decoder_warning']}")
    out.append(doc["text"])
    if "marked" in doc:
        out.append(f"--- loss mask: the {doc['loss_tokens']} tokens trained on in {OPEN}...{CLOSE} (EOS included) ---")
        out.append(doc["marked"])
    return "\n".join(out)
