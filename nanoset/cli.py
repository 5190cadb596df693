"""The ``nanoset`` command: thin wrappers that parse, call the library and print.

A user mistake prints one ``error: ...`` line on stderr and exits 1; never a traceback.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

from nanoset.env import env_number
from nanoset.errors import NEEDS_TORCH, print_error, report_user_errors
from nanoset.tokenize.backends import backend_names


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Nanoset: tokenize corpora into memory-mapped shards, inspect, verify and convert them; train on them,
    explain and evaluate a run, summarize its metrics, export it."""


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("-o", "--output", required=True, help="Output dataset folder (or s3://BUCKET/PATH, gs://...).")
@click.option("--tokenizer", required=True, help="tokenizer.json, a folder holding one, or a locally cached hub name.")
@click.option("--eos-token", default=None,
              help="The EOS token appended to every document (default: the tokenizer's own; this one wins).")
@click.option("--text-column", default="text", show_default=True)
@click.option("--workers", default=1, show_default=True, type=int, help="Worker processes.")
@click.option("--max-tokens-per-shard", default=None, type=int, help="Start a new shard past this many tokens.")
@click.option("--num-tasks", default=None, type=int, help="Split the job across machines (default: $WORLD_SIZE or 1).")
@click.option("--task-index", default=None, type=int, help="This machine's index (default: $RANK or 0).")
@click.option("--task-bytes", default=None, type=int,
              help="Input bytes per task (sets shard boundaries, never the token stream); "
                   "default: chosen from the total input size, at most 2,000 tasks.")
@click.option("--skip-bad-lines", is_flag=True, help="Skip and count malformed rows instead of failing.")
@click.option("--overwrite", is_flag=True, help="Replace an output folder that holds another dataset.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--chat", is_flag=True,
              help="Rows are conversations: render them with the chat template and write loss masks (NAME.ds.loss).")
@click.option("--chat-template", default=None, type=click.Path(dir_okay=False),
              help="A Jinja chat template file (default: chat_template of the tokenizer's tokenizer_config.json).")
@click.option("--messages-column", default="messages", show_default=True,
              help="With --chat: the column of {role, content} message lists.")
@click.option("--prompt-column", default="prompt", show_default=True,
              help="With --chat: rows without a messages column are a prompt (user turn) ...")
@click.option("--completion-column", default="completion", show_default=True,
              help="... and a completion (assistant turn).")
@click.option("--backend", default="auto", show_default=True, type=click.Choice(backend_names()),
              help="The encoder; the output is the same with each. auto: fastokens where it is installed, loads the "
                   "tokenizer and agrees with tokenizers on a probe set, else tokenizers (with a note).")
def tokenize(inputs: tuple[str, ...], output: str, tokenizer: str, eos_token: str | None, text_column: str,
             workers: int, max_tokens_per_shard: int | None, num_tasks: int | None, task_index: int | None,
             task_bytes: int | None, skip_bad_lines: bool, overwrite: bool, quiet: bool, chat: bool,
             chat_template: str | None, messages_column: str, prompt_column: str, completion_column: str,
             backend: str) -> None:
    """Tokenize INPUTS (files, folders, globs) into a Nanoset dataset folder."""
    from nanoset.storage import is_url, location
    from nanoset.tokenize.job import TokenizeOptions
    from nanoset.tokenize.job import tokenize as run

    if is_url(output):
        from nanoset.tokenize.remote_output import tokenize_to_store

        url = location(output)
        run = lambda opts: tokenize_to_store(opts, url)  # noqa: E731
    elif Path(output).is_file():  # what click.Path(file_okay=False) said before URLs were taken
        raise click.BadParameter(f"Directory {output!r} is a file.", param_hint="'-o' / '--output'")
    summary = run(TokenizeOptions(
        inputs=list(inputs), output=Path(output), tokenizer=tokenizer, eos_token=eos_token, text_column=text_column,
        workers=workers, max_tokens_per_shard=max_tokens_per_shard,
        num_tasks=num_tasks if num_tasks is not None else env_number("WORLD_SIZE", 1),
        task_index=task_index if task_index is not None else env_number("RANK", 0),
        overwrite=overwrite, skip_bad_lines=skip_bad_lines, task_bytes=task_bytes, progress=not quiet,
        chat=chat, chat_template=chat_template, messages_column=messages_column, prompt_column=prompt_column,
        completion_column=completion_column, backend=backend,
    ))
    click.echo("\n".join([summary.line(), *summary.details()]))


