"""Self-speculative decoding (orthros_jax/inference/speculative.py): greedy speculation emits
plain greedy decode's tokens on ragged rows with stop ids and a cache that fills, for Orthros
(exact-K/V drafts) and the Transformer (MagicDec-style rewrite), with drafts both accepted and
rejected; sampled speculation draws from the model's own distribution (a chi-square test on a
tiny vocabulary against float64 probabilities from the PT forward); bad input is refused
before any compile."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from helpers import our_logits, randomize_so, tiny_config
from scipy import stats

from orthros_jax.inference import Speculative, generate
from orthros_jax.inference.sampling import Sampler
from orthros_jax.model import init_params

PROMPTS = [
    list(np.random.RandomState(i).randint(0, 64, size=n))
    for i, n in enumerate([3, 17, 30, 9, 25, 1, 12, 28])
]


def _model(arch: str, vocab: int, head: float = 1.0, attn: float = 1.0):
    """A random tiny model; head / attn scale the LM head / W_V and W_O (sharper logits, more
    context in them: a draft over a short window then differs from the model)."""
    cfg = tiny_config(architecture=arch, vocab_size=vocab)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))
    if cfg.two_streams:  # the output stream differs from the base one, so drafts get rejected
        params = randomize_so(params, 3, 0.5)
    layers = params["layers"]
    layers = {**layers, "wv": layers["wv"] * attn, "wo": layers["wo"] * attn}
    return cfg, {**params, "lm_head": params["lm_head"] * head, "layers": layers}


@pytest.fixture(
    scope="module", params=["orthros", pytest.param("transformer", marks=pytest.mark.slow)]
)
def arm(request):
    return _model(request.param, 64)


def test_greedy_speculation_is_plain_greedy_token_for_token(arm):
    cfg, params = arm
    # cache 40: the longest prompts fill it before max_new_tokens (hit_capacity); stop id 5.
    kw = dict(max_new_tokens=24, stop_tokens=[5], cache_size=40)
    plain = generate(params, PROMPTS, cfg, **kw)
    spec = generate(params, PROMPTS, cfg, speculative=Speculative(3, 4), **kw)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.lengths, plain.lengths)
    np.testing.assert_array_equal(spec.hit_capacity, plain.hit_capacity)
    assert plain.hit_capacity.any() and not plain.hit_capacity.all()
    assert (plain.tokens == 5).any(), "no row stopped on its stop id"
    s = spec.speculation
    assert s.accepted.sum() > 0, "no draft was ever accepted"
    assert (s.drafted - s.accepted).sum() > 0, "no draft was ever rejected"
    # every emitted token after the first comes from a round: accepted drafts + one per round,
    # except where a stop id or the budget cut a round short
    assert ((s.accepted + s.rounds) >= spec.lengths - 1).all()


# 2000 draws of 3 tokens at 70% acceptance: p 0.1-0.6 here; sampling from p instead of the
# residual after a rejection (the correction step removed) gives p = 7e-16 at step 1.
V, SAMPLES, STEPS = 8, 2000, 3


@pytest.fixture(scope="module")
def sampled():
    cfg, params = _model("orthros", V, head=10.0, attn=5.0)
    prompt = [3, 1, 4, 1, 5]
    out = generate(
        params,
        [prompt] * SAMPLES,
        cfg,
        max_new_tokens=STEPS,
        sampler=Sampler(temperature=1.0),
        rng=jax.random.PRNGKey(7),
        speculative=Speculative(2, 1),
    )
    # The exact joint of the first STEPS tokens, float64, from the PT forward's logits.
    seqs = np.array([prompt + list(c) for c in itertools.product(range(V), repeat=STEPS - 1)])
    logits = our_logits(cfg, params, seqs).astype(np.float64)[:, len(prompt) - 1 :]
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    return out, seqs[:, len(prompt) :], np.exp(logp)


@pytest.mark.slow
def test_sampled_speculation_draws_from_the_models_distribution(sampled):
    out, prefixes, probs = sampled
    s = out.speculation
    assert 0 < s.accepted.sum() < s.drafted.sum(), "the test needs accepted and rejected drafts"
    tokens = out.tokens
    assert (out.lengths == STEPS).all()
    # marginal of each step's token under the model: sum over the prefixes before it
    for step in range(1, STEPS):
        joint = np.ones(len(prefixes))
        for j in range(step):
            joint *= probs[np.arange(len(prefixes)), j, prefixes[:, j]]
        _, first = np.unique(prefixes[:, :step], axis=0, return_index=True)
        expected = (joint[first, None] * probs[first, step]).sum(0)
        np.testing.assert_allclose(expected.sum(), 1.0, atol=1e-9, rtol=0)
        seen = np.bincount(tokens[:, step], minlength=V)
        p = stats.chisquare(seen, expected * SAMPLES).pvalue
        assert p > 0.01, (step, p, seen, np.round(expected * SAMPLES))


@pytest.mark.parametrize(
    "spec, model, match",
    [
        (lambda: Speculative(0, 4), {}, "Speculative.k"),
        (lambda: Speculative(2, 0), {}, "Speculative.draft_window"),
        (lambda: Speculative(2, 129), {}, "draft_window=129 exceeds"),
        (lambda: Speculative(2, 8), dict(architecture="orthros_h", n_layers=4), "recurrent state"),
        (lambda: (2, 8), {}, "must be a Speculative"),
    ],
)
def test_bad_speculation_is_refused_before_any_compile(spec, model, match):
    cfg = tiny_config(**model)
    with pytest.raises(ValueError, match=match):
        generate({}, [[1, 2]], cfg, max_new_tokens=4, speculative=spec())
