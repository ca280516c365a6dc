"""GRPO pieces: advantages, the packed SFT-shaped batch, the objective against a float64
oracle, tasks and rewards, config errors, and the engine as the sampler."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orthros_jax.config import ModelConfig
from orthros_jax.data.tokenizers import ByteTokenizer
from orthros_jax.model import OrthrosLM, init_params
from orthros_jax.rl import batch as batch_lib
from orthros_jax.rl import tasks
from orthros_jax.rl.config import GRPOConfig, RLConfig, RolloutConfig, TaskConfig
from orthros_jax.rl.loss import grpo_loss, target_logprobs
from orthros_jax.rl.rollout import rollout
from orthros_jax.serving.engine import Engine

CFG = ModelConfig(
    vocab_size=256, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, window=8
)


def test_group_advantages_are_centred_and_scaled_per_group():
    r = np.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    np.testing.assert_allclose(
        batch_lib.group_advantages(r, scale=False), [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0]]
    )
    np.testing.assert_allclose(
        batch_lib.group_advantages(r, scale=True), [[1, -1, -1, 1], [0, 0, 0, 0]], atol=1e-5
    )


def test_pack_pairs_places_copies_on_the_completion_positions():
    a = batch_lib.Pair(np.array([5, 6, 7]), np.array([8, 9]), np.array([-0.1, -0.2]), 1.5)
    b = batch_lib.Pair(np.array([1, 2]), np.array([3]), np.array([-0.3]), -2.0)
    out = batch_lib.pack_pairs([a, b], rows=2, seq_len=8, out_len=4)
    # a: tokens 5 6 7 8 (its last token predicts nothing); b after it in the same row.
    np.testing.assert_array_equal(out["tokens"][0], [5, 6, 7, 8, 1, 2, 0, 0])
    np.testing.assert_array_equal(out["positions"][0], [0, 1, 2, 3, 0, 1, 0, 1])
    np.testing.assert_array_equal(out["segment_ids"][0], [1, 1, 1, 1, 2, 2, 0, 0])
    np.testing.assert_array_equal(out["output_positions"][0], [2, 3, 5, 0])
    np.testing.assert_array_equal(out["targets"][0], [8, 9, 3, 0])
    np.testing.assert_array_equal(out["loss_mask"][0], [1, 1, 1, 0])
    np.testing.assert_allclose(out["advantages"][0], [1.5, 1.5, -2.0, 0])
    np.testing.assert_allclose(out["old_logprobs"][0], [-0.1, -0.2, -0.3, 0])
    np.testing.assert_array_equal(out["sequence"][0], [0, 0, 1, 2])
    assert not out["segment_ids"][1].any()
    with pytest.raises(ValueError, match="grpo.rows"):
        batch_lib.pack_pairs([a, a, a], rows=1, seq_len=8, out_len=4)
    with pytest.raises(ValueError, match="grpo.seq_len=3"):
        batch_lib.pack_pairs([a], rows=1, seq_len=3, out_len=4)


def _oracle(logp, old, ref, adv, seq, mask, g: GRPOConfig) -> float:
    """float64 loops over the completions: the objective as written in rl/loss.py's docstring."""
    terms, per_seq = [], {}
    for s in sorted(set(seq[mask > 0].tolist())):
        idx = [
            (i, j)
            for i in range(seq.shape[0])
            for j in range(seq.shape[1])
            if seq[i, j] == s and mask[i, j] > 0
        ]
        d = np.array([logp[i] - old[i] for i in idx], np.float64)
        ratios = np.exp(d) if g.ratio.value == "token" else np.full(len(d), np.exp(d.mean()))
        ts = []
        for (i, j), r in zip(idx, ratios, strict=True):
            a = adv[i, j]
            t = -min(r * a, np.clip(r, 1 - g.clip_low, 1 + g.clip_high) * a)
            if ref is not None:
                k = ref[i, j] - logp[i, j]
                t += g.kl_coef * (np.exp(k) - k - 1)
            ts.append(t)
        terms += ts
        per_seq[s] = np.mean(ts)
    if g.loss_norm.value == "token":
        return float(np.mean(terms))
    return float(np.mean(list(per_seq.values())))


@pytest.mark.parametrize("norm", ["token", "sequence"])
@pytest.mark.parametrize("ratio", ["token", "sequence"])
@pytest.mark.parametrize("kl", [0.0, 0.1])
def test_grpo_loss_matches_a_float64_oracle(norm, ratio, kl):
    rng = np.random.default_rng(0)
    shape = (3, 5)
    logp = -rng.uniform(0.1, 3, shape)
    old = logp + rng.normal(0, 0.3, shape)  # ratios on both sides of the clip range
    ref = logp + rng.normal(0, 0.5, shape)
    seq = np.array([[0, 0, 1, 1, 7], [2, 2, 2, 3, 7], [4, 5, 5, 6, 6]])
    mask = (seq != 7).astype(np.float64)
    adv = rng.normal(0, 1, 7)[np.minimum(seq, 6)]
    g = GRPOConfig(clip_low=0.2, clip_high=0.28, kl_coef=kl, loss_norm=norm, ratio=ratio)
    batch = {
        "old_logprobs": jnp.asarray(old, jnp.float32),
        "advantages": jnp.asarray(adv, jnp.float32),
        "sequence": jnp.asarray(seq),
        "loss_mask": jnp.asarray(mask, jnp.float32),
    }
    ref_j = jnp.asarray(ref, jnp.float32) if kl else None
    loss, m = grpo_loss(jnp.asarray(logp, jnp.float32), ref_j, batch, g)
    want = _oracle(logp, old, ref if kl else None, adv, seq, mask, g)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    assert 0.0 < float(m["clip_fraction"]) < 1.0