def dataset_path(text: str) -> Path | str:
    """A dataset argument: a local path, or a URL as it is (``Path`` would fold ``s3://`` into ``s3:/``)."""
    from nanoset.storage import is_url

    return text if is_url(text) else Path(text)


@cli.command()
@click.argument("path", type=dataset_path)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--samples", default=2, show_default=True, type=int, help="Decoded sample documents to show.")
@click.option("--tokenizer", default=None, help="Tokenizer for decoding (default: the one in the manifest).")
@click.option("--document", default=None, type=int, metavar="N",
              help="Print document N (0-based, as explain numbers them) whole and verbatim, with its loss mask "
                   "for chat data.")
def inspect(path: Path | str, as_json: bool, samples: int, tokenizer: str | None, document: int | None) -> None:
    """Statistics, per-shard table and decoded samples of a dataset folder (or one whole document)."""
    from nanoset.stats import collect_document, collect_stats, render_document, render_text

    if document is not None:
        doc = collect_document(path, document, tokenizer=tokenizer)
        click.echo(json.dumps(doc, indent=1) if as_json else render_document(doc))
        return
    stats = collect_stats(path, samples=samples, tokenizer=tokenizer)
    click.echo(json.dumps(stats, indent=1) if as_json else render_text(stats))


@cli.command()
@click.argument("path", type=dataset_path)
@click.option("--retokenize", default=None, type=int, metavar="N",
              help="Also re-encode N sampled documents from the recorded inputs with the tokenizers backend and "
                   "compare them with the shards.")
def verify(path: Path | str, retokenize: int | None) -> None:
    """Check checksums, sizes, index, token ids and EOS of every shard (a full read)."""
    from nanoset.verify import check_retokenize_count, verify_dataset

    if retokenize is not None:
        check_retokenize_count(retokenize)  # before the full read, which may take long
    click.echo(verify_dataset(path))
    if retokenize is not None:
        from nanoset.tokenize.retokenize import RetokenizeMismatch
        from nanoset.tokenize.retokenize import retokenize as run

        try:
            click.echo(run(path, retokenize)[1])
        except RetokenizeMismatch as e:
            for line in e.lines:
                click.echo(line)
            raise


@cli.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output Nanoset dataset folder.")
@click.option("--tokenizer", default=None,
              help="The tokenizer the data was made with, recorded in the manifest (default: the name in the "
                   "datatrove metadata, or 'unknown').")
@click.option("--eos-token", default=None,
              help="The data's EOS token, recorded with --tokenizer (default: the tokenizer's own; this one wins).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output folder.")
def convert(src: Path, output: Path, tokenizer: str | None, eos_token: str | None, overwrite: bool) -> None:
    """Convert SRC (a Megatron PREFIX, a folder of Megatron pairs, or a datatrove folder) into a Nanoset
    folder with a manifest, copying the token ids (no re-tokenizing)."""
    from nanoset.convert import convert as run

    click.echo(run(src, output, tokenizer=tokenizer, eos_token=eos_token, overwrite=overwrite))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
@click.pass_context
def train(ctx: click.Context) -> None:
    """Train: nanoset train --config C [--nproc-per-node N] [--check] [torchrun options] (--help for more)."""
    from runtime.cli.launch import main as launch  # imports torch itself, once its signal handlers are in place

    status = launch(ctx.args)
    from runtime.control.preemption import ignore_stop_signals

    ignore_stop_signals()  # the run has ended: a stop signal during the exit changes nothing
    ctx.exit(status)


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", default=None, type=click.Path(dir_okay=False, path_type=Path), metavar="FILE.png",
              help="Also draw loss, per-source and validation loss, learning rate (and weights) against step "
                   "(matplotlib: the plot extra).")
