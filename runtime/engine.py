"""The distributed engine: a model of the config's family (its ``ModelSpec``) cut into pipeline chunks, tensor-
and data-parallel, with AdamW, ``train_step(batches) -> StepResult`` for training and ``eval_step(batches)`` for
validation: the same inputs, targets and loss, forward only.

The loss is the mean cross-entropy over the unmasked label tokens of the whole global batch:
every micro-batch contributes ``sum / N`` with ``N`` counted over all micro-batches and dp
ranks, so the value (and the gradient) is the same whatever the layout. When the batches carry
``source_ids``, the last pipeline stage also sums its per-token losses, label tokens and rows per
source; those few numbers ride in the step's one reduction (``runtime/parallel/step_reduction.py``) with
the loss sum and the label tokens, so they cost no extra collective and no extra host read; so does
every sample's summed token loss and label tokens (``runtime/sample_losses.py``), ``2·G`` numbers more.

With context parallelism the engine takes full-length micro-batches, like every other layout, and
keeps this cp rank's chunks of the inputs and targets once they are on the device
(``runtime/parallel/context_parallel.py``): each cp rank sums the token losses of its part, and the
sums, like the gradients, reduce over dp × cp.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from runtime.config import Config
from runtime.data.loading.contract import SOURCE_KEY
from runtime.models.registry import spec_of
from runtime.parallel.context import ParallelContext
from runtime.parallel.context_parallel import ContextParallel
from runtime.parallel.parallelize import compile_variants, parallelize, set_recompile_limit
from runtime.parallel.pipeline import build_schedule, chunk_layer_ranges, chunks_of_rank, forward_only, num_chunks
from runtime.parallel.step_reduction import StepReduction
from runtime.parallel.tied_embedding import TiedEmbeddingSync
from runtime.sample_losses import IGNORE_INDEX, SampleLosses, global_rows, row_sums, scatter


@dataclass
class StepResult:
    loss: float  # global mean over unmasked label tokens, identical on every rank
    grad_norm: float  # before clipping
    num_label_tokens: int  # unmasked labels of the global batch, identical on every rank
    skipped: bool = False  # the loss or gradient norm was not finite: no update (every rank decides the same)
    # per source of the stage: (samples, label tokens, sum of their token losses) over the global batch;
    # None when a rank's batches carry no source_ids
    sources: list[tuple[int, int, float]] | None = None
    # every sample of the global batch, in global order: summed token loss and label tokens (None: not counted)
    samples: SampleLosses | None = None


def compute_dtype(config: Config, device: torch.device) -> torch.dtype:
    if config.model.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, config.model.dtype)


class Engine:
    """Model chunks of this rank, optimizer and (with pp > 1) the pipeline schedule."""

    def __init__(self, config: Config, parallel_context: ParallelContext, initialize: bool = True) -> None:
        """``initialize=False`` leaves the weights uninitialised, for a caller that loads all of them
        next (a checkpoint, a Hugging Face model): drawing a large model's seeded weights takes minutes."""
        self.config = config
        self.ctx = ctx = parallel_context
        par, args = config.parallelism, config.model
        self.context_parallel = ContextParallel.of(ctx)
        self.device = ctx.device
        self.dtype = compute_dtype(config, self.device)
        total = num_chunks(ctx.pp_size, par.pp_engine, par.pp_virtual_stages)
        ranges = chunk_layer_ranges(args.num_hidden_layers, total)
        self.stage_ids = chunks_of_rank(ctx.pp_rank, ctx.pp_size, par.pp_engine, par.pp_virtual_stages)
        self.total_stages = total
        # FSDP's mixed-precision policy is what casts to the compute dtype, so bf16 needs it even with dp = 1;
        # cp ranks hold the same parameters as replicas do: FSDP shards and reduces them over dp × cp
        self.use_fsdp = ctx.dp_cp_size > 1 or self.device.type == "cuda" or self.dtype != torch.float32
        if args.compile:
            lengths = {config.stage_sequence_length(s) for s in config.data_stages} | {config.tokens.sequence_length}
            set_recompile_limit(compile_variants(lengths, args.activation_checkpointing != "none"))
        modules = spec_of(args).modules()  # the family's torch side
        self.chunks: list[nn.Module] = []
        for c in self.stage_ids:
            with torch.device("meta"):  # no memory until sharded: only this rank's shards are ever allocated
                chunk = modules.chunk(args, *ranges[c])
            parallelize(chunk, args, modules.tensor_parallel_plan, ctx.mesh["tp"],
                        ctx.dp_cp_mesh if self.use_fsdp else None, self.dtype, self.context_parallel)
            chunk.materialize(self.device)
            if initialize:
                modules.init_weights(chunk, args, config.general.seed)
            self.chunks.append(chunk)
        self.tied_sync = TiedEmbeddingSync(self.chunks, ctx) if args.tie_word_embeddings and ctx.pp_size > 1 else None
        self.owns_inputs = self.chunks[0].has_embedding
        self.owns_loss = self.chunks[-1].has_head
        self.optimizer = self._build_optimizer()
        self.clip_grad = config.optimizer.clip_grad  # a stage's own may replace it (runtime/stage_optimizer.py)
        # gradient clipping counts each weight once: a pipeline-tied head copy has the embedding's gradient
        self._norm_parameters = [p for c in self.chunks for n, p in c.named_parameters() if c.stored_name(n) == n]
        self._schedules: dict[tuple, object] = {}
        self._loss_scale = 1.0
        # while a step counts sources: per loss call, each row's source and (1, label tokens, Σ token loss)
        # while a step counts: per loss call, each row's source, its global position and (Σ token loss, label tokens)
        self._tally: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self.count_samples = True  # per-sample losses in every StepResult (off only to measure their cost)

    # ------------------------------------------------------------------ construction ------------

    def parameters(self) -> list[nn.Parameter]:
        return [p for c in self.chunks for p in c.parameters()]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Layout-independent names: a pipeline-tied head copy is ``embed_tokens.weight`` too."""
        return [(c.stored_name(n), p) for c in self.chunks for n, p in c.named_parameters()]

    def _build_optimizer(self) -> torch.optim.Optimizer:
        o = self.config.optimizer
        decay = [p for p in self.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.parameters() if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": o.weight_decay, "decayed": True},
                  {"params": no_decay, "weight_decay": 0.0, "decayed": False}]
        # the fused kernel takes one kind of tensor per group: under tp without FSDP, 1-D weights the plan
        # distributes (biases split with their heads, replicated per-head norms) get a group beside the plain norms
        distributed = [p for p in no_decay if hasattr(p, "device_mesh")]
        if distributed and len(distributed) < len(no_decay):
            groups[1]["params"] = [p for p in no_decay if not hasattr(p, "device_mesh")]
            groups.append({"params": distributed, "weight_decay": 0.0, "decayed": False})
        # fused (CUDA and CPU): one kernel for all parameters, no host read of its step counts (the foreach
        # path reads each one), and a non-finite step skipped on the device (found_inf)
        return torch.optim.AdamW(groups, lr=o.learning_rate, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps,
                                 fused=True)

    def _schedule(self, key: tuple):
        """One schedule per micro-batch shape: a stage change of sequence length gets its own. Only the
        current one is kept, so a finished stage's pipeline buffers are freed at the switch."""
        if key not in self._schedules:
            par = self.config.parallelism
            self._schedules.clear()
            self._schedules[key] = build_schedule(
                self.chunks, self.stage_ids, self.total_stages, self.ctx.pp_pg, self.device, par.pp_engine,
                self.config.tokens.batch_accumulation_per_replica, self._loss)
        return self._schedules[key]

    # ------------------------------------------------------------------ the step ----------------

    def _loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Sum of token losses of one micro-batch (times ``_loss_scale``; the per-token losses summed, counted or
        not: the same value either way). While a step counts, the target's last two columns are each row's
        source and global position (so they travel with their rows through the pipeline schedule's
        micro-batch split) and the token losses are also summed per row (``_tally``: one entry a call; the
        pipeline's set-up calls it once more on its first step, so a step counts only its last calls)."""
        extra = None
        if self._tally is not None:
            target, extra = target[:, :-2], target[:, -2:]
        ce = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1), ignore_index=IGNORE_INDEX,
                             reduction="none")
        if extra is not None:
            tokens = ce.full_tensor() if hasattr(ce, "full_tensor") else ce  # tp: replicated per-token losses
            self._tally.append((extra[:, 0], extra[:, 1], row_sums(tokens, target)))
        return ce.sum() * self._loss_scale

    def _loss_context(self):
        if self.ctx.tp_size > 1 and self.owns_loss:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return contextlib.nullcontext()

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True)

    # The loader's tensors are copied to the device as they are (pinned on CUDA, so the copies are
    # asynchronous); concatenating or masking them on the host first would make pageable copies. With
    # context parallelism this rank's chunks are taken on the device, from the full-length tensors.

    def _local(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.context_parallel is None else self.context_parallel.shard(t)

    def _inputs(self, batches: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.cat([self._to_device(b["input_ids"]) for b in batches])
        if "position_ids" in batches[0]:
            pos = torch.cat([self._to_device(b["position_ids"]) for b in batches])
        else:
            pos = torch.arange(ids.shape[1], device=self.device).expand(ids.shape[0], -1)
        return self._local(ids).contiguous(), self._local(pos).contiguous()

    def _targets(self, batches: list[dict], extra: torch.Tensor | None = None) -> torch.Tensor:
        """Label ids (masked ones ``IGNORE_INDEX``) of this rank's part of the micro-batches; with ``extra``
        (``[rows, 2]``: each row's source and global position) two more columns, after the cp chunks are taken."""
        dev = self._to_device
        targets = self._local(torch.cat([torch.where(dev(b["label_mask"]), dev(b["label_ids"]), IGNORE_INDEX)
                                         for b in batches]))
        return targets if extra is None else torch.cat([targets, extra], dim=1)

    def _row_columns(self, batches: list[dict], sources: torch.Tensor | None) -> torch.Tensor | None:
        """``[rows, 2]``: each row's source (0 without ``source_ids``) and position in the global batch; None when
        the step counts neither sources nor samples."""
        if sources is None and not self.count_samples:
            return None
        rows = batches[0]["label_ids"].shape[0]
        positions = global_rows(len(batches), rows, self.ctx.dp_rank, self.ctx.dp_size, self.device)
        return torch.stack([sources if sources is not None else torch.zeros_like(positions), positions], dim=1)

    def _sources(self, batches: list[dict], num_sources: int) -> torch.Tensor | None:
        """Each row's source, on the device, when every micro-batch carries ``source_ids`` (checked in
        ``[0, num_sources)`` while still on the host; a tensor already on the device is not read back)."""
        ids = [b.get(SOURCE_KEY) for b in batches]
        if not num_sources or not all(isinstance(t, torch.Tensor) for t in ids):
            return None
        for t in ids:
            values = t.numpy() if t.device.type == "cpu" else None  # numpy: host data, no tensor read
            if values is not None and len(values) and not 0 <= values.min() <= values.max() < num_sources:
                raise ValueError(f"batch key {SOURCE_KEY!r} holds {values.tolist()}; each row's source must index "
                                 f"the stage's {num_sources} datasets")
        return torch.cat([self._to_device(t).long() for t in ids])

    def _local_label_tokens(self, batches: list[dict]) -> int | torch.Tensor:
        """Unmasked label tokens of this rank's micro-batches: counted on the host from the loader's tensors (numpy:
        no read of a device value), on the device for batches already there (broadcast to tp and cp ranks)."""
        masks = [b["label_mask"] for b in batches]
        if all(m.device.type == "cpu" for m in masks):
            return int(sum(np.count_nonzero(m.numpy()) for m in masks))
        return torch.stack([m.to(self.device).sum() for m in masks]).sum()

    def train_step(self, batches: list[dict], sequence_length: int | None = None, num_sources: int = 0,
                   reduction: StepReduction | None = None, skip_above: float | None = None) -> StepResult:
        """Forward, backward, clip and update on one global step's micro-batches (this rank's rows).

        A step whose loss or gradient norm is not finite updates nothing (its gradients are dropped): NaN
        would otherwise reach every weight. Both values are global (the same on every rank, with pp too), so
        every rank skips the same steps; the decision stays on the device (the fused AdamW's ``found_inf``).

        Each micro-batch's loss is its sum of token losses (times dp × cp, which FSDP's average over dp × cp
        turns back into a sum): no scale to know before the backward, so nothing to agree on first. The
        label-token count ``N`` of the global batch rides in the step's one reduction with the loss sum, and the
        gradients are divided by ``N`` in the clip's one ``_foreach_mul_``. ``reduction``: the step's numbers,
        to which the caller has added its own (the trainer's stop and error flags); read once, at the end.

        ``sequence_length`` tells middle pipeline ranks (whose batches hold only TensorPointers) the
        shape of this step, so that a stage with another sequence length gets its own schedule.
        ``num_sources``: the stage's datasets (the same on every rank); the batches' ``source_ids`` index them.
        ``skip_above``: a loss above it is not applied either (a spike under ``surgery.spike.action: skip``; the
        threshold comes from earlier steps, so the decision too stays on the device)."""
        reduction = reduction if reduction is not None else StepReduction(self.device)
        # FSDP averages gradients over dp × cp; scaling by dp × cp turns that into the sum
        self._loss_scale = float(self.ctx.dp_cp_size)
        sources = self._sources(batches, num_sources) if self.owns_loss else None
        extra = self._row_columns(batches, sources) if self.owns_loss else None
        self._tally = [] if extra is not None else None
        losses: list[torch.Tensor] = []
        with self._loss_context():
            if self.ctx.pp_size == 1:
                self._run_accumulation(batches, losses, extra)
            else:
                self._run_pipeline(batches, losses, sequence_length, extra)
        if self.tied_sync is not None:
            self.tied_sync.sum_gradients()
        self._add_step_numbers(reduction, batches, losses, num_sources, sources is not None)
        n_tokens = reduction.on_device("label_tokens").clamp(min=1)
        loss = reduction.on_device("loss_sum")[0] / n_tokens[0]
        grad_norm = clip_grad_norm_(self.parameters(), self.clip_grad, self.ctx,
                                    counted=self._norm_parameters, divisor=n_tokens[0])
        self._step_unless_not_finite(loss, grad_norm, skip_above)
        self.optimizer.zero_grad(set_to_none=True)
        reduction.read(loss, grad_norm)  # the step's one read back to the host
        loss_value, norm_value = reduction.values("extra")
        skipped = not (math.isfinite(loss_value) and math.isfinite(norm_value)) or (
            skip_above is not None and loss_value > skip_above)
        samples = SampleLosses.from_flat(reduction.values("samples")) if self.count_samples else None
        return StepResult(loss_value, norm_value, int(reduction.value("label_tokens")), skipped,
                          self._per_source(reduction, num_sources), samples)

    def _step_unless_not_finite(self, loss: torch.Tensor, grad_norm: torch.Tensor,
                                skip_above: float | None = None) -> None:
        """The optimizer's update unless ``loss`` or ``grad_norm`` is not finite, or ``loss`` is above
        ``skip_above``: decided on the device by the fused AdamW (``found_inf``, as torch's GradScaler uses it: no
        update, its step count kept); an optimizer without it reads the verdict on the host."""
        not_finite = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        if skip_above is not None:
            not_finite = not_finite | (loss > skip_above)
        if self.optimizer.defaults.get("fused"):
            self.optimizer.found_inf = not_finite.float()
            self.optimizer.step()
        elif not bool(not_finite):
            self.optimizer.step()

    def _add_step_numbers(self, reduction: StepReduction, batches: list[dict], losses: list[torch.Tensor],
                          num_sources: int, with_sources: bool = False) -> None:
        """The engine's parts of the step's reduction (summed over the world, so each is contributed by the ranks
        that make it whole): ``loss_sum`` (Σ token losses: the last stage's tp rank 0 of each dp × cp rank),
        ``label_tokens`` (of those, cp rank 0: every cp rank holds its replica's full-length batches), and with
        sources ``source_ranks`` (how many dp × cp ranks tallied) and ``sources`` (rows, label tokens, Σ loss per
        source), and ``samples`` (Σ loss, label tokens per position of the global batch: each cp rank adds the
        sums of its slices)."""
        owner = self.owns_loss and self.ctx.tp_rank == 0
        if owner and losses:  # the pipeline schedule returns losses still attached to the graph: detach
            reduction.add("loss_sum", _summed(losses) / self.ctx.dp_cp_size)
        else:
            reduction.add("loss_sum", 0.0)
        counted = owner and self.ctx.cp_rank == 0
        reduction.add("label_tokens", self._local_label_tokens(batches) if counted else 0, counted=counted)
        tallied = owner and self._tally is not None
        # the step's own loss calls: one per micro-batch, the last ones
        calls = self._tally[len(self._tally) - len(batches):] if tallied else []
        sums = torch.cat([c[2] for c in calls]) if calls else None
        if num_sources:
            tally = torch.zeros((num_sources, 3), dtype=torch.float64, device=self.device)
            if calls and with_sources:
                rows = torch.full((len(sums), 1), 1.0 if self.ctx.cp_rank == 0 else 0.0, dtype=torch.float64,
                                  device=self.device)  # every cp rank holds the rows; their tokens split
                tally.index_add_(0, torch.cat([c[0] for c in calls]), torch.cat([rows, sums[:, [1, 0]]], 1))
            reduction.add("source_ranks", 1.0 if calls and with_sources else 0.0)
            reduction.add("sources", tally)
        if self.count_samples:  # the same size on every rank: the config's global batch
            g = self.config.global_batch_size
            reduction.add("samples", scatter(torch.cat([c[1] for c in calls]), sums, g) if calls
                          else torch.zeros(2 * g, dtype=torch.float64, device=self.device))
        self._tally = None

    def _per_source(self, reduction: StepReduction, num_sources: int) -> list[tuple[int, int, float]] | None:
        """(rows, label tokens, Σ loss) per source, when every dp × cp rank counted its rows."""
        if not num_sources or reduction.value("source_ranks") != self.ctx.dp_cp_size:
            return None
        v = reduction.values("sources")
        return [(int(v[3 * i]), int(v[3 * i + 1]), v[3 * i + 2]) for i in range(num_sources)]

    def _run_accumulation(self, batches: list[dict], losses: list[torch.Tensor],
                          extra: torch.Tensor | None = None) -> None:
        chunk = self.chunks[0]
        targets = self._targets(batches, extra)
        ids, pos = self._inputs(batches)
        rows = batches[0]["input_ids"].shape[0]
        every = self.config.parallelism.gradient_sync == "every_micro_batch"
        for i in range(len(batches)):
            if self.use_fsdp:  # reduce-scatter per micro-batch (sharded gradients between), or at the last only
                chunk.set_requires_gradient_sync(every or i == len(batches) - 1)
            sl = slice(i * rows, (i + 1) * rows)
            loss = self._loss(chunk(ids[sl], pos[sl]), targets[sl])
            loss.backward()
            losses.append(loss.detach())

    def _run_pipeline(self, batches: list[dict], losses: list[torch.Tensor], sequence_length: int | None,
                      extra: torch.Tensor | None = None) -> None:
        if sequence_length is None and (self.owns_inputs or self.owns_loss):
            sequence_length = batches[0]["input_ids" if self.owns_inputs else "label_ids"].shape[1]
        schedule = self._schedule((sequence_length,))
        if self.owns_inputs:
            schedule.step(*self._inputs(batches))
        elif self.owns_loss:
            schedule.step(target=self._targets(batches, extra), losses=losses)
        else:  # a middle rank: the batch dicts hold TensorPointers only and are never read
            schedule.step()

    @torch.no_grad()
    def eval_step(self, batches: list[dict], sequence_length: int) -> tuple[float, int]:
        """(Σ token losses, label tokens) of one global batch, forward only: the same inputs, targets and
        loss as ``train_step`` (so the same label rules), with pp > 1 through the schedule's forward-only
        path. ``batches`` are this rank's micro-batches; the result is the same on every rank."""
        losses = self._forward_only(batches, sequence_length)
        total = torch.zeros(2, dtype=torch.float64, device=self.device)  # Σ loss, label tokens
        if self.owns_loss:
            total[0] = _summed(losses)  # this cp rank's part of the sequences
            if self.ctx.cp_rank == 0:  # the full-length batches: every cp rank of a replica holds them
                total[1] = self._local_label_tokens(batches)
            if self.ctx.dp_cp_size > 1:
                dist.all_reduce(total, group=self.ctx.dp_cp_pg)
        self._from_last_stage(total)
        loss_sum, tokens = total.tolist()  # the one read back
        return loss_sum, int(tokens)

    @torch.no_grad()
    def eval_rows(self, batches: list[dict], sequence_length: int) -> SampleLosses:
        """Each row's Σ token losses and label tokens of one global batch (``global_batch_size`` rows, in the
        order of ``sample_losses.global_rows``), forward only, the same on every rank: what multiple-choice
        scoring needs of each (context, choice) row, on every layout."""
        rows = self.config.tokens.micro_batch_size
        positions = global_rows(len(batches), rows, self.ctx.dp_rank, self.ctx.dp_size, self.device)
        extra = torch.stack([torch.zeros_like(positions), positions], dim=1) if self.owns_loss else None
        self._tally = []
        try:
            self._forward_only(batches, sequence_length, extra, keep_tally=True)
            calls, covered = [], 0  # the last calls, covering this rank's rows (a pipeline's set-up adds one)
            for call in reversed(self._tally):
                if covered >= len(positions):
                    break
                calls.append(call)
                covered += len(call[1])
        finally:
            self._tally = None
        g = self.config.global_batch_size
        total = torch.zeros(2 * g, dtype=torch.float64, device=self.device)
        if self.owns_loss:
            if calls:
                total = scatter(torch.cat([c[1] for c in calls]), torch.cat([c[2] for c in calls]), g)
            if self.ctx.dp_cp_size > 1:  # dp ranks fill their own rows, cp ranks add their slices
                dist.all_reduce(total, group=self.ctx.dp_cp_pg)
        self._from_last_stage(total)
        return SampleLosses.from_flat(total.cpu().numpy())

    def _forward_only(self, batches: list[dict], sequence_length: int, extra: torch.Tensor | None = None,
                      keep_tally: bool = False) -> list[torch.Tensor]:
        """This rank's micro-batch losses (plain sums) of a forward-only pass; ``extra``: the targets' two more
        columns (each row's source and global position) for a tally the caller set up (``keep_tally``)."""
        losses: list[torch.Tensor] = []
        scale, self._loss_scale = self._loss_scale, 1.0  # the loss function returns plain sums
        tally = self._tally
        if not keep_tally:
            self._tally = None  # counts no sources
        try:
            with self._loss_context():
                if self.ctx.pp_size == 1:
                    chunk = self.chunks[0]
                    ids, pos = self._inputs(batches)
                    targets = self._targets(batches, extra)
                    rows = batches[0]["input_ids"].shape[0]
                    for i in range(len(batches)):
                        sl = slice(i * rows, (i + 1) * rows)
                        losses.append(self._loss(chunk(ids[sl], pos[sl]), targets[sl]))
                else:
                    schedule = self._schedule((sequence_length,))
                    if self.owns_inputs:
                        forward_only(schedule, *self._inputs(batches))
                    elif self.owns_loss:
                        targets = self._targets(batches, extra)
                        logits = forward_only(schedule, target=targets, losses=losses)
                        if not losses:  # torch without schedule.eval computed no loss: take it from the logits
                            losses.append(self._loss(logits, targets))
                    else:
                        forward_only(schedule)
        finally:
            self._loss_scale = scale
            if not keep_tally:
                self._tally = tally
        return losses

    @torch.no_grad()
    def sample_losses(self, batches: list[dict]) -> SampleLosses:
        """Each row's summed token loss and label tokens, forward only, counted as a training step counts them
        (the same targets and loss call): ``explain --suspects --checkpoint`` in one process (dp = tp = pp = cp
        = 1), where ``batches`` are a whole global batch's micro-batches in global order."""
        assert self.ctx.dp_size == self.ctx.tp_size == self.ctx.pp_size == self.ctx.cp_size == 1, "one process"
        scale, self._loss_scale = self._loss_scale, 1.0
        chunk, rows = self.chunks[0], batches[0]["input_ids"].shape[0]
        positions = global_rows(len(batches), rows, 0, 1, self.device)
        ids, pos = self._inputs(batches)
        targets = self._targets(batches, torch.stack([torch.zeros_like(positions), positions], dim=1))
        self._tally = []
        try:
            for i in range(len(batches)):
                sl = slice(i * rows, (i + 1) * rows)
                self._loss(chunk(ids[sl], pos[sl]), targets[sl])
            sums = scatter(torch.cat([c[1] for c in self._tally]), torch.cat([c[2] for c in self._tally]),
                           len(positions))
        finally:
            self._loss_scale, self._tally = scale, None
        return SampleLosses.from_flat(sums.cpu().numpy())

    def _from_last_stage(self, values: torch.Tensor) -> None:
        """With pp > 1, every pipeline rank gets the last stage's ``values`` (in place)."""
        if self.ctx.pp_size > 1:
            src = self.ctx.global_rank_of(self.ctx.pp_size - 1, self.ctx.dp_rank, self.ctx.tp_rank)
            dist.broadcast(values, src=src, group=self.ctx.pp_pg)


def clip_grad_norm_(params: list[nn.Parameter], max_norm: float | None, ctx: ParallelContext,
                    counted: list[nn.Parameter] | None = None, divisor: torch.Tensor | None = None) -> torch.Tensor:
    """Total L2 norm of the gradients of ``counted`` (default: ``params``) over every tp, dp shard and
    pp stage, divided by ``divisor`` (the gradients are sums of ``divisor`` tokens' losses), then scale all of
    ``params`` by ``1 / divisor`` and clip them to ``max_norm``; returns the norm (after the division,
    before clipping), on the device.

    No host read: one ``_foreach_norm`` per group of gradients on the same mesh and placements (each group's
    norm then reduces correctly over its own shards and replicas), the pipeline stages' squares added over
    the pp group, and one ``_foreach_mul_`` per group by a coefficient computed on the device. A non-finite
    norm makes a non-finite coefficient: the engine skips such a step.
    """
    total_sq = torch.zeros((), dtype=torch.float32, device=ctx.device)
    for grads in _gradient_groups(params if counted is None else counted).values():
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        total_sq += norm.to(ctx.device) ** 2
    if ctx.pp_size > 1:
        dist.all_reduce(total_sq, group=ctx.pp_pg)
    total = total_sq.sqrt()
    if divisor is not None:
        total = total / divisor
    coef = None if divisor is None else 1.0 / divisor
    if max_norm is not None:
        clip = (max_norm / (total + 1e-6)).clamp(max=1.0)
        coef = clip if coef is None else coef * clip
    if coef is not None:
        for grads in _gradient_groups(params).values():
            torch._foreach_mul_(grads, coef.to(torch.float32))
    return total


def _summed(losses: list[torch.Tensor]) -> torch.Tensor:
    """Σ of micro-batch losses in float64, on the device; a tensor-parallel loss (a replicated DTensor) as its
    plain value."""
    plain = [x.detach().full_tensor() if hasattr(x, "full_tensor") else x.detach() for x in losses]
    return torch.stack(plain).double().sum()


def _gradient_groups(params: list[nn.Parameter]) -> dict[tuple, list[torch.Tensor]]:
    """The gradients of ``params`` by (device mesh, placements); plain tensors in one group."""
    groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        if p.grad is not None:
            g = p.grad
            key = (g.device_mesh, tuple(g.placements)) if hasattr(g, "device_mesh") else ("local",)
            groups[key].append(g)
    return groups
