"""``python -m runtime.explain --config CFG [--checkpoint CKPT] --step N [--json]``: where a step's data comes from.

Computed without training: the stage, then every sample of the global batch in global order
(the order the trainer uses) with its dataset folder, window (or packed sample) index, epoch,
shards, token range, document ids, the labels that count in the loss (``loss_tokens``), and the
batch's ``data_hash`` (the one in ``metrics.jsonl``). Answers "what
did the model see at step N?". With ``--checkpoint``, the run is the one resuming from that
checkpoint with this config: the past comes from the checkpoint's record, as in the trainer. The surgery is
every one the run holds, as the trainer's: the config's, the run folder's rewinds and the one the checkpoint
(without ``--checkpoint``: the run's latest) records.

``--steps A:B`` explains every step of a range at once; ``--document FOLDER:DOC`` (or ``--documents
FILE``, one ``FOLDER:DOC`` a line) answers the reverse question: which steps, positions and samples
held any token of document ``DOC`` of ``FOLDER``, in the whole run. ``--suspects STEP`` lists a spike's
samples ranked by loss and the command that excises them (``runtime/cli/suspects.py``).

``--decode`` adds each sample's text (its ids decoded with its dataset's recorded tokenizer; ``--max-chars N``
cuts it). ``nanoset explain`` is this command, with the same options and output.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from nanoset.errors import report_user_errors
from nanoset.stats import recorded_decoder
from runtime.checkpoint.layout import CHECKPOINT_OPTION, LATEST, checkpoints_folder, find_checkpoint, resolve_resume
from runtime.checkpoint.record import read_metadata
from runtime.checkpoint.surgery_log import run_surgery
from runtime.config import ConfigError
from runtime.config.load import load_config
from runtime.config.overrides import add_set_option
from runtime.data.hf_datasets import resolve_stage_folders
from runtime.data.order.adaptive_blend import NotDecided
from runtime.data.order.holdout import holdout_documents, holdout_surgery
from runtime.data.order.plan import DataPlan
from runtime.data.order.provenance import document_steps, explain_step, parse_document
from runtime.data.order.surgery import SURGERY_KEY, Surgery, read_document_lines
from runtime.observe.mixing_log import log_path, read_decisions


def sample_decoders(plan: DataPlan) -> dict[int, Any]:
    """Dataset id → the tokenizer each dataset records (``--decode``); one that cannot be loaded is one line."""
    return {d: recorded_decoder(w.reader, w.folder) for d, w in enumerate(plan.datasets)}


def parse_steps(text: str, train_steps: int) -> tuple[int, int]:
    """``A:B`` (inclusive) inside ``[1, train_steps]``."""
    first, sep, last = text.partition(":")
    if not sep or not first.strip().isdigit() or not last.strip().isdigit() or int(first) > int(last):
        raise ConfigError(f"--steps: expected A:B with A ≤ B (steps, both included), got {text!r}")
    first, last = int(first), int(last)
    if first < 1 or last > train_steps:
        raise ConfigError(f"--steps {text}: outside [1, tokens.train_steps={train_steps}]")
    return first, last


def main(argv: list[str] | None = None, prog: str = "python -m runtime.explain") -> int:
    """``prog``: the name usage lines give the command (``nanoset explain`` runs this too)."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--checkpoint", help="a checkpoint folder (step-N): explain the run that resumes from it")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--step", type=int)
    what.add_argument("--steps", metavar="A:B", help="every step from A to B (both included)")
    what.add_argument("--document", metavar="FOLDER:DOC", help="every step that held a token of document DOC")
    what.add_argument("--documents", metavar="FILE", help="--document for each FOLDER:DOC line of FILE")
    what.add_argument("--suspects", type=int, metavar="STEP",
                      help="the samples of STEP ranked by loss, from spikes.jsonl (with --checkpoint of STEP - 1: "
                           "recomputed), and the command that excises the top ones")
    ap.add_argument("--top", type=int, help="with --suspects: excise the N highest samples (default: those whose "
                                            "loss is above the step's)")
    ap.add_argument("--json", action="store_true", help="print a JSON list, one object per sample (or per hit)")
    ap.add_argument("--decode", action="store_true",
                    help="each sample's text too, decoded with its dataset's recorded tokenizer (--json: 'text')")
    ap.add_argument("--max-chars", type=int, metavar="N", help="with --decode: cut each text to N characters")
    add_set_option(ap)
    args = ap.parse_args(argv)
    return report_user_errors(lambda: explain(args.config, args.checkpoint, args.step, args.json, args.steps,
                                              args.document, args.documents, args.overrides, args.decode,
                                              args.max_chars, args.suspects, args.top))


