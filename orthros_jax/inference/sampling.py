"""Token samplers: greedy, temperature, top-k and top-p (nucleus), jit-friendly.

A `Sampler` is a frozen (hashable) dataclass, so it is a static argument of the jitted
decode loop. `sample(logits [B, V], rng, sampler) -> [B] int32`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Sampler:
    """temperature 0 is greedy (argmax); top_k 0 and top_p 1.0 disable those filters."""

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


def filter_logits(logits: jax.Array, sampler: Sampler) -> jax.Array:
    """Temperature-scaled float32 logits [B, V] with the top-k / top-p tails set to -inf."""
    x = logits.astype(jnp.float32) / sampler.temperature
    if sampler.top_k and sampler.top_k < x.shape[-1]:
        kth = jax.lax.top_k(x, sampler.top_k)[0][:, -1:]  # [B, 1]
        x = jnp.where(x < kth, -jnp.inf, x)
    if sampler.top_p < 1.0:
        # Keep the smallest set of tokens whose probability reaches top_p: a token stays if
        # the mass strictly before it (in descending order) is < top_p; the top one always does.
        sorted_x = jnp.sort(x, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(sorted_x, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = mass_before < sampler.top_p
        cutoff = jnp.min(jnp.where(keep, sorted_x, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x < cutoff, -jnp.inf, x)
    return x


def sample(logits: jax.Array, rng: jax.Array, sampler: Sampler) -> jax.Array:
    """Next tokens [B] int32 from logits [B, V]."""
    if sampler.is_greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(rng, filter_logits(logits, sampler), axis=-1).astype(jnp.int32)
