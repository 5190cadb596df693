"""User errors: one root, and the one wrapper through which every entry point reports them.

A mistake a user can make (a wrong flag, config key or path, damaged data or checkpoint, a full
disk) raises a ``NanosetError`` whose message names the file, key or value and says what to do;
every command prints it as one ``error:`` line and exits 1. Anything else is a bug and keeps its
traceback. Where callers catch a builtin (``FileNotFoundError``, ``FileExistsError``,
``TimeoutError``), the user error keeps it as a second base.
"""

from __future__ import annotations

import errno
import signal
import sys
from collections.abc import Callable
from pathlib import Path

# what a runtime command says without torch, after its name ("nanoset train needs PyTorch, ...")
NEEDS_TORCH = ("needs PyTorch, which is not installed: pip install torch (for the CPU build: pip install torch "
               "--index-url https://download.pytorch.org/whl/cpu)")


class NanosetError(ValueError):
    """A user-facing error: the message names the file, key or value and says what to do."""


class ConfigError(NanosetError):
    """A config mistake: the message names the key path and says what to change."""


class CheckpointError(NanosetError):
    """A checkpoint that is missing, damaged, or does not fit the run: the message names it and what to resume from."""


class RunFolderError(NanosetError):
    """A run folder that is in use by another run, or cannot be written."""


# errors of writing to a file that is open: the machine's (a full disk, a quota, a file size limit), and the
# OSError names no file
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


class WriteFailed(NanosetError):
    """A file that could not be written for want of space (a full disk, a quota): names it and the cause;
    ``resumable``: whether the rerun keeps finished work (a tokenize job does)."""

    def __init__(self, path, reason: str, resumable: bool = False) -> None:
        super().__init__(path, reason, resumable)  # all, so that it pickles across worker processes
        self.path, self.reason, self.resumable = path, reason, resumable

    def __str__(self) -> str:
        return (f"{self.path}: cannot write it ({self.reason}); free some space (or fix the cause) and rerun the "
                f"same command" + (": finished work is kept" if self.resumable else ""))


class FolderNotWritable(NanosetError):
    """A folder that cannot be created, or written in, here (a read-only place, another user's folder, /sys):
    ``unwritable_folder`` words it."""


def unwritable_folder(folder: Path, error: OSError, advice: str) -> FolderNotWritable:
    """The one line for ``error``, met creating ``folder`` (or a folder beside it, or an entry in it): the
    folder, where creating failed and why in the system's words (not an errno line naming a temporary file),
    then ``advice``: what to do, in the caller's terms ("choose another -o folder"), to which the way out of a
    permission error is added."""
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    where = Path(error.filename).parent if error.filename else existing
    if not existing.is_dir():
        reason = "is a file, not a folder" if existing == folder else f"{existing} is a file, not a folder"
    elif where == folder:
        reason = f"cannot write in it ({error.strerror})"
    else:
        reason = f"cannot create it in {where} ({error.strerror})"
    if error.errno in (errno.EACCES, errno.EPERM) and existing.is_dir():
        advice += f", or make {'it' if where == folder else where} writable"
    return FolderNotWritable(f"{folder}: {reason}; {advice}")


class MissingPath(NanosetError, FileNotFoundError):
    """A file or folder the user named (or a run needs) does not exist."""


class OutputExists(NanosetError, FileExistsError):
    """An output that must not exist yet does."""


class WaitTimeout(NanosetError, TimeoutError):
    """Another process holds what this one waits for and shows no sign of life."""


class MissingColumnError(NanosetError):
    """An input lacks the text column. Carries the facts, so a caller (the CLI, or the runtime's
    Hugging Face stages) can name its own option for the column; pickles across worker processes.
    ``conversations``: the columns there are those of conversations (read as text without ``--chat``)."""

    def __init__(self, where: str, column: str, columns: list[str], option: str = "--text-column",
                 conversations: bool = False) -> None:
        super().__init__(where, column, columns, option, conversations)
        self.where, self.column, self.columns, self.option = where, column, list(columns), option
        self.conversations = conversations

    def __str__(self) -> str:
        there = (f"{self.where}: no column {self.column!r}; the columns there are: "
                 f"{', '.join(map(str, self.columns)) or 'none'}")
        if self.conversations:
            return f"{there}, which hold conversations: add --chat (or choose a text column with {self.option})"
        return f"{there} (choose one with {self.option})"


class OptionError(NanosetError):
    """A job option whose value cannot be used: ``option`` names it as ``TokenizeOptions`` does (``tokenizer``,
    ``chat_template``), so a caller with other names for its options (the runtime's config) can name its own."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(option, message)
        self.option, self.message = option, message

    def __str__(self) -> str:
        return self.message


SKIP_HINT = " (pass --skip-bad-lines to skip and count such lines)"  # how the command goes past a bad row


class BadRowError(NanosetError):
    """A malformed input row: ``problem`` names it (file, line, what is wrong); the message adds the command's
    way past it (``SKIP_HINT``), which a caller without that flag (a config) replaces with its own advice.
    Pickles across worker processes."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem

    def __str__(self) -> str:
        return self.problem + SKIP_HINT


# OSErrors that come from the machine, not from a bug: said in one line (they name the path)
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EMFILE,
                      errno.ENFILE, errno.ENAMETOOLONG, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST,
                      errno.EIO, errno.ENOMEM, errno.ENOTEMPTY, errno.EBUSY, errno.ESTALE}


def killed_by(signum: int) -> str:
    """How a process that a signal ended died, for a message: ``killed by SIGKILL (often the out-of-memory
    killer)``, or ``killed by signal 34`` for a signal without a name (a real-time one)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"killed by signal {signum}"
    return f"killed by {name}" + (" (often the out-of-memory killer)" if signum == signal.SIGKILL else "")


def user_message(error: BaseException) -> str | None:
    """The one line a user error prints; None for anything else (a bug keeps its traceback)."""
    if isinstance(error, NanosetError):
        return str(error)
    if isinstance(error, OSError) and error.errno in ENVIRONMENT_ERRNOS:
        return str(error)
    return None


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def print_note(message: str) -> None:
    """What a command decided for the user, or wants them to know, without stopping: one ``note:`` line."""
    print(f"note: {message}", file=sys.stderr, flush=True)


def report_user_errors(main: Callable[[], int | None], report: Callable[[str], None] = print_error) -> int:
    """Run an entry point: its exit status, or 1 after ``report`` says a user error in one line."""
    try:
        return main() or 0
    except Exception as e:
        message = user_message(e)
        if message is None:
            raise
        report(message)
        return 1
