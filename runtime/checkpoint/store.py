"""Saving and loading checkpoints through ``torch.distributed.checkpoint``: sharded, reshardable, atomic.

The DCP files hold the model and AdamW state keyed by the layout-independent parameter names, so
any tp/pp/dp layout loads them; each rank also saves its RNG states. A checkpoint is written under
a temporary name and renamed when complete; ``latest`` is updated last. A crash at any moment
leaves the previous checkpoint and ``latest`` intact; stale temporary folders are removed on start. With
``checkpoints.async_save`` the files are written in the background (``runtime.checkpoint.background``) and put
in place once complete.
Damaged files are one ``CheckpointError`` line naming the checkpoint and what to resume from:
DCP reports a missing or torn shard as ``CheckpointException``, a ``BaseException`` that escapes
every ``except Exception`` (and a missing ``.metadata`` as a logged traceback per rank first).
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import signal
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException

from nanoset.atomic import fsync_dir
from nanoset.errors import CheckpointError, NanosetError, WriteFailed
from nanoset.storage import Location
from runtime.checkpoint.background import BackgroundWrite, BackgroundWriter
from runtime.checkpoint.layout import (
    TMP_PREFIX,
    checkpoint_name,
    commit_latest,
    earlier_checkpoints_hint,
    interrupted_save,
    latest_name,
    resolve_resume,
    rng_file,
    saved_checkpoints,
    stage_latest,
    stale_temporaries,
    step_folders,
    write_latest,
)
from runtime.checkpoint.record import CheckpointRecord, read_metadata, step_was_skipped, write_metadata
from runtime.checkpoint.remote import prune as prune_remote
from runtime.checkpoint.remote import upload_checkpoint
from runtime.engine import Engine

FAULT_ENV = "NANOSET_FAULT_KILL_IN_CHECKPOINT"  # fault injection for tests: SIGKILL before the rename


def _optimizer_state(engine: Engine) -> dict[str, torch.Tensor]:
    """AdamW state keyed by parameter name; creates empty state (to be loaded into) when missing."""
    out = {}
    fused = engine.device.type == "cuda"
    for name, p in engine.named_parameters():
        st = engine.optimizer.state[p]
        if not st:
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            out[f"{name}.{key}"] = st[key]
    return out


def model_state(engine: Engine) -> dict[str, torch.Tensor]:
    """The weights by layout-independent name, each tensor once: a tied head is the embedding, so only
    ``embed_tokens.weight`` is saved and loaded (``state_dict`` would also list it as ``lm_head.weight``),
    whatever the layout. With pp > 1 the last stage's head copy is stored under that name too (equal
    shards, which DCP writes once)."""
    model = {}
    for chunk in engine.chunks:
        aliases = ({n for n, _ in chunk.named_parameters(remove_duplicate=False)}
                   - {n for n, _ in chunk.named_parameters()})
        model.update({chunk.stored_name(k): v for k, v in chunk.state_dict().items() if k not in aliases})
    return model


def _app_state(engine: Engine) -> dict:
    return {"model": model_state(engine), "optimizer": _optimizer_state(engine)}


def _rng_state() -> dict:
    """Every generator's state as tensors, lists and numbers only, so it loads with ``weights_only=True``."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(), "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss,
                                                       gauss], "python": [version, list(mt), gauss_next]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, mt, gauss_next = state["python"]
    random.setstate((version, tuple(mt), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class CheckpointManager:
    def __init__(self, folder: Path, keep_last: int, is_writer: bool, async_save: bool = False,
                 pinned: bool = False, remote: Location | None = None) -> None:
        """``async_save``: write in the background (``pinned``: staged in pinned host memory, on CUDA); ``remote``:
        the URL each checkpoint is uploaded to once in place in ``folder``, its staging folder."""
        self.folder = Path(folder)
        self.remote = remote
        self.keep_last = keep_last
        self.is_writer = is_writer  # global rank 0 renames, updates `latest` and prunes
        self.background = BackgroundWriter(pinned) if async_save else None
        self.in_flight: BackgroundWrite | None = None  # the checkpoint being written in the background

    def clean_stale(self) -> None:
        """Finish a save killed between its two renames (``latest`` names its checkpoint), then remove what saves
        that a crash interrupted left: temporary folders, a staged ``latest``."""
        if self.is_writer and self.folder.is_dir():
            if (completed := interrupted_save(self.folder)) is not None:
                write_latest(self.folder, completed)
            for p in stale_temporaries(self.folder):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
        if dist.is_initialized():
            dist.barrier()

    def save(self, engine: Engine, step: int, record: CheckpointRecord,
             before_commit: Callable[[], None] | None = None) -> Path:
        """Write the checkpoint of ``step`` under a temporary name (with the ``latest`` that will name it), then
        rename both into place and prune. A failed write (a full disk) on any rank removes the temporary files and
        raises the same ``CheckpointError`` on every rank; the earlier checkpoints and ``latest`` stay as they
        were. A failure of the renames or the pruning after it is one line on every rank too, saying what is
        saved. ``before_commit``: called on every rank once the loop's part is done, before ``latest`` can name
        the checkpoint. In the background (``async_save``) it returns once the state is copied; ``poll`` and
        ``wait`` put the checkpoint in place when its write is complete."""
        self.wait()  # one write at a time
        final = self.folder / checkpoint_name(step)
        tmp = self.folder / f"{TMP_PREFIX}{checkpoint_name(step)}"
        if self.is_writer:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        failure, staged, future = "", None, None
        try:
            if self.background is not None:
                future = self.background.start(_app_state(engine), tmp)
            else:
                dcp.save(_app_state(engine), checkpoint_id=str(tmp))
            torch.save(_rng_state(), rng_file(tmp, dist.get_rank()))
            if self.is_writer:
                write_metadata(tmp, dataclasses.replace(record, world_size=dist.get_world_size()))
                staged = stage_latest(self.folder, final) if future is None else None
        except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
            failure = _cause(e)
        results = [("", False)] * dist.get_world_size()
        dist.all_gather_object(results, (failure, future is not None))  # every rank learns of a failure
        failures = [f for f, _ in results if f]
        if failures:
            if all(started for _, started in results):  # every rank's write goes on: over before the folder goes
                _settled(future)
            self._failed(tmp, staged, step, failures[0])
        if before_commit is not None:
            before_commit()
        if future is not None:
            self.in_flight = BackgroundWrite(step, tmp, final, future)
            return final
        outcome = [self._put_in_place(tmp, final, staged, step) if self.is_writer else ""]
        dist.broadcast_object_list(outcome, src=0)  # the writer is global rank 0
        if outcome[0]:
            raise CheckpointError(outcome[0])
        return final

    def poll(self) -> str | None:
        """Global rank 0, after every step: the checkpoint written in the background put in place once its write is
        complete; a line saying so (None: nothing was done). Other ranks learn of it in ``wait``."""
        w = self.in_flight
        if w is None or not self.is_writer or w.outcome is not None or not w.future.done():
            return None
        return self._complete(w)

    def wait(self) -> str | None:
        """Every rank: the write in flight waited for (before the next save, and at the end of training) and put in
        place; its failure, or a failure to put it in place, raised on every rank as one ``CheckpointError``."""
        w, self.in_flight = self.in_flight, None
        if w is None:
            return None
        failure = _settled(w.future)
        note = self._complete(w) if self.is_writer and w.outcome is None else None
        mine = (w.outcome or "") if self.is_writer else (f"{self.folder}: writing the checkpoint of step {w.step} in "
                                                         f"the background failed ({failure})" if failure else "")
        failures = [""] * dist.get_world_size()
        dist.all_gather_object(failures, mine)
        if any(failures):
            raise CheckpointError(next(f for f in failures if f))
        return note

    def _complete(self, w: BackgroundWrite) -> str | None:
        """The writer's end of a background write: put in place, or removed; ``w.outcome`` says which."""
        failure = _settled(w.future)
        staged = None
        if not failure:
            try:
                staged = stage_latest(self.folder, w.final)
            except OSError as e:
                failure = _cause(e)
        if failure:
            shutil.rmtree(w.tmp, ignore_errors=True)
            w.outcome = (f"{self.folder}: writing the checkpoint of step {w.step} in the background failed "
                         f"({failure}); its partial folder was removed and {self._kept()}; fix the cause and rerun "
                         f"to resume")
            return None
        w.outcome = self._put_in_place(w.tmp, w.final, staged, w.step)
        return None if w.outcome else (f"checkpoint {w.final} complete: written in the background in "
                                       f"{time.perf_counter() - w.began:.2f} s")

    def _put_in_place(self, tmp: Path, final: Path, staged: Path, step: int) -> str:
        """The writer's renames (the checkpoint, then ``latest``) and pruning: what went wrong, "" when nothing."""
        if os.environ.get(FAULT_ENV) == str(step):
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            if final.exists():  # a rerun of the same step after a crash: replace it
                self._discard(final)
            os.replace(tmp, final)
            fsync_dir(self.folder)
        except OSError as e:
            staged.unlink(missing_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            return (f"{self.folder}: saving the checkpoint of step {step} failed: renaming it into place "
                    f"({_cause(e)}); {self._kept()}; fix the cause and rerun to resume")
        try:
            commit_latest(self.folder, staged)
        except OSError as e:
            staged.unlink(missing_ok=True)
            return (f"{self.folder}: the checkpoint of step {step} is saved ({final.name}) but `latest` could not "
                    f"be updated ({_cause(e)}); rerun to resume from {final.name} (the newest complete checkpoint)")
        if self.remote is not None:
            try:
                upload_checkpoint(final, self.remote)
            except (OSError, NanosetError) as e:
                return (f"{self.remote}: the checkpoint of step {step} is saved in {final} but uploading it failed "
                        f"({_cause(e)}); rerun to resume from that local copy (the next checkpoint is uploaded)")
        try:
            self._prune(keep=final.name)
        except (OSError, NanosetError) as e:
            return (f"{self.folder}: the checkpoint of step {step} is saved ({final.name}, named by `latest`), but "
                    f"removing older checkpoints failed ({_cause(e)}); fix the cause and rerun to resume")
        return ""

    def _failed(self, tmp: Path, staged: Path | None, step: int, cause: str) -> None:
        if self.is_writer:
            shutil.rmtree(tmp, ignore_errors=True)
            if staged is not None:
                staged.unlink(missing_ok=True)
        dist.barrier()
        free = shutil.disk_usage(self.folder).free
        space = "the disk is full" if free < 64 << 20 else f"{free / 2**30:.1f} GiB free there"
        raise CheckpointError(f"{self.folder}: saving the checkpoint of step {step} failed ({cause}; {space}); its "
                              f"partial folder was removed and {self._kept()}; free space and rerun to resume")

    def _kept(self) -> str:
        latest = latest_name(self.folder)
        return f"the checkpoints before it are intact (latest: {latest})" if latest else "none was saved before"

    def _prune(self, keep: str) -> None:
        """Keep the ``keep_last`` newest by step number (not by name: step-1000000 > step-998000), and never
        ``keep`` (just written), the checkpoint ``latest`` names, or the newest of a step that trained
        (skipped steps of a diverging run must not push the last good checkpoint out)."""
        protected = {keep, latest_name(self.folder) or keep}
        good = self.newest_of_a_finite_step()
        if good is not None:
            protected.add(good.name)
        for _, old in step_folders(self.folder)[: -self.keep_last]:
            if old.name not in protected:
                self._discard(old)
        if self.remote is not None:
            prune_remote(self.remote, self.keep_last, protected)

    def newest_of_a_finite_step(self) -> Path | None:
        """The newest complete checkpoint whose step was trained, not skipped as non-finite."""
        for path in reversed(saved_checkpoints(self.folder)):
            if not step_was_skipped(path):
                return path
        return None

    def _discard(self, checkpoint: Path) -> None:
        """Delete a checkpoint folder; renamed first, so a kill midway never leaves a ``step-N`` folder
        whose metadata outlived its shards (the remains are stale: removed on the next start)."""
        doomed = self.folder / f"{TMP_PREFIX}discard-{checkpoint.name}"
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(checkpoint, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def resolve(self, resume: str | None) -> Path | None:
        """The checkpoint to load: ``latest`` (None when there is none yet), a path, or None."""
        return resolve_resume(self.folder, resume)

    def load(self, engine: Engine, path: Path) -> CheckpointRecord:
        """Load model and optimizer (resharding to this layout), RNG states; return the checkpoint's record."""
        record = read_metadata(path, model=False)  # start-up checked what it needs
        hint = earlier_checkpoints_hint(path)
        load_dcp(_app_state(engine), path, hint)  # in place: parameters, AdamW state
        rng = rng_file(path, dist.get_rank())
        if record.world_size == dist.get_world_size():  # the same layout: each rank its own RNG file
            state, error = None, ""
            try:
                state = torch.load(rng, weights_only=True) if rng.is_file() else None
            except Exception as e:  # noqa: BLE001 - a torn file: zip, pickle or EOF errors alike
                error = f"{rng.name} ({e})"
            # every rank learns that a file failed, so all stop with the same line (none waits alone)
            errors = [""] * dist.get_world_size()
            dist.all_gather_object(errors, error)
            if any(errors):
                raise CheckpointError(f"{path}: unreadable RNG file {next(e for e in errors if e)}; {hint}")
            if state is not None:
                _set_rng_state(state)
        return record


def load_dcp(state: dict, checkpoint: Path, what_to_do: str, no_dist: bool = False) -> None:
    """``dcp.load(state)`` from ``checkpoint`` in place; unreadable files are a ``CheckpointError`` naming the
    checkpoint, the cause and ``what_to_do`` (raised on every rank: DCP gathers the failures)."""
    checkpoint = Path(checkpoint)
    if not (checkpoint / ".metadata").is_file():
        raise CheckpointError(f"{checkpoint}: the DCP files are unreadable (.metadata is missing); {what_to_do}")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.load(state, checkpoint_id=str(checkpoint), no_dist=no_dist)
        except (Exception, CheckpointException) as e:  # a missing or torn shard file
            raise CheckpointError(f"{checkpoint}: the DCP files are unreadable ({unreadable_because(e)}); "
                                  f"{what_to_do}") from None


def stored_tensors(checkpoint: Path, what_to_do: str = "choose another checkpoint") -> dict:
    """The DCP metadata of every stored tensor (name → its metadata), without reading them."""
    try:
        return FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    except Exception as e:  # a missing or torn .metadata file
        raise CheckpointError(f"{checkpoint}: the DCP files are unreadable ({unreadable_because(e)}); "
                              f"{what_to_do}") from None


def unreadable_because(error: BaseException) -> str:
    """Why DCP could not read a checkpoint, in one line: the first line of the failure, or its kind where it says
    nothing (a torn file can fail with an empty message), and torch's multi-line refusal of a file that is no
    tensor file said as what it means."""
    if isinstance(error, CheckpointException) and error.failures:
        error = next(iter(error.failures.values()))[0]
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    if text.startswith("Weights only load failed"):
        return "a shard file holds no tensors torch saved: damaged or overwritten"
    if not text and isinstance(error, EOFError):
        return "a shard file ends before its data: torn or truncated"
    return text or f"{type(error).__name__} without a message: a damaged file"


def _settled(future) -> str:
    """Wait for a background write; what went wrong ("" when nothing)."""
    try:
        future.result()
    except (Exception, CheckpointException) as e:
        return _cause(e)
    return ""


def _cause(error: BaseException) -> str:
    """The first line of what went wrong (DCP wraps each rank's failure; torch's zip writer says 'unexpected
    pos' where the disk filled up)."""
    if isinstance(error, CheckpointException) and error.failures:
        error = next(iter(error.failures.values()))[0]
    if isinstance(error, WriteFailed):
        return f"{Path(error.path).name}: {error.reason}"
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror}" + (f": {error.filename}" if error.filename else "")
    text = (str(error).strip().splitlines() or [""])[0]
    if "unexpected pos" in text:  # torch.save's zip writer when a write falls short; it loses the OS error
        return "a write was cut short: no space left on the device, or a file size limit"
    return f"{type(error).__name__}: {text}"
