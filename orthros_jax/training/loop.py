"""The training loop: init or resume, train with periodic eval and checkpoints, stop on NaN.

    state = train(TrainConfig.from_config(config), workdir)

Steps count optimizer updates; each update is optimizer.grad_accum_steps micro-batches (one
jitted train-step call each). Checkpoints are taken only at update boundaries and hold the
state and the data iterator's position, so a run killed at any moment resumes from the last
checkpoint and continues bit-for-bit like an uninterrupted run. Per-step metrics stay on device
and are fetched at log/eval/checkpoint boundaries (keeping dispatch asynchronous); a non-finite
loss, gradient norm or parameter norm found there stops the run with NonFiniteLossError naming
the step, and the state is never checkpointed past the last finite step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TextIO

import jax
import numpy as np
import optax

from orthros_jax import checkpoint
from orthros_jax.model import Params, num_params
from orthros_jax.parallel import mesh as pmesh
from orthros_jax.parallel import sharding
from orthros_jax.training import monitor
from orthros_jax.training.config import TrainConfig
from orthros_jax.training.metrics import MetricsLogger, console, moe_log_values
from orthros_jax.training.optimizer import make_optimizer
from orthros_jax.training.preemption import PreemptionWatcher
from orthros_jax.training.start import (
    abstract_state,
    check_resumed_model,
    config_warnings,
    fresh_state,
    is_checkpointable,
    trainable_of,
    write_model_json,
)
from orthros_jax.training.state import TrainState
from orthros_jax.training.steps import Metrics, make_eval_step, make_train_step

Batch = Mapping[str, np.ndarray]
DeviceBatch = Mapping[str, jax.Array]  # a batch sharded over the mesh
TrainStep = Callable[[TrainState, DeviceBatch], tuple[TrainState, Metrics]]  # jitted
CHECKED = ("loss", "grad_norm", "param_norm")


class NonFiniteLossError(RuntimeError):
    """Raised when a step's loss / grad norm / param norm is NaN or inf."""


