"""Token sampling, the one sampler of `generate` and the serving engine: every row of a batch
with its own temperature, top-k, top-p and PRNG key, jit-friendly.

Shapes: B rows, V vocab, N top logprobs returned.

    Sampler(temperature, top_k, top_p)        one static setting (generate's argument)
    RowSampling(temperature, top_k, top_p, seed, step)   arrays [B]: one setting per row
    sample_rows(logits [B, V], RowSampling) -> Sampled   tokens [B] and their log-probs

The filter, row by row: temperature, then top-k (keeping ties), then top-p over what top-k
kept; temperature 0 is greedy (argmax). Row b's draw uses the key fold_in(PRNGKey(seed_b),
step_b), so it depends only on the row's logits, settings, seed and token count, never on the
batch around it or on how many decode steps one call runs. `generate` gives row b the seed
`row_seeds(rng, B)[b]` (from its rng and b alone). A batch of greedy rows skips the sort, the
filters and the draws (a lax.cond), and a batch with no top-k / top-p skips the sort.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

TOP_LOGPROBS = 5  # alternatives returned per token (the OpenAI API's maximum for completions)


@dataclasses.dataclass(frozen=True)
class Sampler:
    """temperature 0 is greedy (argmax); top_k 0 and top_p 1.0 disable those filters.
    Frozen (hashable): a static argument of the jitted generate loop."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"Sampler.temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"Sampler.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"Sampler.top_p must be in (0, 1] (1 = off), got {self.top_p!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def greedy() -> Sampler:
    return Sampler()


def temperature(t: float) -> Sampler:
    return Sampler(temperature=t)


def top_k(k: int, t: float = 1.0) -> Sampler:
    return Sampler(temperature=t, top_k=k)


def top_p(p: float, t: float = 1.0) -> Sampler:
    return Sampler(temperature=t, top_p=p)


class RowSampling(flax.struct.PyTreeNode):
    """Per-row settings, each [B]: temperature (0 = greedy), top_k (0 = off), top_p (1 = off),
    seed (uint32: the row's PRNG key is PRNGKey(seed)), step (tokens the row sampled so far:
    the key of this draw is fold_in(PRNGKey(seed), step))."""

    temperature: Any  # jax.Array or a host numpy array
    top_k: Any
    top_p: Any
    seed: Any
    step: Any

    @classmethod
    def uniform(cls, sampler: Sampler, seed_B: jax.Array, step_B: jax.Array) -> RowSampling:
        """Every row with `sampler`'s settings, its own seed [B] and step [B]."""
        full = lambda v, dtype: jnp.full(seed_B.shape, v, dtype)
        return cls(
            temperature=full(sampler.temperature, jnp.float32),
            top_k=full(sampler.top_k, jnp.int32),
            top_p=full(sampler.top_p, jnp.float32),
            seed=seed_B,
            step=step_B,
        )


class Sampled(flax.struct.PyTreeNode):
    """tokens [B] int32; sample_logprob [B] float32: log-softmax of the processed distribution
    (temperature, top-k, top-p) at the token, what the sampler drew it with (0 for greedy rows:
    the argmax has probability 1). With logprobs=True also what an API reports: logprob [B]
    (log-softmax of the raw logits at the token) and top_ids / top_logprobs [B, N] (the N most
    likely tokens of the raw distribution); None otherwise."""

    tokens: jax.Array
    sample_logprob: jax.Array
    logprob: Any = None  # jax.Array, or None with logprobs=False (also the two below)
    top_ids: Any = None
    top_logprobs: Any = None


def row_seeds(rng: jax.Array, batch: int) -> jax.Array:
    """[B] uint32 seeds from one PRNG key: row b's from (rng, b) only, not from B."""
    rows = jnp.arange(batch, dtype=jnp.uint32)
    return jax.vmap(lambda b: jax.random.bits(jax.random.fold_in(rng, b), (), jnp.uint32))(rows)


def filter_rows(
    logits_BV: jax.Array, temperature_B: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array
) -> jax.Array:
    """Temperature-scaled float32 logits [B, V] with each row's top-k / top-p tail at -inf.
    Greedy rows (temperature 0) are scaled by 1 (their filter is unused)."""
    v = logits_BV.shape[-1]
    t = jnp.where(temperature_B > 0, temperature_B, 1.0).astype(jnp.float32)
    x = logits_BV.astype(jnp.float32) / t[:, None]
    k = jnp.where((top_k_B > 0) & (top_k_B < v), top_k_B, v)

    def cut() -> jax.Array:
        desc = -jnp.sort(-x, axis=-1)  # [B, V] descending
        kth = jnp.take_along_axis(desc, (k - 1)[:, None], axis=-1)  # [B, 1]
        kept = jnp.where(x < kth, -jnp.inf, x)
        # Top-p over the top-k survivors (ties with the k-th included): a token stays if the
        # mass strictly before it (in descending order) is < top_p; the top one always does.
        desc = jnp.where(desc < kth, -jnp.inf, desc)
        probs = jax.nn.softmax(desc, axis=-1)
        keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p_B[:, None]
        cutoff = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
        return jnp.where((top_p_B[:, None] < 1.0) & (kept < cutoff), -jnp.inf, kept)

    # No row filters (every k = V, p = 1): cut() would return x; skip its sort.
    return jax.lax.cond(jnp.any(k < v) | jnp.any(top_p_B < 1.0), cut, lambda: x)


def sample_rows(logits_BV: jax.Array, s: RowSampling, *, logprobs: bool = True) -> Sampled:
    """One token per row under its own settings (see the module docstring)."""
    greedy = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    sampled = s.temperature > 0

    def draw() -> tuple[jax.Array, jax.Array]:
        filtered = filter_rows(logits_BV, s.temperature, s.top_k, s.top_p)
        keys = jax.vmap(lambda seed, n: jax.random.fold_in(jax.random.PRNGKey(seed), n))(
            s.seed, s.step
        )
        drawn = jax.vmap(lambda key, x: jax.random.categorical(key, x[None], axis=-1)[0])(
            keys, filtered
        ).astype(jnp.int32)
        at = jnp.take_along_axis(filtered, drawn[:, None], axis=-1)[:, 0]
        return drawn, at - jax.nn.logsumexp(filtered, axis=-1)

    # A batch of greedy rows skips the sort, the filters and the draws (a decode step's few
    # hundred microseconds on a CPU); any sampled row runs them for all.
    argmax = lambda: (greedy, jnp.zeros(greedy.shape, jnp.float32))
    drawn, lp = jax.lax.cond(jnp.any(sampled), draw, argmax)
    tokens = jnp.where(sampled, drawn, greedy)
    out = Sampled(tokens, jnp.where(sampled, lp, 0.0))
    if not logprobs:
        return out
    logp = jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1)
    top_lp, top_ids = jax.lax.top_k(logp, min(TOP_LOGPROBS, logp.shape[-1]))
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return out.replace(logprob=chosen, top_ids=top_ids.astype(jnp.int32), top_logprobs=top_lp)


