"""Sharding: the rules table, and a data=2 x fsdp=2 x tensor=2 train step on 8 simulated CPU
devices that equals the single-device step (the 8-device part runs in a subprocess so this
pytest process keeps its normal device count)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

from orthros_jax.inference.cache import cache_shardings
from orthros_jax.parallel import mesh as pmesh
from orthros_jax.parallel import sharding
from orthros_jax.training import MeshConfig

P = PartitionSpec


def _mesh(data: int, fsdp: int, tensor: int) -> AbstractMesh:
    return AbstractMesh((data, fsdp, tensor, 1), pmesh.MESH_AXES)


def test_rules_map_logical_axes():
    m = _mesh(2, 2, 2)
    assert pmesh.shard_spec(("layers", "embed", "heads", "head_dim"), (2, 32, 4, 8), m) == P(
        None, "fsdp", "tensor"
    )
    assert pmesh.shard_spec(("vocab", "embed"), (256, 32), m) == P("tensor", "fsdp")
    assert pmesh.shard_spec(("batch", "length"), (8, 64), m) == P(("data", "fsdp"))


def test_indivisible_dims_stay_replicated():
    m = _mesh(1, 2, 4)
    # 2 kv heads cannot split 4 ways: replicated; embed 33 is not divisible by fsdp=2 either.
    assert pmesh.shard_spec(("embed", "kv_heads", "head_dim"), (33, 2, 8), m) == P()
    assert pmesh.shard_spec(("embed", "mlp"), (32, 64), _mesh(1, 1, 1)) == P()


def test_cache_is_split_over_batch_and_kv_heads():
    from training_helpers import tiny_model

    mesh = pmesh.make_mesh(MeshConfig(1, 1, 1))
    sh = cache_shardings(tiny_model(), 4, 64, mesh)
    assert sh.states["attention"][0].spec == P() and sh.lengths.spec == P()  # one device
    from orthros_jax.layers import attention as attention_layer

    axes = attention_layer.state_axes(tiny_model())[0]
    assert pmesh.shard_spec(axes, (2, 4, 2, 64, 8), _mesh(2, 1, 2)) == P(None, "data", "tensor")


def test_mesh_shape_fills_and_validates():
    assert pmesh.mesh_shape(MeshConfig(data=-1, fsdp=2, tensor=2), 8) == (2, 2, 2, 1)
    assert pmesh.mesh_shape(MeshConfig(data=2, expert=-1), 8) == (2, 1, 1, 4)
    with pytest.raises(ValueError, match="at most one -1"):
        pmesh.mesh_shape(MeshConfig(data=-1, fsdp=-1, tensor=1), 8)
    with pytest.raises(ValueError, match="devices"):
        pmesh.mesh_shape(MeshConfig(data=3, fsdp=1, tensor=1), 8)


def _worker(out: str) -> None:
    """Runs in a subprocess with 8 CPU devices: 2 steps on one device and on a 2x2x2 mesh."""
    import jax.numpy as jnp
    from training_helpers import pt_batch, tiny_model

    from orthros_jax.model import param_logical_axes
    from orthros_jax.training import (
        OptimizerConfig,
        init_train_state,
        make_optimizer,
        make_train_step,
    )

    assert jax.device_count() == 8
    # One layer, two steps (the second starts from sharded Adam moments): each layer and step
    # adds to the 8-device compile and run, and the rules do not depend on the layer count.
    cfg, opt = tiny_model(n_layers=1), OptimizerConfig(lr=1e-3, warmup_steps=0)
    tx = make_optimizer(opt, 2, cfg)
    step = make_train_step(cfg, opt, tx, 2)
    batches = [pt_batch(i) for i in range(2)]
    results = {}
    for name, shape, devices in (("single", (1, 1, 1), 1), ("sharded", (2, 2, 2), 8)):
        mesh = pmesh.make_mesh(MeshConfig(*shape), jax.devices()[:devices])
        rng = jax.random.PRNGKey(0)
        abstract = jax.eval_shape(lambda r: init_train_state(cfg, tx, r), rng)
        p_sh = sharding.param_shardings(cfg, mesh)
        s_sh = sharding.state_shardings(abstract, p_sh, tx, mesh)
        state = jax.jit(lambda r: init_train_state(cfg, tx, r), out_shardings=s_sh)(rng)
        fn = sharding.jit_train_step(step, s_sh, mesh, {k: 2 for k in batches[0]})
        losses = []
        for b in batches:
            state, metrics = fn(state, pmesh.shard_batch(b, mesh))
            losses.append(float(metrics["loss"]))
        flat = jax.tree_util.tree_flatten_with_path(state.params)[0]
        results[name] = {
            "losses": losses,
            "params": {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat},
            "specs": {jax.tree_util.keystr(k): str(v.sharding.spec) for k, v in flat},
            "mu_spec": str(state.opt_state[1][0].mu["layers"]["wq"].sharding.spec),
        }
    logical = param_logical_axes(cfg)
    m = pmesh.make_mesh(MeshConfig(2, 2, 2))
    expected = jax.tree.map(
        lambda ax, p: str(pmesh.shard_spec(tuple(ax), p.shape, m)),
        logical,
        jax.eval_shape(lambda: init_train_state(cfg, tx, jax.random.PRNGKey(0)).params),
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )
    expected = {
        jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(expected)[0]
    }
    np.savez(
        os.path.join(out, "params.npz"),
        **{f"{n}:{k}": v for n, r in results.items() for k, v in r["params"].items()},
    )
    meta = {n: {k: r[k] for k in ("losses", "specs", "mu_spec")} for n, r in results.items()}
    meta["expected_specs"] = expected
    meta["dtype_ok"] = bool(jnp.zeros(1).dtype == jnp.float32)
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f)


@pytest.mark.slow
def test_sharded_step_matches_single_device(tmp_path):
    from training_helpers import subprocess_env

    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path)],
        env=subprocess_env(8),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    meta = json.loads((tmp_path / "meta.json").read_text())
    params = np.load(tmp_path / "params.npz")
    single, sharded = meta["single"], meta["sharded"]
    np.testing.assert_allclose(sharded["losses"], single["losses"], atol=1e-5, rtol=0)
    for key in single["specs"]:
        np.testing.assert_allclose(
            params[f"sharded:{key}"], params[f"single:{key}"], atol=1e-5, rtol=0, err_msg=key
        )
    # Params really are laid out as the rules say (and not all replicated).
    assert sharded["specs"] == meta["expected_specs"]
    assert sharded["specs"]["['layers']['wq']"] == str(P(None, "fsdp", "tensor"))
    assert sharded["specs"]["['embedding']"] == str(P("tensor", "fsdp"))
    assert sharded["specs"]["['layers']['w_down']"] == str(P(None, "tensor", "fsdp"))
    assert sharded["mu_spec"] == str(P(None, "fsdp", "tensor"))  # Adam moments follow params


if __name__ == "__main__":
    _worker(sys.argv[1])