def train(
    cfg: TrainConfig,
    workdir: str,
    *,
    train_iterator: Iterator[Batch] | None = None,
    eval_batches: Sequence[Batch] | None = None,
) -> TrainState:
    """Trains (resuming from workdir/checkpoints when present) and returns the final state.

    train_iterator / eval_batches default to orthros_jax.data's pipelines for cfg.data; give
    a grain DatasetIterator to have the data position checkpointed too.
    """

    if cfg.distributed.initialize and not jax.distributed.is_initialized():
        pmesh.initialize_distributed(cfg.distributed)
    workdir = os.path.abspath(workdir)
    check_resumed_model(cfg, workdir)
    for warning in config_warnings(cfg):
        logging.warning("%s", warning)
    if train_iterator is None or eval_batches is None:
        from orthros_jax import data as data_lib

        if cfg.data is None:
            raise ValueError("TrainConfig.data is None: pass train_iterator and eval_batches")
        vocab = data_lib.tokenizer_for(cfg.data).vocab_size
        if vocab > cfg.model.vocab_size:
            raise ValueError(
                f"the data's tokenizer has {vocab} ids but model.vocab_size={cfg.model.vocab_size}"
            )
        if train_iterator is None:
            train_iterator = data_lib.make_train_iterator(cfg.data)
        if eval_batches is None:
            eval_batches = data_lib.make_eval_batches(cfg.data, cfg.train.eval_batches)
    data_state = train_iterator if is_checkpointable(train_iterator) else None
    if data_state is None:
        logging.warning(
            "train_iterator is not a grain iterator: resuming will not restore its position"
        )

    mesh = pmesh.make_mesh(cfg.mesh)
    accum, total_updates = cfg.optimizer.grad_accum_steps, cfg.train.steps
    tx = make_optimizer(cfg.optimizer, total_updates, cfg.model)
    abstract, params_sh = abstract_state(cfg, tx, mesh)
    state_sh = jax.tree.map(lambda a: a.sharding, abstract)

    os.makedirs(workdir, exist_ok=True)  # only now: a config error leaves nothing behind
    ckpt = checkpoint.TrainCheckpointer(
        workdir, cfg.train.keep_checkpoints, cfg.train.async_checkpointing
    )
    logger = None
    try:
        state = ckpt.restore_latest(abstract, data_state)
        if state is not None:
            source = f"resumed from {ckpt.directory} at step {int(state.step) // accum}"
        else:
            state = fresh_state(cfg, tx, abstract, params_sh)
            source = (
                f"initialised from {cfg.init_from}"
                if cfg.init_from
                else f"random init (seed {cfg.train.seed})"
            )
        write_model_json(cfg, workdir)
        micro = int(state.step)
        shape = (
            f" of {cfg.data.batch_size} x {cfg.data.seq_len} tokens" if cfg.data is not None else ""
        )  # a caller's own iterator may come without a data config
        console(
            f"training {cfg.model.architecture} ({num_params(cfg.model):,} params) in "
            f"{workdir}: {source}; {total_updates} steps{shape}"
        )
        if micro >= total_updates * accum:
            console(f"{workdir} already holds the final step {total_updates}; nothing to do")
        logger = MetricsLogger(workdir, total_updates, micro // accum, cfg.train.progress_bar)
        with PreemptionWatcher() as watcher:
            run = _Run(cfg, workdir, mesh, tx, state_sh, params_sh, ckpt, logger, data_state)
            state = run.loop(state, micro, train_iterator, eval_batches, watcher)
            ckpt.wait()
        last = f"; last eval loss {run.last_eval:.4g}" if run.last_eval is not None else ""
        if run.preempted:
            console(
                f"preempted by {watcher.signal_name}: wrote the checkpoint of step "
                f"{run.last_saved} in {ckpt.directory}; the same command resumes it"
            )
        else:
            console(f"done: step {total_updates} in {workdir}{last}")
        return state
    finally:
        ckpt.close()
        if logger is not None:
            logger.close()


@dataclasses.dataclass
class _Run:
    """The mutable bookkeeping of one train() call (kept out of train() for readability)."""

    cfg: TrainConfig
    workdir: str
    mesh: jax.sharding.Mesh
    tx: optax.GradientTransformation
    state_sh: TrainState  # the state's shardings
    params_sh: Params  # the params' shardings
    ckpt: checkpoint.TrainCheckpointer
    logger: MetricsLogger
    data_state: Any
    # Set by loop():
    last_eval: float | None = None
    preempted: bool = False
    last_saved: int | None = None
    eval_batches: list[DeviceBatch] = dataclasses.field(default_factory=list)
    eval_fn: Callable[[Params, DeviceBatch], Metrics] | None = None
    throughput: monitor.Throughput | None = None

    def loop(
        self,
        state: TrainState,
        micro: int,
        it: Iterator[Batch],
        evals: Sequence[Batch],
        watcher: PreemptionWatcher,
    ) -> TrainState:

        tc, accum = self.cfg.train, self.cfg.optimizer.grad_accum_steps
        self.last_eval, self.preempted = None, False
        total_micro = tc.steps * accum
        step_fn: TrainStep | None = None
        self.eval_batches = [pmesh.shard_batch(b, self.mesh) for b in evals]
        self.eval_fn = None
        pending: list[tuple[int, dict]] = []  # (micro index, device metrics) not yet checked
        checked: list[dict] = []  # host metrics since the last log line
        self.last_saved = micro // accum if self.ckpt.all_steps() else None
        fingerprints = self._open_fingerprints() if tc.data_fingerprints else None
        window_t0, window_tokens = time.perf_counter(), 0
        profiler = monitor.Profiler(tc.profile_steps, self.workdir)
        while micro < total_micro:
            if micro % accum == 0:
                profiler.before(micro // accum + 1)
            try:
                batch = next(it)
            except StopIteration:
                raise ValueError(f"the training data ran out at micro-batch {micro}") from None
            if fingerprints is not None:
                crc = zlib.crc32(np.ascontiguousarray(batch["tokens"]).tobytes())
                fingerprints.write(json.dumps({"micro_step": micro, "crc32": crc}) + "\n")
                fingerprints.flush()
            global_batch = pmesh.shard_batch(batch, self.mesh)
            first = step_fn is None
            if step_fn is None:
                pmesh.check_batch_divisible(global_batch["tokens"].shape[0], self.mesh)
                step_fn = self._compile_step(global_batch)
                self.throughput = monitor.Throughput(
                    self.cfg.model, global_batch, list(self.mesh.devices.flat)
                )
            state, metrics = step_fn(state, global_batch)
            pending.append((micro, metrics))
            micro += 1
            if first:  # throughput excludes compilation: restart the clock after step one
                jax.block_until_ready(metrics)
                console(
                    f"first step (compilation included): {time.perf_counter() - window_t0:.1f}s"
                )
                window_t0 = time.perf_counter()
            else:
                window_tokens += global_batch["tokens"].size
            if micro % accum:
                continue
            update = micro // accum
            self.logger.advance(1)
            profiler.after(update, state)
            final = micro == total_micro
            preempted = watcher.reached(update)  # every process, every update
            do_log = update % tc.log_every == 0 or final
            do_eval = (tc.eval_every and update % tc.eval_every == 0) or final
            do_ckpt = (tc.checkpoint_every and update % tc.checkpoint_every == 0) or final
            do_ckpt = do_ckpt or preempted
            if not (do_log or do_eval or do_ckpt):
                continue
            checked.extend(self._check_finite(pending))
            pending.clear()
            if do_log:
                elapsed = time.perf_counter() - window_t0
                # None when only the compiling first step ran since the last line (untimed).
                rate = window_tokens / max(elapsed, 1e-9) if window_tokens else None
                self._log_train(update, checked, rate)
                checked.clear()
            if do_eval:
                self._evaluate(update, state.params)
            if do_ckpt:
                self.ckpt.save(update, state, self.data_state)
                self.last_saved = update
            if preempted and not final:
                self.preempted = True
                break
            window_t0, window_tokens = time.perf_counter(), 0
        profiler.stop()
        if fingerprints is not None:
            fingerprints.close()
        return state

    def _compile_step(self, global_batch: DeviceBatch) -> TrainStep:
        """The jitted train step for this batch layout (PT or SFT keys)."""
        cfg = self.cfg
        train_step = make_train_step(
            cfg.model,
            cfg.optimizer,
            self.tx,
            cfg.train.steps,
            cfg.train.loss_chunk,
            trainable_of(cfg),
            cfg.train.distill_draft_window,
        )
        ndims = {k: v.ndim for k, v in global_batch.items()}
        return sharding.jit_train_step(train_step, self.state_sh, self.mesh, ndims)

    def _check_finite(self, pending: list[tuple[int, dict]]) -> list[dict]:
        """Host copies of pending metrics; raises NonFiniteLossError at the first bad one."""
        accum = self.cfg.optimizer.grad_accum_steps
        host = jax.device_get([m for _, m in pending])
        for (micro, _), values in zip(pending, host, strict=True):
            bad = {k: float(values[k]) for k in CHECKED if not math.isfinite(float(values[k]))}
            if bad:
                step = micro // accum + 1
                where = f"step {step}" + (f" (micro-batch {micro % accum})" if accum > 1 else "")
                last = (
                    f"the last checkpoint, step {self.last_saved} in {self.ckpt.directory}, "
                    "is intact"
                    if self.last_saved is not None
                    else "no checkpoint was written"
                )
                raise NonFiniteLossError(
                    f"non-finite training values at {where}: "
                    + ", ".join(f"{k}={float(values[k])}" for k in CHECKED)
                    + f"; stopping ({last})"
                )
        return host

    def _log_train(self, update: int, checked: list[dict], tokens_per_s: float | None) -> None:
        weight = sum(float(m["weight"]) for m in checked)
        loss = sum(float(m["loss"]) * float(m["weight"]) for m in checked) / max(weight, 1.0)
        last = checked[-1]
        values = {
            "loss": loss,
            "lr": float(last["lr"]),
            "grad_norm": float(last["grad_norm"]),
            "param_norm": float(last["param_norm"]),
            "loss_tokens": int(weight),
        }
        if tokens_per_s is not None:
            assert self.throughput is not None  # set by the first step
            values["tokens_per_s"] = tokens_per_s
            values |= self.throughput.values(tokens_per_s)
        data_metrics = getattr(self.data_state, "metrics", None)
        if callable(data_metrics):  # e.g. a mixture's realized token shares (data/mixture.py)
            values |= data_metrics()
        values |= moe_log_values(checked)
        self.logger.write(update, "train", values)

    def _evaluate(self, update: int, params: Any) -> float:
        if not self.eval_batches:
            return float("nan")
        if self.eval_fn is None:
            ndims = {k: v.ndim for k, v in self.eval_batches[0].items()}
            self.eval_fn = sharding.jit_eval_step(
                make_eval_step(
                    self.cfg.model, self.cfg.train.loss_chunk, self.cfg.train.distill_draft_window
                ),
                self.params_sh,
                self.mesh,
                ndims,
            )
        sums = jax.device_get([self.eval_fn(params, b) for b in self.eval_batches])
        loss = sum(float(s["loss_sum"]) for s in sums) / max(
            sum(float(s["weight"]) for s in sums), 1
        )
        self.logger.write(
            update, "eval", {"loss": loss, "tokens": int(sum(float(s["weight"]) for s in sums))}
        )
        self.last_eval = loss
        return loss

    def _open_fingerprints(self) -> TextIO:
        name = f"data_fingerprints_p{jax.process_index()}.jsonl"
        return open(os.path.join(self.workdir, name), "a")  # noqa: SIM115
