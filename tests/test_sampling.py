"""The one sampler (orthros_jax/inference/sampling.py) of `generate` and the serving engine,
against a float64 NumPy oracle of its rule: temperature, then top-k keeping ties, then top-p
over what top-k kept; each row's draw keyed by its own seed and step; the log-probs it
reports; generate's sampled tokens and log-probs against the PT forward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from serving_helpers import arm_model

from orthros_jax.inference import generate, sampling
from orthros_jax.inference.sampling import RowSampling
from orthros_jax.model import OrthrosLM

# (temperature, top_k, top_p) per row: greedy (with filters it must ignore), plain temperature,
# top-k at a tie (keeps 3), top-p, both, a top-k wider than the vocab, top-k = 1 at a high
# temperature.
SETTINGS = [(0.0, 3, 0.5), (1.0, 0, 1.0), (0.7, 2, 1.0), (1.3, 0, 0.8), (0.9, 7, 0.5)]
SETTINGS += [(1.1, 99, 1.0), (2.0, 1, 1.0)]
V = 50
# Jitted once here: eagerly, each of their ops would compile on its own.
sample_rows = jax.jit(sampling.sample_rows, static_argnames="logprobs")
filter_rows = jax.jit(sampling.filter_rows)
filter_logits = jax.jit(sampling.filter_logits, static_argnums=1)


def _oracle_filter(logits: np.ndarray, t: float, k: int, p: float) -> np.ndarray:
    """One row's processed logits (float64; -inf outside the kept set), written from the rule."""
    scale = np.float64(np.float32(t)) if t > 0 else 1.0  # the sampler divides in float32
    x = (logits.astype(np.float64) / scale).astype(np.float32).astype(np.float64)
    if 0 < k < len(x):
        kth = np.sort(x)[::-1][k - 1]
        x = np.where(x >= kth, x, -np.inf)  # ties with the k-th stay
    if p < 1.0:
        kept = np.sort(x[np.isfinite(x)])[::-1]  # what top-k kept, descending
        probs = np.exp(kept - kept.max())
        probs /= probs.sum()
        before = np.cumsum(probs) - probs
        cutoff = kept[before < p].min()
        x = np.where(x >= cutoff, x, -np.inf)
    return x


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x[np.isfinite(x)].max()
    return x - (m + np.log(np.exp(x - m).sum()))


def _rows(step) -> RowSampling:
    return RowSampling(
        temperature=jnp.array([t for t, _, _ in SETTINGS], jnp.float32),
        top_k=jnp.array([k for _, k, _ in SETTINGS], jnp.int32),
        top_p=jnp.array([p for _, _, p in SETTINGS], jnp.float32),
        seed=jnp.arange(len(SETTINGS), dtype=jnp.uint32) + 11,
        step=jnp.asarray(step, jnp.int32),
    )


def _logits(seed: int = 0) -> np.ndarray:
    """[rows, V] float32 logits with a tie at ranks 2 and 3 of every row (top-k = 2 keeps both)."""
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(seed), (len(SETTINGS), V))) * 3
    order = np.argsort(-x, axis=-1)
    rows = np.arange(len(x))
    for j in (5, 6):
        x[rows, order[:, j]] = x[rows, order[:, 0]] - 0.01
    x = x.astype(np.float32)
    ranks = np.argsort(-x, axis=-1, kind="stable")
    assert (x[rows, ranks[:, 1]] == x[rows, ranks[:, 2]]).all(), "the tie is not at ranks 2-3"
    assert (x[rows, ranks[:, 2]] > x[rows, ranks[:, 3]]).all(), "the tie is not at ranks 2-3"
    return x


def test_filter_matches_the_oracle_row_by_row():
    logits = _logits()
    s = _rows(np.zeros(len(SETTINGS)))
    got = np.asarray(filter_rows(jnp.asarray(logits), s.temperature, s.top_k, s.top_p))
    for i, (t, k, p) in enumerate(SETTINGS):
        want = _oracle_filter(logits[i], t, k, p)
        np.testing.assert_array_equal(np.isfinite(got[i]), np.isfinite(want), err_msg=str(i))
        kept = np.isfinite(want)
        np.testing.assert_allclose(got[i][kept], want[kept], rtol=1e-6, atol=0)
    assert np.isfinite(got[2]).sum() == 3  # top-k = 2 keeps the tie at ranks 2-3
    # A batch with no top-k / top-p takes the branch without the sort: the same scaled logits.
    plain = np.asarray(filter_logits(jnp.asarray(logits), sampling.temperature(0.5)))
    np.testing.assert_allclose(plain, logits / np.float32(0.5), rtol=1e-6, atol=0)


