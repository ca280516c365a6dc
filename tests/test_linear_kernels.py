"""The gated linear-attention kernel (orthros_jax/kernels/linear_attention.py): chunked form and
recurrent step vs the float64 recurrence (oracle_linear.py) for a per-key-dim (GLA) and a
per-head (RetNet) decay, any chunk, any split into calls, resets, strong decays; and parity
with flash-linear-attention's own naive torch references, loaded by file path."""

from __future__ import annotations

import functools
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oracle_linear import recurrence

from orthros_jax.kernels.linear_attention import (
    chunked_linear_attention,
    linear_attention_step,
    linear_attention_step_stacked,
)

B, L, N, H, E = 2, 29, 3, 8, 6
TOL = {"atol": 1e-5, "rtol": 1e-5}


@functools.partial(jax.jit, static_argnames=("scale", "chunk", "sub_chunk"))
def chunked(qs, k, v, g, reset, s, *, scale, chunk, sub_chunk=16):
    return chunked_linear_attention(
        qs, k, v, g, reset, s, scale=scale, chunk=chunk, sub_chunk=sub_chunk
    )


def inputs(per_key: bool, seed: int = 0, decay: float = 1.0):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, B, L, N, H)).astype(np.float32)
    v = rng.normal(size=(B, L, N, E)).astype(np.float32)
    shape = (B, L, N, H) if per_key else (B, L, N)
    g = (-decay * rng.exponential(0.3, shape)).astype(np.float32)
    s0 = rng.normal(size=(B, N, H, E)).astype(np.float32)
    return q, k, v, g, s0


def oracle(q, k, v, g, reset, s0, scale):
    outs = [recurrence(q[b], k[b], v[b], g[b], reset[b], s0[b], scale) for b in range(B)]
    return np.stack([o for o, _ in outs]), np.stack([s for _, s in outs])


@pytest.mark.parametrize("per_key", [True, False], ids=["per_key", "per_head"])
@pytest.mark.parametrize("chunk,sub", [(1, 16), (5, 16), (8, 4), (64, 16)])
def test_chunked_matches_recurrence(per_key, chunk, sub):
    q, k, v, g, s0 = inputs(per_key)
    reset = np.zeros((B, L), bool)
    reset[0, 11] = reset[1, 3] = reset[1, 4] = True
    (o,), s = chunked((q,), k, v, g, reset, s0, scale=H**-0.5, chunk=chunk, sub_chunk=sub)
    want_o, want_s = oracle(q, k, v, g, reset, s0, H**-0.5)
    np.testing.assert_allclose(np.asarray(o), want_o, **TOL)
    np.testing.assert_allclose(np.asarray(s), want_s, **TOL)


