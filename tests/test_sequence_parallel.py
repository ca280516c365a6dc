"""Sequence-parallel attention kernels on 8 simulated CPU devices against the single-device
kernels. The 8-device part runs once, in a subprocess started with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before it imports jax), so this pytest
process keeps its own device count; the tests compare what it saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.hlo_stats import COLLECTIVE_KINDS, collective_bytes
from orthros_jax.kernels import collectives as sp
from orthros_jax.kernels.attention import KEY_PAD_SEGMENT, QUERY_PAD_SEGMENT

SHARDS, B, N, KV, H = 8, 2, 4, 2, 8
AXIS = "sequence"


def _inputs(t: int, seed: int = 0) -> dict[str, np.ndarray]:
    """q, k, v [B, T, ., H] and masks: row 0 packs three documents (positions restart), row 1
    is one document over its first 45/64 (45 tokens at T = 64), then padding."""
    rng = np.random.RandomState(seed)
    lens = [t * 5 // 16, t * 15 // 32]
    lens.append(t - sum(lens))
    seg0 = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lens)])
    pos0 = np.concatenate([np.arange(n) for n in lens])
    valid1 = np.arange(t) < t * 45 // 64
    return {
        "q": rng.randn(B, t, N, H).astype(np.float32),
        "k": rng.randn(B, t, KV, H).astype(np.float32),
        "v": rng.randn(B, t, KV, H).astype(np.float32),
        "pos": np.stack([pos0, np.arange(t)]).astype(np.int32),
        "q_seg": np.stack([seg0, np.where(valid1, 1, QUERY_PAD_SEGMENT)]).astype(np.int32),
        "k_seg": np.stack([seg0, np.where(valid1, 1, KEY_PAD_SEGMENT)]).astype(np.int32),
    }


def _worker(out_dir: str) -> None:
    """Runs with 8 CPU devices: the sharded kernels and their single-device references."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from orthros_jax.kernels.reference import reference_attention

    assert jax.device_count() == SHARDS, jax.devices()
    mesh = Mesh(np.array(jax.devices()), (AXIS,))
    seq, rep = P(None, AXIS), P()
    smap = lambda f, ins, out: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=ins, out_specs=out))
    res: dict[str, np.ndarray] = {}
    stats: dict[str, object] = {}
    x = _inputs(64)

    # Halo: 1 hop, 3 hops (19 rows > 8 per shard), and farther back than shard 0 (70 rows).
    for hl in (3, 19, 70):
        f = smap(lambda a, hl=hl: sp.halo(a, hl, AXIS, fill=-7.0), seq, seq)
        res[f"halo{hl}"] = np.asarray(f(x["k"])).reshape(B, SHARDS, hl, KV, H)
    res["halo_hm"] = np.asarray(
        smap(lambda a: sp.halo(a, 19, AXIS, axis=2), P(None, None, AXIS), P(None, None, AXIS))(
            x["k"].swapaxes(1, 2)
        )
    ).reshape(B, KV, SHARDS, 19, H)

    # Split-K: 3 replicated queries per row; keys (token- or head-major) sharded.
    qpos = np.array([[5, 5, 3], [44, 6, 44]], np.int32)
    qseg = np.array([[1, 3, 7], [1, 1, 1]], np.int32)  # row 0, query 3: segment 7 sees nothing
    q1 = np.random.RandomState(2).randn(B, 3, N, H).astype(np.float32)

    def split_k(q, k, v, qp, kp, qs, ks, head_major=False, window=None):
        part = sp.sharded_global_attention_partial(
            q, k, v, qp, kp, qs, ks, kv_head_major=head_major, window=window
        )
        return sp.merge_partials(*part, AXIS), part.sum

    # The window variant (a decode step's base stream): row 1's query at 44 reads keys 25..44,
    # which straddle shards 3, 4 and 5.
    for name, hm, win in (
        ("splitk", False, None),
        ("splitk_hm", True, None),
        ("splitk_w", True, 20),
    ):
        kv_spec = P(None, None, AXIS) if hm else seq
        k, v = (x["k"].swapaxes(1, 2), x["v"].swapaxes(1, 2)) if hm else (x["k"], x["v"])
        f = smap(
            lambda *a, hm=hm, win=win: split_k(*a, head_major=hm, window=win),
            (rep, kv_spec, kv_spec, rep, seq, rep, seq),
            (rep, P(AXIS)),
        )
        args = (q1, k, v, qpos, x["pos"], qseg, x["k_seg"])
        merged, sums = f(*args)
        res[name] = np.asarray(merged)
        res[name + "_sums"] = np.asarray(sums).reshape(SHARDS, B, 3, N)
        stats[name + "_bytes"] = collective_bytes(f.lower(*args).compile())
    for name, win in (("splitk_ref", None), ("splitk_w_ref", 20)):
        res[name] = np.asarray(
            reference_attention(
                q1,
                x["k"],
                x["v"],
                q_positions=qpos,
                k_positions=x["pos"],
                q_segment_ids=qseg,
                k_segment_ids=x["k_seg"],
                window=win,
            )
        )

    with open(os.path.join(out_dir, "stats.json"), "w") as fh:
        json.dump(stats, fh)
    np.savez(os.path.join(out_dir, "res.npz"), **res)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> tuple[dict[str, np.ndarray], dict]:
    from training_helpers import subprocess_env

    out = tmp_path_factory.mktemp("sequence_parallel")
    proc = subprocess.run(
        [sys.executable, __file__, str(out)],
        env=subprocess_env(SHARDS),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    stats = json.loads((out / "stats.json").read_text())
    return dict(np.load(out / "res.npz")), stats


def _expected_halo(x_BTKH: np.ndarray, hl: int, fill: float) -> np.ndarray:
    """[B, shards, hl, K, H]: the hl rows before each shard's first row, `fill` before row 0."""
    t = x_BTKH.shape[1]
    ls = t // SHARDS
    padded = np.concatenate([np.full((B, hl, *x_BTKH.shape[2:]), fill), x_BTKH], axis=1)
    return np.stack([padded[:, i * ls : i * ls + hl] for i in range(SHARDS)], axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("hl", [3, 19, 70])
def test_halo_is_the_slice_before_each_shard(sharded, hl):
    res, _ = sharded
    k = _inputs(64)["k"]
    np.testing.assert_allclose(res[f"halo{hl}"], _expected_halo(k, hl, -7.0), atol=0, rtol=0)


@pytest.mark.slow
def test_halo_of_a_head_major_cache_layer(sharded):
    res, _ = sharded
    want = _expected_halo(_inputs(64)["k"], 19, 0.0)  # [B, shards, 19, K, H]
    np.testing.assert_allclose(res["halo_hm"], want.transpose(0, 3, 1, 2, 4), atol=0, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["splitk", "splitk_hm", "splitk_w"])
def test_split_k_merge_matches_reference(sharded, name):
    res, _ = sharded
    got, ref = res[name], res[name.replace("_hm", "") + "_ref"]
    assert np.isfinite(got).all()
    # Row 0, query 3 is in a segment with no key: every shard contributes nothing -> 0.
    np.testing.assert_allclose(got[0, 2], 0.0, atol=0, rtol=0)
    np.testing.assert_allclose(got[0, :2], ref[0, :2], atol=1e-5, rtol=0)
    np.testing.assert_allclose(got[1], ref[1], atol=1e-5, rtol=0)
    # Row 0's first two queries see keys of one shard only (segment 1, position 5: rows 0..5 on
    # shard 0; segment 3 starts at row 50, position 5: rows 50..55 on shard 6): every other
    # shard's sum is exactly 0.
    sums = res[name + "_sums"]
    for query, shard in ((0, 0), (1, 6)):
        others = np.delete(sums[:, 0, query], shard, axis=0)
        np.testing.assert_allclose(others, 0.0, atol=0, rtol=0)
        assert (sums[shard, 0, query] > 0).all()
    if name == "splitk_w":  # row 1, query 0: the window 25..44 lies on shards 3, 4 and 5 only
        np.testing.assert_allclose(np.delete(sums[:, 1, 0], [3, 4, 5], axis=0), 0.0, atol=0)
        assert (sums[[3, 4, 5], 1, 0] > 0).all()


def test_split_k_collective_bytes_do_not_grow_with_keys(sharded):
    _, stats = sharded
    f32 = 4
    # One pmax of [B, Q, N] and one psum of [B, Q, N, H + 1], whatever the key count.
    for key in ("splitk_bytes", "splitk_hm_bytes", "splitk_w_bytes"):
        assert stats[key] == {**_zero(), "all-reduce": B * 3 * N * (H + 2) * f32}, key


def _zero() -> dict[str, int]:
    return dict.fromkeys(COLLECTIVE_KINDS, 0)


def test_collective_bytes_parses_async_and_tuple_results():
    text = "\n".join(
        [
            "HloModule m, num_partitions=8",
            "ENTRY %main (p: f32[4,8]) -> f32[32,8] {",
            "  %ags = (f32[4,8]{1,0}, f32[32,8]{1,0}) all-gather-start(f32[4,8]{1,0} %p)",
            "  %agd = f32[32,8]{1,0} all-gather-done((f32[4,8]{1,0}, f32[32,8]{1,0}) %ags)",
            "  %ar = (bf16[3]{0}, s32[2,2]{1,0}) all-reduce(bf16[3]{0} %a, s32[2,2]{1,0} %b)",
            "  %cp = pred[5]{0} collective-permute(pred[5]{0} %c), source_target_pairs={{0,1}}",
            "  ROOT %rs = f32[1,8]{1,0} reduce-scatter(f32[8,8]{1,0} %d), dimensions={0}",
            "}",
        ]
    )
    got = collective_bytes(text)
    want = {**_zero(), "all-gather": 32 * 8 * 4, "all-reduce": 3 * 2 + 4 * 4}
    want.update({"collective-permute": 5, "reduce-scatter": 8 * 4})
    assert got == want
    with pytest.raises(ValueError, match="not an XLA HLO module"):
        collective_bytes("module @jit_f { func.func public @main() }")


def test_bad_input_raises_value_error_naming_the_numbers():
    with pytest.raises(ValueError, match="100 is not divisible by the sequence axis size 8"):
        sp.check_sequence_split(100, 8, "cache length")
    assert sp.check_sequence_split(96, 8) == 12
    x = jnp.zeros((B, 8, KV, H))
    with pytest.raises(ValueError, match="halo_len must be an int >= 0, got -1"):
        sp.halo(x, -1, AXIS)
    pos = jnp.zeros((B, 8), jnp.int32)
    q = jnp.zeros((B, 1, N, H))
    with pytest.raises(ValueError, match=r"\[B, K, Ls, H\]"):
        sp.sharded_global_attention_partial(q, x, x, pos[:, :1], pos, kv_head_major=True)
    with pytest.raises(ValueError, match="merge_partials"):
        sp.merge_partials(jnp.zeros((B, 1, N, H)), jnp.zeros((B, 1, N)), jnp.zeros((B, 2)), AXIS)


if __name__ == "__main__":
    _worker(sys.argv[1])