@click.option("--compare", default=None, type=click.Path(path_type=Path), metavar="RUN_DIR2",
              help="A second run to compare with (e.g. a rewound branch): where the losses part, both summaries, "
                   "overlaid in the plot.")
def metrics(run_dir: Path, as_json: bool, plot: Path | None, compare: Path | None) -> None:
    """A run's summary (and plot) from its metrics.jsonl: per stage steps, tokens, time, losses, sources,
    validation, skipped steps. RUN_DIR: the run's general.run_dir, running or finished."""
    from runtime.observe.metrics_summary import first_difference, render, render_difference, summarize

    runs = [run_dir] + ([compare] if compare is not None else [])
    summaries = [summarize(r) for r in runs]
    difference = first_difference(run_dir, compare) if compare is not None else None
    if plot is not None:
        from runtime.observe.metrics_plot import plot as draw

        draw(run_dir, plot, compare)
    if as_json:
        click.echo(json.dumps(summaries[0] if compare is None else {"runs": summaries, "difference": difference}))
    else:
        texts = [render(s) for s in summaries]
        if difference is not None:
            texts.append(render_difference(str(run_dir), str(compare), difference))
        click.echo("\n\n".join(texts))
    if plot is not None:
        click.echo(f"plot written to {plot}", err=as_json)


_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def _run_tool(ctx: click.Context, module: str) -> None:
    """Run ``runtime.cli.MODULE``'s own ``main`` on the rest of the command line (its options, its output): the
    runtime, and torch, are imported only now; without torch, one line."""
    import importlib

    try:
        status = importlib.import_module(f"runtime.cli.{module}").main(ctx.args, prog=f"nanoset {ctx.info_name}")
    except ImportError as e:
        if e.name is None or e.name.split(".")[0] != "torch":
            raise
        print_error(f"nanoset {ctx.info_name} {NEEDS_TORCH}")
        status = 1
    ctx.exit(status)


@cli.command(context_settings=_PASS_THROUGH)
@click.pass_context
def explain(ctx: click.Context) -> None:
    """Where each sample of a step comes from, or which steps held a document (--help: its options)."""
    _run_tool(ctx, "explain")


@cli.command(context_settings=_PASS_THROUGH)
@click.pass_context
def evaluate(ctx: click.Context) -> None:
    """The validation loss of a checkpoint (--help: its options)."""
    _run_tool(ctx, "validate")


@cli.command(context_settings=_PASS_THROUGH)
@click.pass_context
def export(ctx: click.Context) -> None:
    """A checkpoint as a Hugging Face folder (--help: its options)."""
    _run_tool(ctx, "export")


class Terminated(Exception):
    """SIGTERM (``kill``, a batch system's time limit) arrived: unwind like Ctrl-C, so that the tokenize
    workers are stopped too (they went on writing, orphaned, for as long as their task took)."""


def _terminate(signum: int, frame) -> None:
    raise Terminated


def _click_main() -> int:
    """The command's exit status; Ctrl-C, SIGTERM and click's own usage errors as one line."""
    try:
        status = cli.main(standalone_mode=False)  # a command's ctx.exit(code) comes back as its value
    except Terminated:
        print_error("terminated; rerun the same command to resume")
        return 128 + signal.SIGTERM
    except click.exceptions.Abort as e:  # click turns Ctrl-C (and a stray EOFError) into Abort
        if isinstance(e.__cause__, KeyboardInterrupt):
            print_error("interrupted; rerun the same command to resume")
        else:
            print_error(f"aborted ({e.__cause__!r})" if e.__cause__ else "aborted")
        return 130
    except click.ClickException as e:
        print_error(e.format_message())
        return e.exit_code
    return status if isinstance(status, int) else 0


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(report_user_errors(_click_main))


if __name__ == "__main__":
    main()
