"""Self-speculative decoding: the model drafts k tokens cheaply, verifies them in one pass, and
keeps the longest prefix the model itself would have produced (docs/speculative.md).

Shapes: B rows, k drafts per round, L = k + 1, V vocab, M new tokens, N stop ids per row.

A round, for every running row at position pos with its pending token (sampled, not yet fed):
  draft    drivers.decode with draft_window: Orthros's base stream runs exactly (its window;
           it alone writes the K/V, so every drafted token's K/V is the true one) and the
           output copy reads only the last draft_window slots; a single-stream arm reads only
           those slots in every layer (its K/V are approximate). k steps feed the pending token
           and drafts d_1 .. d_{k-1}, each draft drawn from the draft's distribution q_j.
  verify   spec_passes: the model's distributions p_1 .. p_{k+1} at pos .. pos + k in one pass
           (Orthros: verify_folded, d_k's base stream writing its K/V, then k + 1 output copies
           over the whole cache; single-stream: the k + 1 tokens again through every layer,
           rewriting their K/V).
  accept   (spec_accept.py) greedy: d_j while it is p_j's argmax; sampling: d_j with probability
           min(1, p_j(d_j) / q_j(d_j)), the first rejection resampled from norm(max(0, p - q)),
           after k acceptances a bonus token from p_{k+1}. Every emitted token is then
           distributed exactly as plain decode's (p: the sampler's filtered distribution).
  rollback the row's length moves to pos + accepted + 1: the rejected drafts' slots are
           stale, masked by the length like any slot past it.
The rounds run in one lax.while_loop on device. A row drafts at most k_b = min(k, free slots
- 1, budget - 1) tokens, so capacity, max_new_tokens and the stop ids (emitted, then the row
stops) behave as in plain decode. The token at a row's sampling step t draws with keys folded
from fold_in(PRNGKey(seed_b), t), as plain decode's do (sampling.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig
from orthros_jax.inference import drivers as fwd
from orthros_jax.inference import logit_processing as lp
from orthros_jax.inference import spec_accept as acc
from orthros_jax.inference import spec_passes
from orthros_jax.inference.cache import KVCache
from orthros_jax.inference.sampling import (
    TOP_LOGPROBS,
    RowSampling,
    Sampled,
    Sampler,
    first_draw,
)
from orthros_jax.layers.registry import kinds_of
from orthros_jax.model import Params


@dataclasses.dataclass(frozen=True)
class Speculative:
    """k: drafts per round (>= 1); draft_window: the slots a draft's global attention reads
    (>= 1, at most the cache). Frozen (hashable): a static argument of the jitted loop."""

    k: int = 4
    draft_window: int = 256

    def __post_init__(self) -> None:
        for name in ("k", "draft_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Speculative.{name} must be an int >= 1, got {value!r}")


def check(spec: Speculative, cfg: ModelConfig, cache_size: int, sequence_split: bool) -> None:
    """One-line ValueError (before any compile) for a speculation this model or cache cannot
    run: a draft window beyond the cache, a recurrent layer (its state would have to roll back
    with the length), paired MoE routing (the verify copies run without their base tokens), or a
    sequence-split cache."""
    if spec.draft_window > cache_size:
        raise ValueError(
            f"Speculative.draft_window={spec.draft_window} exceeds the cache ({cache_size} slots)"
        )
    recurrent = [k.name for k in kinds_of(cfg) if k.recurrent]
    if recurrent:
        raise ValueError(
            f"speculative decoding cannot roll back the recurrent state of {recurrent} layers"
        )
    if cfg.two_streams and cfg.moe_routing == "paired":
        raise ValueError("speculative decoding does not support moe routing 'paired'")
    if sequence_split:
        raise ValueError("speculative decoding does not run on a sequence-split cache (mesh)")


class SpecStats(flax.struct.PyTreeNode):
    """Per row [B]: rounds (verify passes), drafted (draft tokens proposed), accepted (drafts
    kept). Mean accepted length = (accepted + rounds) / rounds tokens per verify."""

    rounds: jax.Array
    drafted: jax.Array
    accepted: jax.Array

    def tokens_per_verify(self) -> float:
        """Mean accepted length over every row: (accepted + rounds) / rounds (1: no draft ever
        accepted; k + 1: all of them; 0: no round ran)."""
        rounds = int(self.rounds.sum())
        return (int(self.accepted.sum()) + rounds) / max(1, rounds)

    def acceptance_rate(self) -> float:
        """Drafts accepted / drafts proposed, over every row."""
        return int(self.accepted.sum()) / max(1, int(self.drafted.sum()))


class _State(flax.struct.PyTreeNode):
    cache: KVCache
    tok: jax.Array  # [B] the pending token (sampled, to feed next)
    left: jax.Array  # [B] tokens the row may still emit (0: it stopped)
    count: jax.Array  # [B] the row's sampling step (tokens it sampled so far)
    hit: jax.Array  # [B] bool: stopped for want of a cache slot
    emitted: jax.Array  # [B] tokens written to the buffers
    out: Sampled  # buffers [B, M, ...]: tokens (-1 past the end), log-probs
    stats: SpecStats
    hist: Any = None  # lp.History: the engine's logit processing (None: none)


def _round(
    params: Params,
    st: _State,
    rows: RowSampling,
    stops_BN: jax.Array,
    pen: lp.Penalties | None,
    *,
    cfg: ModelConfig,
    spec: Speculative,
    greedy: bool,
) -> _State:
    """One draft / verify / accept / rollback round of every running row (module docstring).
    greedy: every row is greedy (static: no draft distributions, draws or filters). With
    st.hist and pen (the engine's logit processing), every draft and verified position's logits
    are processed as plain decode's step there would be (logit_processing.apply_positions), and
    the round's kept tokens are recorded."""
    k, cache = spec.k, st.cache
    s, pos = cache.max_len, cache.lengths
    full = pos >= s
    run = (st.left > 0) & ~full
    k_b = jnp.where(run, jnp.clip(jnp.minimum(s - 1 - pos, st.left - 1), 0, k), 0)
    draft = functools.partial(fwd.decode, cfg=cfg, draft_window=spec.draft_window)
    draft_rows = rows.replace(step=st.count)

    def draft_step(carry: Any, j: jax.Array) -> tuple[Any, tuple[jax.Array, Any]]:
        cache, feed, hist = carry
        # Rows feed the pending token and d_1 .. d_{k_b - 1}; Orthros feeds d_{k_b} too where
        # k_b < k (its K/V for the verify copies: d_k's is written by verify_folded).
        active = run & ((j <= k_b) if cfg.two_streams else (j < k_b))
        logits, cache = draft(params, cache, feed, active)
        if pen is not None:  # the draft sees the history the verifier's position j will
            hist = lp.record_output(hist, feed, active)
            logits = lp.apply(logits, hist, pen, st.count + j)
        d = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        if greedy:
            return (cache, d, hist), (d, None)
        q = acc.filtered(logits[:, None], draft_rows)[:, 0]
        drawn = acc.categorical(acc.keys(rows.seed, st.count + j, acc.DRAFT), q)
        d = jnp.where(rows.temperature > 0, drawn, d)
        return (cache, d, hist), (d, q)

    (cache, _, _), (d_kB, q_kBV) = jax.lax.scan(
        draft_step, (cache, st.tok, st.hist), jnp.arange(k, dtype=jnp.int32)
    )
    drafts = d_kB.T  # [B, k]
    fed = jnp.concatenate([st.tok[:, None], drafts], axis=1)  # [B, L]
    if cfg.two_streams:
        last = run & (k_b == k)  # d_k's base stream runs in the verify pass
        p_logits, cache = spec_passes.verify_folded(params, cache, fed, pos, last, cfg=cfg)
    else:
        valid = run[:, None] & (jnp.arange(k + 1) <= k_b[:, None])
        p_logits, cache = spec_passes.verify_rewrite(params, cache, fed, pos, valid, cfg=cfg)
    if pen is not None:
        p_logits = lp.apply_positions(p_logits, st.hist, pen, fed, st.count)
    if greedy:
        n, e, lp_e = acc.accept_greedy(drafts, p_logits, k_b)
    else:
        q = jnp.swapaxes(q_kBV, 0, 1)  # [B, k, V]
        n, e, lp_e = acc.accept(drafts, q, p_logits, k_b, draft_rows)
    # Emit e_1 .. e_{n+1} up to (and with) the first stop id.
    num = jnp.where(run, n + 1, 0)
    live = jnp.arange(k + 1) < num[:, None]
    is_stop = (e[:, :, None] == stops_BN[:, None, :]).any(-1) & live
    stopped = is_stop.any(axis=1)
    num = jnp.where(stopped, jnp.argmax(is_stop, axis=1) + 1, num)
    live = jnp.arange(k + 1) < num[:, None]
    m = st.out.tokens.shape[1]
    at = jnp.where(live, st.emitted[:, None] + jnp.arange(k + 1), m)  # m: dropped
    rows_idx = jnp.arange(at.shape[0])[:, None]
    got = Sampled(e, lp_e)
    if st.out.logprob is not None:
        got = acc.api_logprobs(p_logits, e).replace(sample_logprob=lp_e)
    put = lambda buf, x: buf.at[rows_idx, at].set(x, mode="drop")
    out = jax.tree.map(put, st.out, got)
    # Rollback: the row keeps pos .. pos + n (the pending token and the accepted drafts).
    cache = cache.replace(lengths=jnp.where(run, pos + n + 1, pos))
    kept = run[:, None] & (jnp.arange(k + 1) <= n[:, None])
    hist = None if pen is None else lp.record_outputs(st.hist, fed, kept)
    stats = st.stats
    return _State(
        cache=cache,
        tok=jnp.take_along_axis(e, n[:, None], axis=1)[:, 0],
        left=jnp.where(run & ~stopped, st.left - num, 0),
        count=st.count + num,
        hit=st.hit | ((st.left > 0) & full),
        emitted=st.emitted + num,
        out=out,
        stats=SpecStats(
            rounds=stats.rounds + run,
            drafted=stats.drafted + k_b,
            accepted=stats.accepted + jnp.where(run, n, 0),
        ),
        hist=hist,
    )


def generate_loop(
    params: Params,
    cache: KVCache,
    logits: jax.Array,
    rng: jax.Array,
    stops: jax.Array,
    *,
    cfg: ModelConfig,
    sampler: Sampler,
    max_new_tokens: int,
    spec: Speculative,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, KVCache, SpecStats]:
    """api.generate's loop under speculation: the first token from the prefill's logits, then
    rounds until every row stopped. Returns (tokens [B, M] (-1 past the end), emitted [B],
    hit_capacity [B], logprobs [B, M], the cache, SpecStats)."""
    rows, first, left = first_draw(logits, rng, sampler, stops, max_new_tokens)
    bsz = cache.batch_size
    zeros = jnp.zeros((bsz,), jnp.int32)
    st = _State(
        cache=cache,
        tok=first.tokens,
        left=left,
        count=zeros + 1,
        hit=jnp.zeros((bsz,), bool),
        emitted=zeros + 1,
        out=Sampled(
            jnp.full((bsz, max_new_tokens), -1, jnp.int32).at[:, 0].set(first.tokens),
            jnp.zeros((bsz, max_new_tokens), jnp.float32).at[:, 0].set(first.sample_logprob),
        ),
        stats=SpecStats(zeros, zeros, zeros),
    )
    body = functools.partial(
        _round,
        params,
        rows=rows,
        stops_BN=stops,
        pen=None,
        cfg=cfg,
        spec=spec,
        greedy=sampler.is_greedy,
    )
    st = jax.lax.while_loop(lambda st: (st.left > 0).any(), body, st)
    return st.out.tokens, st.emitted, st.hit, st.out.sample_logprob, st.cache, st.stats


generate_jit = jax.jit(
    generate_loop,
    static_argnames=("cfg", "sampler", "max_new_tokens", "spec"),
    donate_argnames=("cache",),
)


def decode_rounds(
    params: Params,
    cache: KVCache,
    tokens_B: jax.Array,
    budget_B: jax.Array,
    stops_BN: jax.Array,
    rows: RowSampling,
    hist: lp.History,
    pen: lp.Penalties,
    *,
    cfg: ModelConfig,
    spec: Speculative,
    rounds: int,
) -> tuple[Sampled, jax.Array, KVCache, lp.History, SpecStats]:
    """The serving engine's multi-step decode under speculation: at most `rounds` rounds (static)
    of every row with budget, each feeding its pending token tokens_B (sampled, not yet fed);
    rows.step: the row's sampling step; budget_B: tokens the row may still emit (0: idle).
    Greedy and sampled rows mix (greedy=False); each row's logits are processed with hist / pen
    as plain decode's (logit_processing). Returns (Sampled with leaves [B, M, ...], M = rounds *
    (k + 1): tokens (-1 past each row's end), sample_logprob (under the filtered p, 0 for greedy
    rows) and the API's logprob / top_ids / top_logprobs (sampling.sample_rows'); emitted [B];
    the cache; the history with the kept tokens recorded; SpecStats of these rounds)."""
    bsz, m = cache.batch_size, rounds * (spec.k + 1)
    zeros = jnp.zeros((bsz,), jnp.int32)
    n_top = min(TOP_LOGPROBS, cfg.vocab_size)
    st = _State(
        cache=cache,
        tok=jnp.asarray(tokens_B, jnp.int32),
        left=jnp.asarray(budget_B, jnp.int32),
        count=jnp.asarray(rows.step, jnp.int32),
        hit=jnp.zeros((bsz,), bool),
        emitted=zeros,
        out=Sampled(
            jnp.full((bsz, m), -1, jnp.int32),
            jnp.zeros((bsz, m), jnp.float32),
            jnp.zeros((bsz, m), jnp.float32),
            jnp.zeros((bsz, m, n_top), jnp.int32),
            jnp.zeros((bsz, m, n_top), jnp.float32),
        ),
        stats=SpecStats(zeros, zeros, zeros),
        hist=hist,
    )
    body = functools.partial(
        _round, params, rows=rows, stops_BN=stops_BN, pen=pen, cfg=cfg, spec=spec
    )
    _, st = jax.lax.while_loop(
        lambda c: (c[0] < rounds) & (c[1].left > 0).any(),
        lambda c: (c[0] + 1, body(c[1], greedy=False)),
        (jnp.zeros((), jnp.int32), st),
    )
    return st.out, st.emitted, st.cache, st.hist, st.stats