@pytest.mark.parametrize("per_key", [True, False], ids=["per_key", "per_head"])
def test_strong_decay_is_finite_and_exact(per_key):
    """Cumulative decays of -1000 over a chunk: a factorisation exp(G_i) exp(-G_j) would
    overflow; the kernel never forms a factor above 1."""
    q, k, v, g, s0 = inputs(per_key, seed=1, decay=100.0)
    g[:, 7] = 0.0  # a token that does not decay the state, amid strong decay
    reset = np.zeros((B, L), bool)
    (o,), s = chunked((q,), k, v, g, reset, s0, scale=0.5, chunk=32, sub_chunk=8)
    want_o, want_s = oracle(q, k, v, g, reset, s0, 0.5)
    assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(s)).all()
    np.testing.assert_allclose(np.asarray(o), want_o, **TOL)
    np.testing.assert_allclose(np.asarray(s), want_s, **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("per_key", [True, False], ids=["per_key", "per_head"])
def test_split_calls_and_steps_equal_one_call(per_key):
    """Prefill in uneven calls (state carried in fp32), then token-by-token decode steps with
    one row inactive: the same outputs and states as one call over the whole row."""
    q, k, v, g, s0 = inputs(per_key, seed=2)
    reset = np.zeros((B, L), bool)
    qx = q[..., ::-1].copy()  # a second query stream (Orthros' output copies) reads the same S
    (o_all, ox_all), s_all = chunked((q, qx), k, v, g, reset, s0, scale=0.3, chunk=8)
    s, got, got_x = jnp.asarray(s0), [], []
    for lo, hi in ((0, 7), (7, 20), (20, 24)):
        sl = slice(lo, hi)
        (o, ox), s = chunked(
            (q[:, sl], qx[:, sl]), k[:, sl], v[:, sl], g[:, sl], reset[:, sl], s, scale=0.3, chunk=8
        )
        got.append(o)
        got_x.append(ox)
    step = jax.jit(functools.partial(linear_attention_step, scale=0.3))
    active = jnp.asarray([True, True])
    for t in range(24, L):
        (o, ox), s = step((q[:, t], qx[:, t]), k[:, t], v[:, t], g[:, t], active, s)
        got.append(o[:, None])
        got_x.append(ox[:, None])
    np.testing.assert_allclose(np.concatenate(got, 1), np.asarray(o_all), **TOL)
    np.testing.assert_allclose(np.concatenate(got_x, 1), np.asarray(ox_all), **TOL)
    np.testing.assert_allclose(np.asarray(s), np.asarray(s_all), **TOL)
    # an inactive row keeps its state exactly
    _, s2 = step((q[:, 0],), k[:, 0], v[:, 0], g[:, 0], jnp.asarray([False, True]), s)
    np.testing.assert_array_equal(np.asarray(s2)[0], np.asarray(s)[0])
    assert not np.allclose(np.asarray(s2)[1], np.asarray(s)[1])


def test_bad_shapes_are_refused():
    q, k, v, g, s0 = inputs(True)
    reset = np.zeros((B, L), bool)
    with pytest.raises(ValueError, match="g must be"):
        chunked_linear_attention((q,), k, v, g[..., :3], reset, s0, scale=1.0)
    with pytest.raises(ValueError, match="sub_chunk"):
        chunked_linear_attention((q,), k, v, g, reset, s0, scale=1.0, chunk=12, sub_chunk=8)


# ------------------------------------------------------------------ fla's own references

torch = pytest.importorskip("torch")
_FLA = importlib.util.find_spec("fla")


def fla_naive(name: str):
    """fla/ops/<name>/naive.py as a module, loaded by file path (no fla import: its package
    needs Triton kernels that do not run on a CPU)."""
    if _FLA is None or not _FLA.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed (the `convert` extra)")
    path = pathlib.Path(_FLA.submodule_search_locations[0]) / "ops" / name / "naive.py"
    spec = importlib.util.spec_from_file_location(f"fla_naive_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def t(x):
    return torch.from_numpy(np.asarray(x, np.float32))


def test_fla_naive_recurrent_gla():
    """Per-key-dim decay with an initial state: fla's naive_recurrent_gla ([B, T, N, H])."""
    q, k, v, g, s0 = inputs(True, seed=3)
    o_ref, s_ref = fla_naive("gla").naive_recurrent_gla(
        t(q), t(k), t(v), t(g), initial_state=t(s0), output_final_state=True
    )
    (o,), s = chunked((q,), k, v, g, np.zeros((B, L), bool), s0, scale=H**-0.5, chunk=16)
    np.testing.assert_allclose(np.asarray(o), o_ref.numpy(), **TOL)
    np.testing.assert_allclose(np.asarray(s), s_ref.numpy(), **TOL)


def test_fla_naive_simple_gla_chunk_and_recurrent():
    """Per-head decay: fla's naive chunked and recurrent simple GLA (both with a state)."""
    q, k, v, g, s0 = inputs(False, seed=4)
    naive = fla_naive("simple_gla")
    o_rec, s_rec = naive.naive_recurrent_simple_gla(
        t(q), t(k), t(v), t(g), initial_state=t(s0), output_final_state=True
    )
    o_chk, s_chk = naive.naive_chunk_simple_gla(
        t(q), t(k), t(v), t(g), initial_state=t(s0), output_final_state=True, chunk_size=16
    )
    (o,), s = chunked((q,), k, v, g, np.zeros((B, L), bool), s0, scale=H**-0.5, chunk=8)
    for o_ref, s_ref in ((o_rec, s_rec), (o_chk, s_chk)):
        np.testing.assert_allclose(np.asarray(o), o_ref.numpy(), **TOL)
        np.testing.assert_allclose(np.asarray(s), s_ref.numpy(), **TOL)


def test_fla_naive_retention():
    """RetNet's fixed decays gamma_n = 1 - 2^(-5-n): fla's naive_retention ([B, N, T, H],
    parallel form, no state)."""
    q, k, v, _, _ = inputs(False, seed=5)
    gamma = 1.0 - 2.0 ** (-5.0 - np.arange(N))
    g = np.broadcast_to(np.log(gamma), (B, L, N)).astype(np.float32)
    heads_first = lambda x: t(x).transpose(1, 2)
    o_ref = fla_naive("retention").naive_retention(heads_first(q), heads_first(k), heads_first(v))
    zero = np.zeros((B, N, H, E), np.float32)
    (o,), _ = chunked((q,), k, v, g, np.zeros((B, L), bool), zero, scale=H**-0.5, chunk=16)
    np.testing.assert_allclose(np.asarray(o), o_ref.transpose(1, 2).numpy(), **TOL)


def stacked_state_copies(hlo: str, shape: tuple[int, ...]) -> list[str]:
    """The HLO instructions that copy a whole f32 array of `shape` (the stacked state)."""
    want = "f32[" + ",".join(map(str, shape)) + "]"
    return [ln.strip() for ln in hlo.splitlines() if want in ln and " copy(" in ln]


def _decode_loop(step, q, k, v, g, active, layers):
    """fori_loop over `layers` layers sharing one stacked state, each reading the running x."""

    def loop(stack):
        def body(i, carry):
            stack, x = carry
            (o,), stack = step((q + x[..., :1],), k, v, g, active, stack, i)
            return stack, x + o

        return jax.lax.fori_loop(0, layers, body, (stack, jnp.zeros(v.shape)))

    return loop


def _plain(qs, k, v, g, a, stack, i):
    s = jax.lax.dynamic_index_in_dim(stack, i, keepdims=False)
    outs, s = linear_attention_step(qs, k, v, g, a, s, scale=0.5)
    return outs, jax.lax.dynamic_update_index_in_dim(stack, s, i, 0)


_stacked = functools.partial(linear_attention_step_stacked, scale=0.5)


@pytest.mark.parametrize("per_key", [True, False], ids=["per_key", "per_head"])
def test_stacked_step_equals_the_step(per_key):
    """Decode through a loop of 6 layers sharing one stacked state: the stacked step's states
    and (active rows') outputs equal the plain step's."""
    q, k, v, g, s0 = inputs(per_key, seed=6)
    stack = jnp.stack([jnp.asarray(s0) * (i + 1) for i in range(6)])
    args = (q[:, 0], k[:, 0], v[:, 0], g[:, 0], jnp.asarray([True, False]), 6)
    want = jax.jit(_decode_loop(_plain, *args))(stack)
    got = jax.jit(_decode_loop(_stacked, *args))(stack)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), **TOL)
    np.testing.assert_allclose(np.asarray(got[1])[0], np.asarray(want[1])[0], **TOL)


@pytest.mark.optimized  # about the compiled program
@pytest.mark.parametrize("per_key", [True, False], ids=["per_key", "per_head"])
def test_stacked_step_copies_no_stack(per_key):
    """At the bench model's decode shape (6 layers, 8 heads of 64 x 64, batch 1) the compiled
    loop copies the stacked state nowhere; the plain step (a matmul on the old state before
    the write) makes XLA copy the whole stack in the loop."""
    shape = (6, 1, 8, 64, 64)
    z = jnp.zeros(shape[1:4])
    g = z if per_key else z[..., 0]
    args = (z, z, jnp.zeros(shape[1:3] + shape[4:]), g, jnp.ones((1,), bool), shape[0])
    stack = jax.ShapeDtypeStruct(shape, jnp.float32)

    def hlo(step):
        fn = jax.jit(_decode_loop(step, *args), donate_argnums=0)
        return fn.lower(stack).compile().as_text()

    assert stacked_state_copies(hlo(_stacked), shape) == []
    assert stacked_state_copies(hlo(_plain), shape)  # the check sees the copy it rules out
