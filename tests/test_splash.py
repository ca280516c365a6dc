"""attention_impl="splash" (jax's Pallas splash kernels, interpret mode on CPU) against "xla":
the model's logits and gradients in fp32 for PT with packed documents on every attention arm,
SFT's output copies, and chunked prefill + decode. The AOT compile for a TPU topology is in
test_compile.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import randomize_so, tiny_config

from orthros_jax import inference as inf
from orthros_jax.kernels.reference import reference_attention
from orthros_jax.layers.attend import Keys
from orthros_jax.layers.attention_impls import attend
from orthros_jax.layers.splash import use_interpret
from orthros_jax.model import OrthrosLM, init_params

T = 128  # one kernel tile: interpret mode runs every grid step in Python
B = 2
TOL = 1e-5
# The kernel's three masks: causal (transformer), windowed (swa) and both with output copies
# (orthros). A recurrent layer beside attention never calls the kernel: the hybrid arms' own
# paths are the conformance suite's (tests/test_kind_conformance.py).
ARMS = {"orthros": {}, "transformer": {}, "swa": {}}


def _cfg(arch: str, **changes):
    # One layer: the kernel's forward and backward against XLA's are per layer, and interpret
    # mode runs each kernel call's grid in Python, so a second layer doubles the cost only.
    base = dict(n_layers=1, vocab_size=64, d_model=64, head_dim=16, window=16, d_ff=128)
    return tiny_config(architecture=arch, **base | ARMS[arch] | changes)


def _params(cfg):
    params = init_params(cfg, jax.random.PRNGKey(0))
    return randomize_so(params, 1, 0.3) if cfg.scale_offset else params


def _packed_batch():
    """Row 0 one document; row 1 three (the last one packer padding, segment 0); positions
    restart per document."""
    rng = np.random.default_rng(0)
    seg = np.ones((B, T), np.int32)
    seg[1, 40:] = 2
    seg[1, 100:] = 0
    pos = np.zeros((B, T), np.int32)
    for b in range(B):
        starts = np.r_[0, np.flatnonzero(np.diff(seg[b])) + 1]
        for s, e in zip(starts, np.r_[starts[1:], T], strict=True):
            pos[b, s:e] = np.arange(e - s)
    tokens = rng.integers(0, 64, (B, T)).astype(np.int32)
    return jnp.asarray(tokens), jnp.asarray(pos), jnp.asarray(seg)


def _loss_and_grad(cfg, params, tokens, pos, seg, out_pos, weight):
    model = OrthrosLM(cfg)

    def loss(p):
        logits = model.apply(
            {"params": p}, tokens, positions=pos, segment_ids=seg, output_positions=out_pos
        )
        # A fixed random projection of the logits (not just their sum: it has a flat gradient).
        proj = jax.random.normal(jax.random.PRNGKey(7), logits.shape[-1:])
        return jnp.sum((logits @ proj) * weight) / jnp.sum(weight), logits

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


def _assert_same(arch, out_pos=None, weight_of=None):
    cfg = _cfg(arch)
    params = _params(cfg)
    tokens, pos, seg = _packed_batch()
    live = np.asarray(seg > 0) if out_pos is None else weight_of
    weight = jnp.asarray(live, jnp.float32)
    (_, want), g_want = _loss_and_grad(cfg, params, tokens, pos, seg, out_pos, weight)
    (_, got), g_got = _loss_and_grad(
        cfg.replace(attention_impl="splash"), params, tokens, pos, seg, out_pos, weight
    )
    # The packer's padding (segment 0) carries no loss; its rows may differ (index vs position).
    np.testing.assert_allclose(np.asarray(got)[live], np.asarray(want)[live], atol=TOL, rtol=0)
    for name, a, b in zip(
        jax.tree_util.tree_leaves_with_path(g_got),
        jax.tree.leaves(g_got),
        jax.tree.leaves(g_want),
        strict=True,
    ):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), atol=TOL, rtol=0, err_msg=str(name[0])
        )


def test_cpu_runs_the_interpreter():
    assert use_interpret()


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(ARMS))
def test_packed_pt_logits_and_grads_match_xla(arch):
    _assert_same(arch)


@pytest.mark.slow
def test_sft_output_copies_match_xla():
    # Copies at arbitrary indices, several of one token, and the padding's repeated index 0.
    t_out = 24
    rng = np.random.default_rng(3)
    idx = np.zeros((B, t_out), np.int32)
    idx[0, :20] = np.sort(rng.choice(T, 20, replace=False))
    idx[1, :18] = np.r_[np.arange(30, 39), np.full(4, 60), np.arange(95, 100)]
    weight = np.zeros((B, t_out), bool)
    weight[0, :20], weight[1, :18] = True, True
    _assert_same("orthros", jnp.asarray(idx), weight)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["orthros", "transformer", "swa"])
def test_chunked_prefill_and_decode_match_xla(arch):
    # Chunks of 32 > FEW_QUERIES go to the kernel with their W-1 previous keys (mask offset);
    # the Transformer arm's global chunk reads the cache (xla); decode is the few-query path.
    # Two layers: prefill's last layer reads only each row's last token (the few-query path),
    # so with one layer no chunk would reach the kernel.
    cfg = _cfg(arch, prefill_chunk=32, n_layers=2)
    params = _params(cfg)
    rng = np.random.default_rng(5)
    prompts = rng.integers(0, 64, (B, 96)).astype(np.int32)
    lengths = np.array([96, 70], np.int32)
    results = {}
    for impl in ("xla", "splash"):
        c = cfg.replace(attention_impl=impl)
        cache = inf.init_cache(c, B, 128)
        logits, cache = inf.prefill(params, cache, prompts, lengths, c)
        steps = [np.asarray(logits)]
        for tok in (3, 11):
            logits, cache = inf.decode_step(params, cache, np.full(B, tok, np.int32), c)
            steps.append(np.asarray(logits))
        results[impl] = np.stack(steps)
    np.testing.assert_allclose(results["splash"], results["xla"], atol=TOL, rtol=0)


@pytest.mark.slow
def test_output_copies_run_in_the_kernel_and_match_reference():
    # The seam alone: copies (one token three times) attend causally at their tokens' places.
    q_all = jax.random.normal(jax.random.PRNGKey(1), (1, T, 4, 16))
    k, v = (jax.random.normal(jax.random.PRNGKey(s), (1, T, 2, 16)) for s in (2, 3))
    pos = jnp.arange(T, dtype=jnp.int32)[None]
    seg = jnp.ones((1, T), jnp.int32)
    idx = jnp.asarray([[5, 17, 17, 17, 64, 100, 127, 0, 0, 33]], jnp.int32)
    q = jnp.take_along_axis(q_all, idx[:, :, None, None], axis=1)
    q_pos = jnp.take_along_axis(pos, idx, axis=1)
    keys = Keys(k, v, pos, seg, q_index=idx)
    run = lambda q: attend("splash", q, q_pos, jnp.ones_like(q_pos), keys, None, _cfg("orthros"))
    assert "pallas_call" in str(jax.make_jaxpr(run)(q))
    want = reference_attention(
        q,
        k,
        v,
        q_positions=q_pos,
        k_positions=pos,
        q_segment_ids=jnp.ones_like(q_pos),
        k_segment_ids=seg,
    )
    np.testing.assert_allclose(np.asarray(run(q)), np.asarray(want), atol=TOL, rtol=0)


_MESH_CHILD = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, "tests")
from helpers import tiny_config
from orthros_jax import inference as inf
from orthros_jax.parallel import mesh as pmesh
from orthros_jax.parallel import sharding
from orthros_jax.model import OrthrosLM, init_params
from orthros_jax.training import MeshConfig

cfg = tiny_config(
    n_layers=1, vocab_size=64, d_model=64, head_dim=16, window=16, d_ff=128, prefill_chunk=16
)
params = init_params(cfg, jax.random.PRNGKey(0))
rng = np.random.default_rng(0)
out = {}
# Sequence-parallel prefill + decode: each shard's chunks of 16 go to the kernel with their
# 15-key halo as prefix, inside the driver's shard_map.
prompts, lengths = rng.integers(0, 64, (2, 80)).astype(np.int32), np.array([80, 45])
for impl, mesh in (("xla", None), ("splash", pmesh.sequence_mesh(4))):
    c = cfg.replace(attention_impl=impl)
    cache = inf.init_cache(c, 2, 128, mesh=mesh)
    logits, cache = inf.prefill(params, cache, prompts, lengths, c)
    step, cache = inf.decode_step(params, cache, np.array([3, 5], np.int32), c)
    out["sp_" + impl] = np.stack([np.asarray(logits), np.asarray(step)]).tolist()
# A PT loss and its gradient on a data=2 x fsdp=2 mesh: the kernel in shard_map over rows.
tokens = jnp.asarray(rng.integers(0, 64, (4, 128)).astype(np.int32))
mesh = pmesh.make_mesh(MeshConfig(data=2, fsdp=2, tensor=1))
for impl in ("xla", "splash"):
    model = OrthrosLM(cfg.replace(attention_impl=impl))
    loss = lambda p: jnp.mean(model.apply({"params": p}, tokens) ** 2)
    fn = jax.jit(sharding.traced_under(jax.value_and_grad(loss), mesh))
    value, grad = fn(pmesh.put_tree(params, sharding.param_shardings(cfg, mesh)))
    out["pt_" + impl] = [float(value)] + [float(jnp.abs(g).sum()) for g in jax.tree.leaves(grad)]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_kernel_under_a_mesh_matches_xla():
    # 4 simulated CPU devices in a child process (the device count is fixed at jax's start).
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from training_helpers import subprocess_env

    env = subprocess_env(4)
    res = subprocess.run(
        [sys.executable, "-c", _MESH_CHILD],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    out = json.loads(res.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(out["sp_splash"], out["sp_xla"], atol=TOL, rtol=0)
    np.testing.assert_allclose(out["pt_splash"], out["pt_xla"], rtol=1e-5, atol=0)