def test_on_policy_gradient_is_the_policy_gradient():
    """With old = current log-probs (one update per rollout), the token loss's gradient with
    respect to each log-prob is -A / n: REINFORCE with the group baseline."""
    logp = jnp.asarray([[-1.0, -2.0, -0.5]])
    batch = {
        "old_logprobs": logp,
        "advantages": jnp.asarray([[0.7, 0.7, -1.2]]),
        "sequence": jnp.asarray([[0, 0, 1]]),
        "loss_mask": jnp.ones((1, 3)),
    }
    grad = jax.grad(lambda lp: grpo_loss(lp, None, batch, GRPOConfig())[0])(logp)
    np.testing.assert_allclose(grad, -batch["advantages"] / 3, rtol=1e-6)


def test_rewards_and_their_failures_name_the_example():
    assert tasks.integer_answer(" 95 and more", "95") == 1.0
    assert tasks.integer_answer("951", "95") == 0.0
    assert tasks.integer_answer("-7", "-7") == 1.0
    assert tasks.integer_answer("x95", "95") == 0.0
    assert tasks.exact_prefix("42. yes", "42") == 1.0
    with pytest.raises(tasks.RewardError, match="example 1 .*answer '2'"):
        tasks.score(lambda c, a: 1 / int(c), ["1", "0"], ["1", "2"])
    with pytest.raises(tasks.RewardError, match="returned nan on example 0"):
        tasks.score(lambda c, a: float("nan"), ["1"], ["1"])
    with pytest.raises(tasks.RewardError, match="returned 'yes'"):
        tasks.score(lambda c, a: "yes", ["1"], ["1"])


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_tasks_are_pure_functions_of_seed_stream_index(name):
    task = tasks.make_task(TaskConfig(name=name, context_len=96, pairs=3, gap=16), ByteTokenizer())
    a, b = task.prompt(0, tasks.TRAIN_STREAM, 3), task.prompt(0, tasks.TRAIN_STREAM, 3)
    np.testing.assert_array_equal(a.ids, b.ids)
    assert a.answer == b.answer and a.answer
    other = task.prompt(0, tasks.EVAL_STREAM, 3)
    assert not np.array_equal(a.ids, other.ids) or a.answer != other.answer
    assert task.reward(a.answer + "\n", a.answer) == 1.0


def test_invalid_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="group_size must be an int >= 2"):
        RolloutConfig(group_size=1)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        RolloutConfig(temperature=0.0)
    with pytest.raises(ValueError, match="grpo.loss_norm='mean' is unknown"):
        GRPOConfig(loss_norm="mean")
    with pytest.raises(ValueError, match="task.name='chess' is unknown"):
        tasks.make_task(TaskConfig(name="chess"), ByteTokenizer())
    with pytest.raises(ValueError, match="max_batch=4 must hold one group"):
        RLConfig(model=CFG, rollout=RolloutConfig(group_size=8, max_batch=4))
    with pytest.raises(ValueError, match="out_len=2 must be >= rollout.max_new_tokens=8"):
        RLConfig(model=CFG, grpo=GRPOConfig(out_len=2))


@pytest.mark.slow
def test_engine_rollouts_carry_the_policy_log_probs_and_repeat_exactly():
    """The engine's sampling log-probs are the update's old log-probs (no second pass): the
    trainer's forward on the packed batch gives the same numbers; the same seeds give the same
    completions; set_params changes the policy without a new compile."""
    task = tasks.make_task(TaskConfig(name="arithmetic", digits=2), ByteTokenizer())
    prompts = [task.prompt(0, tasks.TRAIN_STREAM, i) for i in range(3)]
    params = init_params(CFG, jax.random.PRNGKey(0))
    engine = Engine(params, CFG, max_batch=8, max_len=32)
    kw = dict(group_size=4, max_new_tokens=5, temperature=0.8, seed=0, step=0)
    ro = rollout(engine, prompts, **kw)
    again = rollout(engine, prompts, **kw)
    got = [s.tokens for g in ro.samples for s in g]
    assert got == [s.tokens for g in again.samples for s in g]
    assert len({tuple(t) for t in got}) > 1  # samples differ within a group
    # More requests (3 prompts x 4) than the engine's queue holds: submitted as slots free up,
    # the same completions (the seeds are per request), not a 429 "queue is full".
    engine.max_queue = 5
    waves = rollout(engine, prompts, **kw)
    assert [s.tokens for g in waves.samples for s in g] == got
    engine.max_queue = 64
    pairs = [
        batch_lib.Pair(prompts[i].ids, np.asarray(s.tokens), np.asarray(s.logprobs), 0.0)
        for i, g in enumerate(ro.samples)
        for s in g
    ]
    b = batch_lib.pack_pairs(pairs, rows=4, seq_len=64, out_len=16)
    lp = target_logprobs(OrthrosLM(CFG), params, b, temperature=0.8)
    np.testing.assert_allclose(
        np.asarray(lp) * b["loss_mask"], b["old_logprobs"], atol=2e-5, rtol=2e-5
    )
    from orthros_jax.serving import device

    compiles = device.compile_count()
    engine.set_params(jax.tree.map(lambda x: x * 1.5, params))
    changed = rollout(engine, prompts, **kw)
    assert device.compile_count() == compiles
    assert [s.tokens for g in changed.samples for s in g] != got
    with pytest.raises(ValueError, match="differ in structure, shape or dtype"):
        engine.set_params(init_params(CFG.replace(d_ff=32), jax.random.PRNGKey(0)))
