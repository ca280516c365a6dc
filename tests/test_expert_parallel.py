"""Expert parallelism (layers/expert_parallel.py): an Orthros-MoE train step, prefill and
decode on 8 simulated CPU devices with the experts split over the mesh's "expert" axis equal
the single-device ones (the 8-device part runs in a subprocess so this pytest process keeps
its normal device count); expert counts that do not divide the axis are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

from orthros_jax.parallel import mesh as pmesh
from orthros_jax.parallel import sharding

P = PartitionSpec
# One MoE layer: what expert parallelism splits (dense layers' sharding is tests/test_sharding.py);
# every extra layer adds to the 8-device compiles that dominate this test.
MOE = dict(n_experts=8, top_k=2, d_expert=32, shared_expert=16, ffn_cycle=("moe",))
# (name, mesh sizes data, fsdp, tensor, expert): rows over data x expert; fsdp x tensor x expert.
# dp4_tp2: no expert axis (every expert on every device, each device's rows sorted locally).
MESHES = (
    ("single", (1, 1, 1, 1)),
    ("dp2_ep4", (2, 1, 1, 4)),
    ("fsdp2_tp2_ep2", (1, 2, 2, 2)),
    ("dp4_tp2", (4, 1, 2, 1)),
)


def _cfg(routing: str = "paired", impl: str = "grouped"):
    from training_helpers import tiny_model

    return tiny_model(n_layers=1, moe=MOE | dict(routing=routing, impl=impl, aux_loss_coef=0.01))


def _train(cfg, shape, batches):
    from orthros_jax.training import (
        MeshConfig,
        OptimizerConfig,
        init_train_state,
        make_optimizer,
        make_train_step,
    )

    opt = OptimizerConfig(lr=1e-3, warmup_steps=0)
    tx = make_optimizer(opt, len(batches), cfg)
    step = make_train_step(cfg, opt, tx, len(batches))
    mesh = pmesh.make_mesh(MeshConfig(*shape), jax.devices()[: int(np.prod(shape))])
    rng = jax.random.PRNGKey(0)
    abstract = jax.eval_shape(lambda r: init_train_state(cfg, tx, r), rng)
    s_sh = sharding.state_shardings(abstract, sharding.param_shardings(cfg, mesh), tx, mesh)
    state = jax.jit(lambda r: init_train_state(cfg, tx, r), out_shardings=s_sh)(rng)
    fn = sharding.jit_train_step(step, s_sh, mesh, {k: 2 for k in batches[0]})
    hlo = fn.lower(state, pmesh.shard_batch(batches[0], mesh)).compile().as_text()
    losses, balance = [], []
    for b in batches:
        state, metrics = fn(state, pmesh.shard_batch(b, mesh))
        losses.append(float(metrics["loss"]))
        balance.append(float(metrics["moe_balance_loss"]))
    flat = jax.tree_util.tree_flatten_with_path(state.params)[0]
    params = {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}
    specs = {jax.tree_util.keystr(k): str(v.sharding.spec) for k, v in flat}
    collectives = {op: op in hlo for op in ("all-gather", "reduce-scatter")}
    return losses, balance, params, specs, collectives, state.params


def _infer(cfg, shape, params, batch: int):
    """Greedy prefill of a 24-token prompt then 3 decode steps; the logits of each."""
    import functools

    from orthros_jax.inference import drivers
    from orthros_jax.inference.cache import init_cache
    from orthros_jax.training import MeshConfig

    mesh = pmesh.make_mesh(MeshConfig(*shape), jax.devices()[: int(np.prod(shape))])
    params = jax.device_put(params, sharding.param_shardings(cfg, mesh))
    tokens = np.random.default_rng(batch).integers(0, cfg.vocab_size, (batch, 24), np.int32)
    prefill = jax.jit(sharding.traced_under(functools.partial(drivers.prefill, cfg=cfg), mesh))
    decode = jax.jit(sharding.traced_under(functools.partial(drivers.decode, cfg=cfg), mesh))
    logits, cache = prefill(params, init_cache(cfg, batch, 32), tokens, np.full(batch, 24))
    out = [np.asarray(logits)]
    active = np.ones(batch, bool)
    for _ in range(3):
        logits, cache = decode(params, cache, np.argmax(out[-1], -1).astype(np.int32), active)
        out.append(np.asarray(logits))
    return np.stack(out)


# (routing, impl, meshes, meshes with inference), all in one 8-device process: the default arm's
# train step on every mesh against one single-device reference, its prefill / decode on the
# expert-split mesh (each mesh's inference programs cost a compile: the train steps already
# check the other layouts); the others (independent copies, the dense reference's expert
# slice) on one more mesh's train step, each against its own single-device run.
CASES = (
    ("paired", "grouped", MESHES, ("single", "dp2_ep4")),
    ("independent", "grouped", MESHES[::3], ()),
    ("paired", "dense", MESHES[:2], ()),
)


def _worker(out: str) -> None:
    """Runs with 8 CPU devices: the train steps, prefill and decode of CASES."""
    from training_helpers import pt_batch

    assert jax.device_count() == 8
    batches = [pt_batch(i) for i in range(2)]
    meta: dict = {}
    arrays: dict = {}
    for routing, impl, meshes, infer in CASES:
        cfg = _cfg(routing, impl)
        trained = None
        for name, shape in meshes:
            losses, balance, params, specs, coll, tree = _train(cfg, shape, batches)
            trained = tree if trained is None else trained
            key = f"{routing}/{impl}/{name}"
            meta[key] = {"losses": losses, "balance": balance, "specs": specs, "hlo": coll}
            arrays |= {f"{key}:{k}": v for k, v in params.items()}
            for batch in (1, 8) if name in infer else ():  # batch 1: rows not split over "expert"
                arrays[f"{key}:logits{batch}"] = _infer(cfg, shape, trained, batch)
    np.savez(os.path.join(out, "arrays.npz"), **arrays)
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f)


@pytest.mark.slow
def test_expert_parallel_equals_one_device(tmp_path):
    """A named end-to-end scenario (one 8-device process, about 20 compiles)."""
    from training_helpers import subprocess_env

    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path)],
        env=subprocess_env(8),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    meta = json.loads((tmp_path / "meta.json").read_text())
    arrays = np.load(tmp_path / "arrays.npz")
    for key, rec in meta.items():
        routing, impl, name = key.split("/")
        if name == "single":
            continue
        ref_key = f"{routing}/{impl}/single"
        ref = meta[ref_key]
        np.testing.assert_allclose(rec["losses"], ref["losses"], atol=1e-5, rtol=0, err_msg=key)
        np.testing.assert_allclose(rec["balance"], ref["balance"], atol=1e-5, rtol=0)
        for p in ref["specs"]:
            np.testing.assert_allclose(
                arrays[f"{key}:{p}"], arrays[f"{ref_key}:{p}"], atol=1e-5, rtol=0, err_msg=p
            )
        for batch in (1, 8) if f"{key}:logits1" in arrays else ():
            np.testing.assert_allclose(
                arrays[f"{key}:logits{batch}"],
                arrays[f"{ref_key}:logits{batch}"],
                atol=1e-4,
                rtol=0,
                err_msg=f"{key} batch {batch}",
            )
        if name == "dp4_tp2":  # no expert axis: no token gathered over one
            assert "'expert'" not in rec["specs"]["['moe']['w_gate']"]
            continue
        # The experts really are split over "expert" (and the tokens gathered / scattered).
        assert rec["specs"]["['moe']['w_gate']"].startswith(str(P(None, "expert"))[:-1])
        assert rec["hlo"] == {"all-gather": True, "reduce-scatter": True}, key
    assert sorted(meta) == sorted(
        f"{routing}/{impl}/{name}" for routing, impl, meshes, _ in CASES for name, _ in meshes
    )
    # Paired and independent routing are different models (the test compares like with like;
    # the dense experts are the grouped ones' model).
    a, b = meta["paired/dense/single"], meta["independent/grouped/single"]
    assert abs(a["losses"][-1] - b["losses"][-1]) > 1e-6
    # The default arm's inference ran on the expert-split mesh.
    assert "paired/grouped/dp2_ep4:logits8" in arrays


def test_experts_must_divide_the_expert_axis():
    from training_helpers import tiny_model

    cfg = tiny_model(moe=MOE | dict(n_experts=6))
    mesh = AbstractMesh((2, 1, 1, 4), pmesh.MESH_AXES)
    with pytest.raises(ValueError, match=r"moe.n_experts=6 does not divide .*expert axis \(4"):
        sharding.param_shardings(cfg, mesh)


if __name__ == "__main__":
    _worker(sys.argv[1])