def filter_logits(logits_BV: jax.Array, sampler: Sampler) -> jax.Array:
    """filter_rows with `sampler`'s settings on every row (float32 [B, V], tails at -inf)."""
    b = logits_BV.shape[0]
    rows = RowSampling.uniform(sampler, jnp.zeros((b,), jnp.uint32), jnp.zeros((b,), jnp.int32))
    return filter_rows(logits_BV, rows.temperature, rows.top_k, rows.top_p)


@functools.partial(jax.jit, static_argnames=("sampler",))
def sample(logits_BV: jax.Array, rng: jax.Array, sampler: Sampler, step: Any = 0) -> jax.Array:
    """Next tokens [B] int32 from logits [B, V], every row with `sampler`: row b draws what
    generate(..., sampler=sampler, rng=rng) draws for its row b at token `step` (0: the first)."""
    b = logits_BV.shape[0]
    rows = RowSampling.uniform(sampler, row_seeds(rng, b), jnp.full((b,), step, jnp.int32))
    return sample_rows(logits_BV, rows, logprobs=False).tokens


def first_draw(
    logits_BV: jax.Array, rng: jax.Array, sampler: Sampler, stops_BN: jax.Array, new_tokens: int
) -> tuple[RowSampling, Sampled, jax.Array]:
    """generate's first token, from the prefill's logits [B, V]: every row samples with
    `sampler` and its own seed from rng at step 0. Returns the rows' sampling, the draw and the
    steps each row has left (0 where the draw is one of its stop ids, stops_BN -1 padded)."""
    bsz = logits_BV.shape[0]
    rows = RowSampling.uniform(sampler, row_seeds(rng, bsz), jnp.zeros((bsz,), jnp.int32))
    first = sample_rows(logits_BV, rows, logprobs=False)
    stopped = (first.tokens[:, None] == stops_BN).any(axis=-1)
    return rows, first, jnp.where(stopped, 0, new_tokens - 1)
