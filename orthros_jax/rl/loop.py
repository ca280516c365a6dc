"""The GRPO loop: rollouts from the engine, rewards, advantages, one SFT-shaped update.

    state = run(RLConfig.from_config(config), workdir)

One RL step: `rollout.prompts` prompts of the task's training stream (a pure function of the
step), `rollout.group_size` completions each from the engine with the current policy, their
rewards, group-relative advantages, the pairs packed into the SFT-shaped batch, one optimizer
update. The reference policy is the starting point (init_from, or the random init of
train.seed): re-created on every start, never stored, so a resumed run continues bit-for-bit
from a checkpoint holding (step, policy, optimizer state, RNG); the prompts and sampling seeds
of every step derive from (train.seed, step). Metrics per step (metrics.jsonl, TensorBoard, the
progress bar): reward mean / std, KL, clip fraction, completion length, rollout and update
seconds and tokens per second; every train.eval_every steps the greedy reward on held-out
prompts.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import jax
import numpy as np

from orthros_jax import checkpoint
from orthros_jax.data.tokenizers import load_tokenizer
from orthros_jax.layers import lora
from orthros_jax.model import OrthrosLM, num_params
from orthros_jax.parallel import mesh as pmesh
from orthros_jax.parallel import sharding
from orthros_jax.rl import batch as batch_lib
from orthros_jax.rl import tasks
from orthros_jax.rl.config import RLConfig
from orthros_jax.rl.loss import make_update_step
from orthros_jax.rl.rollout import Rollout, rollout
from orthros_jax.serving.engine import Engine
from orthros_jax.training import start as train_start
from orthros_jax.training.config import TrainConfig
from orthros_jax.training.metrics import MetricsLogger, console
from orthros_jax.training.optimizer import make_optimizer
from orthros_jax.training.state import TrainState


def check(cfg: RLConfig) -> None:
    """Settings the dataclasses cannot check alone (ValueErrors before anything compiles)."""
    if cfg.optimizer.grad_accum_steps != 1:
        raise ValueError(
            f"optimizer.grad_accum_steps={cfg.optimizer.grad_accum_steps}: an RL step is one "
            "update on its own rollouts (raise grpo.rows for a larger batch)"
        )
    tok = load_tokenizer(cfg.task.tokenizer)
    if tok.vocab_size > cfg.model.vocab_size:
        raise ValueError(
            f"task.tokenizer has {tok.vocab_size} ids but model.vocab_size={cfg.model.vocab_size}"
        )


def _pairs(prompts: list[tasks.Prompt], ro: Rollout, adv_NG: np.ndarray) -> list[batch_lib.Pair]:
    out = []
    for i, group in enumerate(ro.samples):
        for j, s in enumerate(group):
            if s.tokens:
                out.append(
                    batch_lib.Pair(
                        prompts[i].ids,
                        np.asarray(s.tokens, np.int32),
                        np.asarray(s.logprobs, np.float32),
                        float(adv_NG[i, j]),
                    )
                )
    return out


class _Run:
    """The pieces of one run: engine, jitted update, task, logger."""

    def __init__(self, cfg: RLConfig, workdir: str) -> None:
        self.cfg, self.workdir = cfg, workdir
        self.tcfg = TrainConfig(
            model=cfg.model,
            data=None,
            optimizer=cfg.optimizer,
            train=cfg.train,
            mesh=cfg.mesh,
            init_from=cfg.init_from,
        )
        self.mesh = pmesh.make_mesh(cfg.mesh)
        self.tx = make_optimizer(cfg.optimizer, cfg.train.steps, cfg.model)
        self.abstract, self.params_sh = train_start.abstract_state(self.tcfg, self.tx, self.mesh)
        state_sh = jax.tree.map(lambda a: a.sharding, self.abstract)
        g = cfg.grpo
        batch_sh = {k: pmesh.batch_sharding(self.mesh, 2) for k in batch_lib.RL_KEYS}
        update = make_update_step(
            OrthrosLM(cfg.model),
            g,
            self.tx,
            cfg.rollout.temperature,
            train_start.trainable_of(self.tcfg),
        )
        # The rollout engine runs the plain model: the adapters merged into the policy's
        # weights each step (same shapes every step, so nothing recompiles).
        self.merge = jax.jit(lambda p: lora.merge(p, cfg.model)[0])
        self.update = jax.jit(
            sharding.traced_under(update, self.mesh),
            in_shardings=(state_sh, self.params_sh, batch_sh),
            out_shardings=(state_sh, pmesh.replicated(self.mesh)),
            donate_argnums=(0,),
        )
        self.tok = load_tokenizer(cfg.task.tokenizer)
        self.task = tasks.make_task(cfg.task, self.tok)
        r = cfg.rollout
        self.engine: Engine | None = None
        # One prefill shape: all of a step's requests arrive at once and fill every slot, so a
        # [max_batch, chunk] bucket is what runs (two compiles in all: prefill and decode).
        chunk = min(cfg.model.prefill_chunk, 1 << (r.max_len - 1).bit_length())
        self.new_engine = functools.partial(
            Engine,
            max_batch=r.max_batch,
            max_len=r.max_len,
            decode_text=self.tok.decode,
            eos_id=getattr(self.tok, "eos_id", None),
            seed=cfg.train.seed,
            chunk_budget=chunk,
            prefill_lengths=(chunk,),
            prefill_batches=(r.max_batch,),
        )

    def prompts(self, stream: int, first: int, n: int) -> list[tasks.Prompt]:
        return [self.task.prompt(self.cfg.train.seed, stream, first + i) for i in range(n)]

    def sample(
        self, params: Any, prompts: list[tasks.Prompt], group: int, temperature: float, step: int
    ) -> Rollout:
        params = self.merge(params) if self.cfg.model.lora is not None else params
        if self.engine is None:  # compiled once, before the first rollout is timed
            self.engine = self.new_engine(params, self.cfg.model.replace(lora=None))
            self.engine.warmup()
        else:
            self.engine.set_params(params)
        return rollout(
            self.engine,
            prompts,
            group_size=group,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            temperature=temperature,
            seed=self.cfg.train.seed,
            step=step,
        )

    def rewards(self, prompts: list[tasks.Prompt], ro: Rollout) -> np.ndarray:
        texts = [s.text for group in ro.samples for s in group]
        answers = [p.answer for p, group in zip(prompts, ro.samples, strict=True) for _ in group]
        return tasks.score(self.task.reward, texts, answers).reshape(len(prompts), -1)

    def evaluate(self, params: Any) -> float:
        """Mean greedy reward on the held-out prompts."""
        prompts = self.prompts(tasks.EVAL_STREAM, 0, self.cfg.task.eval_prompts)
        ro = self.sample(params, prompts, 1, 0.0, step=0)  # greedy: the seeds are unused
        return float(self.rewards(prompts, ro).mean())

    def step(self, state: TrainState, ref: Any, step: int) -> tuple[TrainState, dict[str, float]]:
        r, g = self.cfg.rollout, self.cfg.grpo
        prompts = self.prompts(tasks.TRAIN_STREAM, step * r.prompts, r.prompts)
        ro = self.sample(state.params, prompts, r.group_size, r.temperature, step)
        rewards = self.rewards(prompts, ro)
        adv = batch_lib.group_advantages(rewards, g.scale_rewards)
        b = batch_lib.pack_pairs(_pairs(prompts, ro, adv), g.rows, g.seq_len, g.out_len)
        t0 = time.perf_counter()
        state, m = self.update(state, ref, pmesh.shard_batch(b, self.mesh))
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        update_s = time.perf_counter() - t0
        lengths = [len(s.tokens) for group in ro.samples for s in group]
        update_tokens = int((b["segment_ids"] > 0).sum())
        return state, {
            **m,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "completion_len": float(np.mean(lengths)),
            "rollout_s": ro.seconds,
            "update_s": update_s,
            "rollout_tokens_per_s": ro.completion_tokens / max(ro.seconds, 1e-9),
            "update_tokens_per_s": update_tokens / max(update_s, 1e-9),
        }


def run(cfg: RLConfig, workdir: str) -> TrainState:
    """GRPO from init_from (or a random init), resuming from workdir/checkpoints when present;
    returns the final state. workdir is a model directory of the policy (launch/generate.py)."""
    check(cfg)
    workdir = os.path.abspath(workdir)
    train_start.check_resumed_model(TrainConfig(cfg.model, None, train=cfg.train), workdir)
    rr = _Run(cfg, workdir)
    os.makedirs(workdir, exist_ok=True)
    ckpt = checkpoint.TrainCheckpointer(workdir, cfg.train.keep_checkpoints, False)
    logger = None
    try:
        start = train_start.fresh_state(rr.tcfg, rr.tx, rr.abstract, rr.params_sh)
        ref = jax.tree.map(lambda x: x.copy(), start.params)  # the update donates the state
        state = ckpt.restore_latest(rr.abstract, None)
        state = start if state is None else state
        first = int(state.step)
        max_context = cfg.grpo.seq_len
        checkpoint.write_model_json(workdir, cfg.model, cfg.task.tokenizer, max_context)
        train_start.write_trainable(rr.tcfg, workdir)
        console(
            f"GRPO on {cfg.task.name}: {cfg.model.architecture} ({num_params(cfg.model):,} params)"
            f" in {workdir}, step {first} of {cfg.train.steps}; {cfg.rollout.prompts} prompts x "
            f"{cfg.rollout.group_size} samples per step"
        )
        logger = MetricsLogger(workdir, cfg.train.steps, first, cfg.train.progress_bar)
        if first == 0 and cfg.train.eval_every:
            logger.write(0, "eval", {"reward": rr.evaluate(state.params)})
        for step in range(first, cfg.train.steps):
            state, metrics = rr.step(state, ref, step)
            done = step + 1
            logger.advance(1)
            if done % cfg.train.log_every == 0 or done == cfg.train.steps:
                logger.write(done, "train", metrics)
            if cfg.train.eval_every and (
                done % cfg.train.eval_every == 0 or done == cfg.train.steps
            ):
                logger.write(done, "eval", {"reward": rr.evaluate(state.params)})
            if (cfg.train.checkpoint_every and done % cfg.train.checkpoint_every == 0) or (
                done == cfg.train.steps
            ):
                ckpt.save(done, state, None)
        ckpt.wait()
        return state
    finally:
        ckpt.close()
        if logger is not None:
            logger.close()