def explain(config_path: str, checkpoint: str | None, step: int | None, as_json: bool, steps: str | None = None,
            document: str | None = None, documents: str | None = None, overrides: list[str] | None = None,
            decode: bool = False, max_chars: int | None = None, suspects: int | None = None,
            top: int | None = None) -> int:
    _check_decode(decode, max_chars, document is not None or documents is not None)
    config = load_config(config_path, overrides or ())
    queries = _queries(document, documents)  # before any data is opened: a typo costs nothing
    if suspects is not None and not 1 <= suspects <= config.tokens.train_steps:
        raise ConfigError(f"--suspects {suspects}: outside [1, tokens.train_steps={config.tokens.train_steps}]")
    first, last = parse_steps(steps, config.tokens.train_steps) if steps is not None else (step, step)
    log = log_path(config.general.run_path)  # an adaptive stage's decisions: the run's log
    plan = DataPlan(config, resolve_stage_folders(config), surgery=Surgery(), decisions=read_decisions(log))
    # the config's, what the run folder records and the held-out documents: the order the run trains
    surgery = run_surgery(config).union(holdout_surgery(holdout_documents(config, plan)))
    path = find_checkpoint(checkpoint, CHECKPOINT_OPTION) if checkpoint else None
    # and what a checkpoint records (a surgery since removed from the config still holds): the one given, else the
    # run's latest, which a resume of the run would apply
    recorded = path if path is not None else resolve_resume(checkpoints_folder(config), LATEST)
    if recorded is not None:
        record = read_metadata(recorded, model=False)
        if path is not None:
            plan = plan.resumed_from(path, record.training)
        surgery = surgery.union(Surgery.from_json(record.extensions.get(SURGERY_KEY), f"{recorded}: surgery"))
    if surgery:
        plan = plan.with_surgery(surgery)
    try:
        if suspects is not None:
            from runtime.cli.suspects import logged_spike, print_suspects, recomputed_spike

            row = (recomputed_spike(config, plan, path, suspects) if path is not None
                   else logged_spike(config, suspects))
            source = f"recomputed from {path}" if path is not None else f"{config.general.run_path}/spikes.jsonl"
            return print_suspects(config, row, source, top, as_json)
        if queries is not None:
            open_part = plan.undecided()
            if open_part is not None:
                raise NotDecided(f"stage {open_part[0].name!r} is adaptive and decided up to step {open_part[1] - 1}")
            return _print_hits(document_steps(plan, queries), queries, config.tokens.train_steps, as_json)
        return _print_steps(plan, first, last, as_json, sample_decoders(plan) if decode else None, max_chars)
    except NotDecided as e:
        where = "it does not exist" if not log.is_file() else "it holds no later decision"
        raise ConfigError(f"{e}; its decisions are read from {log} ({where}): explain a run after it trained "
                          f"those steps, with its run folder (general.run_dir)") from None
    except BrokenPipeError:  # the reader went away (`| head`): stop, as a process a closed pipe ends does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush has nowhere to fail
        return 128 + signal.SIGPIPE


def _check_decode(decode: bool, max_chars: int | None, reverse: bool) -> None:
    if max_chars is not None and not decode:
        raise ConfigError(f"--max-chars {max_chars}: it cuts the texts of --decode; add --decode")
    if max_chars is not None and max_chars < 1:
        raise ConfigError(f"--max-chars {max_chars}: expected a number of characters ≥ 1")
    if decode and reverse:
        raise ConfigError("--decode: it decodes the samples of --step/--steps; for a document, see it whole with "
                          "nanoset inspect FOLDER --document N")


def _print_steps(plan: DataPlan, first: int, last: int, as_json: bool, decoders: dict[int, Any] | None = None,
                 max_chars: int | None = None) -> int:
    """Step by step: a long range holds one step's rows at a time, and a pipe reads them as they come."""
    out = sys.stdout
    if as_json:  # the text of json.dumps of the whole list, written a step at a time
        out.write("[")
    for step in range(first, last + 1):
        of_step = explain_step(plan, step, decoders, max_chars)
        if as_json:
            out.write(("" if step == first else ", ") + ", ".join(json.dumps(r) for r in of_step))
            continue
        skipped = " (skipped by surgery: read, not trained)" if of_step[0]["skipped"] else ""
        out.write(f"step {step}: stage {of_step[0]['stage']!r}, {len(of_step)} samples, data_hash "
                  f"{of_step[0]['data_hash']}{skipped}\n")
        for r in of_step:
            docs = r["documents"]
            doc_text = f"{docs[0]}..{docs[-1]}" if len(docs) > 2 else ",".join(map(str, docs))
            out.write(f"  {r['position']:>5}  {r['dataset']}  sample {r['sample']}  epoch {r['epoch']}  "
                      f"tokens [{r['tokens'][0]}, {r['tokens'][1]})  shards {','.join(r['shards'])}  documents "
                      f"{doc_text}  loss_tokens {r['loss_tokens']}\n")
            if "text" in r:
                out.write("".join(f"         | {line}\n" for line in r["text"].split("\n")))
    if as_json:
        out.write("]\n")
    return 0


def _queries(document: str | None, documents: str | None) -> list[tuple[str, int]] | None:
    if document is not None:
        return [parse_document(document)]
    if documents is None:
        return None
    out = [(folder, int(doc)) for folder, doc in read_document_lines(documents, "--documents")]
    return list(dict.fromkeys(out))  # a document listed twice is reported once


def _print_hits(hits: list[dict], queries: list[tuple[str, int]], train_steps: int, as_json: bool) -> int:
    if as_json:
        print(json.dumps(hits))
        return 0
    for folder, doc in queries:
        name = f"{folder}:{doc}"
        mine = [h for h in hits if h["document"] == name]
        if not mine:
            print(f"document {name}: in no step of 1-{train_steps}")
            continue
        steps = sorted({h["step"] for h in mine})
        print(f"document {name}: {len(mine)} samples in {len(steps)} steps (first {steps[0]}, last {steps[-1]})")
        for h in mine:
            skipped = "  (skipped by surgery: read, not trained)" if h["skipped"] else ""
            print(f"  step {h['step']:>7}  position {h['position']:>5}  {h['stage']}  {h['dataset']}  sample "
                  f"{h['sample']}  epoch {h['epoch']}  tokens [{h['tokens'][0]}, {h['tokens'][1]}){skipped}")
    return 0