@pytest.mark.parametrize("step", [[0, 3, 1, 4, 2, 0, 9], [5, 5, 5, 5, 5, 5, 5]])
def test_each_row_draws_with_its_own_key_and_reports_its_logprobs(step):
    logits = _logits(1)
    s = _rows(step)
    got = sample_rows(jnp.asarray(logits), s)
    raw = np.stack([_log_softmax(r.astype(np.float64)) for r in logits])
    for i, (t, k, p) in enumerate(SETTINGS):
        tok = int(got.tokens[i])
        want = _oracle_filter(logits[i], t, k, p)
        if t == 0:
            assert tok == int(np.argmax(logits[i])) and float(got.sample_logprob[i]) == 0.0
            continue
        key = jax.random.fold_in(jax.random.PRNGKey(11 + i), step[i])
        draw = jax.random.categorical(key, jnp.asarray(want, jnp.float32)[None], axis=-1)
        assert tok == int(draw[0]), i
        assert np.isfinite(want[tok]), i
        np.testing.assert_allclose(
            float(got.sample_logprob[i]), _log_softmax(want)[tok], rtol=1e-5, atol=1e-5
        )
    np.testing.assert_allclose(
        got.logprob, raw[np.arange(len(SETTINGS)), np.asarray(got.tokens)], rtol=1e-5, atol=1e-5
    )
    order = np.argsort(-raw, axis=-1)[:, : sampling.TOP_LOGPROBS]
    np.testing.assert_array_equal(got.top_ids, order)
    np.testing.assert_allclose(
        got.top_logprobs, np.take_along_axis(raw, order, -1), rtol=1e-5, atol=1e-5
    )
    assert float(got.sample_logprob[-1]) == 0.0  # top-k = 1: the one token has probability 1


@pytest.mark.slow
def test_greedy_batch_and_batch_sampler():
    logits = jnp.asarray(_logits(2))
    b = logits.shape[0]
    greedy = RowSampling.uniform(
        sampling.greedy(), jnp.arange(b, dtype=jnp.uint32), jnp.zeros(b, jnp.int32)
    )
    out = sample_rows(logits, greedy, logprobs=False)
    np.testing.assert_array_equal(out.tokens, np.argmax(np.asarray(logits), -1))
    np.testing.assert_array_equal(out.sample_logprob, 0.0)
    assert out.logprob is None and out.top_ids is None
    # Row b's seed comes from (rng, b) alone, so the batch sampler's row b does not change
    # with the batch size.
    rng = jax.random.PRNGKey(3)
    np.testing.assert_array_equal(sampling.row_seeds(rng, 3), sampling.row_seeds(rng, b)[:3])
    sampler = sampling.top_p(0.9, 1.2)
    rows = RowSampling.uniform(sampler, sampling.row_seeds(rng, b), jnp.full(b, 4, jnp.int32))
    want = sample_rows(logits, rows).tokens
    np.testing.assert_array_equal(sampling.sample(logits, rng, sampler, 4), want)
    np.testing.assert_array_equal(sampling.sample(logits[:3], rng, sampler, 4), want[:3])


@pytest.mark.slow
def test_samplers_filter_and_sample():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    finite = lambda s: np.isfinite(np.asarray(filter_logits(logits, s)))[0].tolist()
    assert finite(sampling.top_k(2)) == [True, True, False, False]
    assert finite(sampling.top_p(0.7)) == [True, True, False, False]  # 0.5 < 0.7 <= 0.8
    assert finite(sampling.top_p(0.5)) == [True, False, False, False]
    assert finite(sampling.temperature(0.5)) == [True] * 4
    keys = jax.random.split(jax.random.PRNGKey(0), 512)
    draws = jax.vmap(lambda k: sampling.sample(logits, k, sampling.top_k(2)))(keys)
    assert set(np.asarray(draws).ravel().tolist()) == {0, 1}
    assert int(sampling.sample(logits, keys[0], sampling.greedy())[0]) == 0
    with pytest.raises(ValueError, match="top_p"):
        sampling.top_p(0.0)


@pytest.mark.slow
def test_sampled_generate_draws_and_logprobs_match_the_forward():
    """generate's loop against the PT forward: each token is row b's draw with its seed
    (row_seeds) at its step from the oracle-filtered forward logits, with that log-prob."""
    cfg, params = arm_model("orthros")
    forward = jax.jit(lambda p, t: OrthrosLM(cfg).apply({"params": p}, t))
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (9, 3)]
    t, k, p = 0.8, 6, 0.9
    key, n = jax.random.PRNGKey(2), 5
    out = generate(
        params, prompts, cfg, max_new_tokens=n, sampler=sampling.Sampler(t, k, p), rng=key
    )
    again = generate(
        params, prompts, cfg, max_new_tokens=n, sampler=sampling.Sampler(t, k, p), rng=key
    )
    np.testing.assert_array_equal(again.tokens, out.tokens)  # seeded: reproducible
    np.testing.assert_array_equal(out.lengths, n)
    seeds = np.asarray(sampling.row_seeds(key, len(prompts)))
    seqs = np.zeros((len(prompts), max(map(len, prompts)) + n), np.int32)  # right-padded
    for b, prompt in enumerate(prompts):
        seqs[b, : len(prompt) + n] = prompt + out.tokens[b].tolist()
    logits = np.asarray(forward(params, jnp.asarray(seqs)))  # causal: padding changes nothing
    for b, prompt in enumerate(prompts):
        for i in range(n):
            want = _oracle_filter(logits[b, len(prompt) + i - 1], t, k, p)
            tok = int(out.tokens[b, i])
            draw_key = jax.random.fold_in(jax.random.PRNGKey(int(seeds[b])), i)
            draw = jax.random.categorical(draw_key, jnp.asarray(want, jnp.float32), axis=-1)
            assert tok == int(draw), (b, i)
            np.testing.assert_allclose(
                out.logprobs[b, i], _log_softmax(want)[tok], rtol=1e-4, atol=1e-4
            )
    assert (out.logprobs < 0).any()
