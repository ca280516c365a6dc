"""Sequence-parallel prefill, decode and generate through the public API (init_cache(mesh=),
prefill, decode_step, generate) on 8 simulated CPU devices, against the single-device run.

The 8-device part runs once, in one subprocess started with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before it imports jax); two more
processes with 4 devices each run the same prefill and decode through jax.distributed on
localhost, beside it. The tests compare what they saved. The children compile with
--xla_backend_optimization_level=0: these programs are tiny, and it halves their compile time.

Every case: window 12, prefill chunk 6, a 64-slot cache. On sequence = 8 a shard holds 8 slots,
so the base window's 11 earlier keys come from two shards back (a multi-hop halo) and a chunk
of 6 does not divide a shard (its chunk grid is padded); on data = 2 x sequence = 4 (16 slots a
shard) the halo is one hop. Ragged prompts of 37 and 21 tokens (not multiples of 8) fill part
of the cache; prompts of 9 and 37 then continue them (slots 37..45 and 21..57 straddle shard
boundaries, and a shard holds old and new tokens side by side); four decode steps cross the
boundary at 48.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import free_port, single_stream, tiny_config

SLOTS, WINDOW, CHUNK = 64, 12, 6
ARMS = ("orthros", "transformer", "swa")
MESHES = {"seq8": (8, 1), "data2_seq4": (4, 2)}  # name -> (sequence, data)


def _cfg(arch: str, **changes):
    return tiny_config(architecture=arch, window=WINDOW, prefill_chunk=CHUNK, **changes)


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.RandomState(0)
    return {
        "tokens": rng.randint(0, 256, (2, 40)),
        "lengths": np.array([37, 21]),
        "tokens2": rng.randint(0, 256, (2, 40)),
        "lengths2": np.array([9, 37]),  # the first prompts' bucket: one single-device compile
        "next": rng.randint(0, 256, (4, 2)),
    }


def _params(arch: str, put=None):
    import jax

    from orthros_jax.model import init_params

    p = init_params(_cfg("orthros"), jax.random.PRNGKey(0))
    p = p if arch == "orthros" else single_stream(p)
    return p if put is None else put(p)


def _serve(arch: str, mesh, params=None) -> dict[str, np.ndarray]:
    """prefill, a continued prefill, then 4 decode steps; every logits [B, V] and the cache."""
    from orthros_jax.inference import decode_step, init_cache, prefill
    from orthros_jax.inference.api import _host

    cfg, x = _cfg(arch), _inputs()
    params = _params(arch) if params is None else params
    cache = init_cache(cfg, 2, SLOTS, mesh=mesh)
    out = {}
    out["prefill"], cache = prefill(params, cache, x["tokens"], x["lengths"], cfg)
    out["prefill2"], cache = prefill(params, cache, x["tokens2"], x["lengths2"], cfg)
    for i, tok in enumerate(x["next"]):
        out[f"decode{i}"], cache = decode_step(params, cache, tok, cfg)
    if mesh is not None:
        out["cache_spec"] = np.array(str(cache.states["attention"][0].sharding.spec))
    k, v = cache.states["attention"]
    out.update(k=k, v=v, lengths=cache.lengths)
    return {k: (v if k == "cache_spec" else _host(v)) for k, v in out.items()}


def _collective_bytes(arch: str, mesh, slots: int) -> dict[str, int]:
    """Collective bytes of the compiled sequence-parallel prefill of two full prompts (inputs
    placed as api.prefill places them: at 64 slots the program _serve compiled, loaded from the
    persistent compilation cache)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from benchmarks.hlo_stats import collective_bytes
    from orthros_jax.inference import init_cache, sequence_parallel
    from orthros_jax.parallel import mesh as pmesh

    cfg = _cfg(arch)
    cache = init_cache(cfg, 2, slots, mesh=mesh)
    _, rows = sequence_parallel.specs(cfg, mesh, 2, slots)
    on = lambda *spec: NamedSharding(mesh, P(rows, *spec))
    tokens = pmesh.put(np.zeros((2, slots), np.int32), on(sequence_parallel.SEQ))
    lengths = pmesh.put(np.full((2,), slots, np.int32), on())
    lowered = sequence_parallel.prefill.lower(
        _params(arch), cache, tokens, lengths, cfg=cfg, mesh=mesh
    )
    return collective_bytes(lowered.compile())


def _too_long_prompt(mesh) -> dict:
    """The error of a continued prompt that overflows a sequence-sharded cache, and whether
    anything compiled for it."""
    from orthros_jax.inference import init_cache, prefill, sequence_parallel

    cfg, x, params = _cfg("orthros"), _inputs(), _params("orthros")
    _, cache = prefill(params, init_cache(cfg, 2, SLOTS, mesh=mesh), x["tokens"], x["lengths"], cfg)
    compiled = sequence_parallel.prefill._cache_size()
    try:
        prefill(params, cache, np.ones((2, 30), np.int32), np.array([30, 5]), cfg)
    except ValueError as e:
        return {"error": str(e), "compiled": sequence_parallel.prefill._cache_size() - compiled}
    return {"error": None}


def _greedy(params, cfg, mesh, steps: int) -> np.ndarray:
    """Greedy tokens [B, steps] after the first prompts, fed back by prefill + decode_step."""
    from orthros_jax.inference import decode_step, init_cache, prefill
    from orthros_jax.inference.api import _host

    x = _inputs()
    cache = init_cache(cfg, 2, SLOTS, mesh=mesh)
    logits, cache = prefill(params, cache, x["tokens"], x["lengths"], cfg)
    out = [_host(logits).argmax(-1)]
    for _ in range(steps - 1):
        logits, cache = decode_step(params, cache, out[-1], cfg)
        out.append(_host(logits).argmax(-1))
    return np.stack(out, 1)


ENGINE_LENS, ENGINE_NEW = (13, 21, 5, 30, 9), (6, 4, 8, 3, 5)


def _engine_case(arch: str, mesh, decode_steps: int) -> dict[str, np.ndarray]:
    """Greedy through the serving engine on a sequence-split cache (2 slots of 64, chunks of 6:
    the 21- and 30-token prompts continue over steps; 5 requests reuse slots), requests arriving
    over time as in tests/test_serving_engine.py; and single-device generate's tokens."""
    from orthros_jax.inference import generate, sequence_parallel
    from orthros_jax.serving import device
    from orthros_jax.serving.engine import Engine
    from orthros_jax.serving.requests import SamplingParams

    cfg, params = _cfg(arch), _params(arch)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in ENGINE_LENS]
    engine = Engine(
        params,
        cfg,
        max_batch=2,
        max_len=SLOTS,
        chunk_budget=6,
        mesh=mesh,
        prefill_lengths=(6,),
        prefill_batches=(2,),  # one prefill program (a one-row chunk runs beside a padding row)
        decode_steps=decode_steps,
    )
    engine.warmup()
    compiled = device.compile_count()
    got: list[list[int]] = [[] for _ in prompts]
    submit = lambda k: engine.submit(
        prompts[k],
        SamplingParams(max_tokens=ENGINE_NEW[k], temperature=0.0),
        lambda ev: got[k].append(ev.token) if ev.kind == "token" else None,
    )
    submit(0)
    engine.step()  # request 0 is mid-prompt when 1 and 2 arrive
    submit(1), submit(2)
    engine.step()
    engine.step()
    submit(3), submit(4)  # these wait for free slots
    for _ in range(200):
        if engine.busy():
            engine.step()
    want = generate(params, prompts, cfg, max_new_tokens=max(ENGINE_NEW)).tokens
    out = {"compiled": np.array(device.compile_count() - compiled), "want": want}
    out["got"] = np.array([g + [-1] * (max(ENGINE_NEW) - len(g)) for g in got])
    out["split"] = np.array(sequence_parallel.mesh_of(engine.cache) is mesh)
    out["cache_spec"] = np.array(str(engine.cache.states["attention"][0].sharding.spec))
    return out


def _worker(out_dir: str) -> None:
    """8 devices: every arm on one device and on both meshes, generate, the serving engine,
    the HLO collective bytes and a too-long prompt."""
    import jax

    from orthros_jax.inference import generate
    from orthros_jax.parallel import mesh as pmesh

    assert jax.device_count() == 8, jax.devices()
    res, stats = {}, {}
    for arch in ARMS:
        for key, v in _serve(arch, None).items():
            res[f"{arch}/single/{key}"] = v
        for name, (seq, data) in MESHES.items():
            for key, v in _serve(arch, pmesh.sequence_mesh(seq, data=data)).items():
                res[f"{arch}/{name}/{key}"] = v
    seq8 = pmesh.sequence_mesh(8)
    x, cfg, params = _inputs(), _cfg("orthros"), _params("orthros")
    prompts = [list(x["tokens"][0, :37]), list(x["tokens"][1, :21])]
    out = generate(params, prompts, cfg, max_new_tokens=9, cache_size=SLOTS, mesh=seq8)
    res["generate/seq8"] = out.tokens
    res["generate/single_steps"] = _greedy(params, cfg, None, 9)
    for key, v in _engine_case("orthros", seq8, 2).items():
        res[f"engine/orthros/seq8/{key}"] = v
    for arch in ("orthros", "transformer"):
        for slots in (SLOTS, 2 * SLOTS):
            stats[f"{arch}/{slots}"] = _collective_bytes(arch, seq8, slots)
    stats["too_long"] = _too_long_prompt(seq8)
    for key, v in _engine_case("transformer", pmesh.sequence_mesh(4, data=2), 1).items():
        res[f"engine/transformer/data2_seq4/{key}"] = v
    np.savez(os.path.join(out_dir, "res.npz"), **res)
    with open(os.path.join(out_dir, "stats.json"), "w") as fh:
        json.dump(stats, fh)


def _process(index: int, port: int, out_dir: str) -> None:
    """One of two processes (4 devices each): orthros on sequence = 8 across both."""
    import jax

    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=index)
    from jax.sharding import NamedSharding, PartitionSpec

    from orthros_jax.parallel import mesh as pmesh

    assert jax.process_count() == 2 and jax.device_count() == 8
    mesh = pmesh.sequence_mesh(8)
    rep = NamedSharding(mesh, PartitionSpec())
    put = lambda p: pmesh.put_tree(jax.tree.map(np.asarray, p), jax.tree.map(lambda _: rep, p))
    out = _serve("orthros", mesh, params=_params("orthros", put))
    np.savez(os.path.join(out_dir, f"process{index}.npz"), **out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Starts the 8-device worker and the two processes together; returns what they saved."""
    from training_helpers import subprocess_env

    out = tmp_path_factory.mktemp("sp_inference")
    port = free_port()
    jobs = (("worker",), 8), (("0", str(port)), 4), (("1", str(port)), 4)
    procs = []
    for args, devices in jobs:
        env = subprocess_env(devices)
        env["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, *args, str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-4000:]
    res = dict(np.load(out / "res.npz"))
    stats = json.loads((out / "stats.json").read_text())
    return res, stats, [dict(np.load(out / f"process{i}.npz")) for i in range(2)]


STEPS = ("prefill", "prefill2", "decode0", "decode1", "decode2", "decode3")


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("arch", ARMS)
def test_sequence_parallel_equals_single_device(runs, arch, mesh):
    res, _, _ = runs
    for step in STEPS:
        got, want = res[f"{arch}/{mesh}/{step}"], res[f"{arch}/single/{step}"]
        assert got.shape == (2, 256)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=step)
    # The cache: every written slot equals the single-device one; lengths 37+9+4, 21+37+4.
    np.testing.assert_array_equal(res[f"{arch}/{mesh}/lengths"], [50, 62])
    for kv in ("k", "v"):
        got, want = res[f"{arch}/{mesh}/{kv}"], res[f"{arch}/single/{kv}"]
        for row, n in enumerate((50, 62)):
            np.testing.assert_allclose(
                got[:, row, :, :n], want[:, row, :, :n], atol=1e-5, rtol=0, err_msg=kv
            )
            np.testing.assert_array_equal(got[:, row, :, n:], 0.0)  # never written
    # The returned cache is split as it came in: slots over sequence (rows over data).
    rows = "'data'" if mesh == "data2_seq4" else "None"
    assert str(res[f"{arch}/{mesh}/cache_spec"]) == f"P(None, {rows}, None, 'sequence')"


@pytest.mark.slow
def test_generate_on_a_sequence_sharded_cache(runs):
    res, _, _ = runs
    want = res["generate/single_steps"]  # greedy, one device, token by token
    assert want.shape == (2, 9) and (want >= 0).all()
    np.testing.assert_array_equal(res["generate/seq8"], want)


@pytest.mark.slow
@pytest.mark.parametrize("arch,mesh", [("orthros", "seq8"), ("transformer", "data2_seq4")])
def test_serving_engine_on_a_sequence_sharded_cache(runs, arch, mesh):
    res, _, _ = runs
    r = {k: res[f"engine/{arch}/{mesh}/{k}"] for k in ("got", "want", "compiled", "split")}
    for k, n in enumerate(ENGINE_NEW):  # greedy: the engine's tokens are generate's
        assert r["got"][k, :n].tolist() == r["want"][k, :n].tolist(), k
        assert (r["got"][k, n:] == -1).all(), k
    assert int(r["compiled"]) == 0, "the engine compiled in steady state"
    assert bool(r["split"])  # the cache is still split over the same mesh after serving
    rows = "'data'" if mesh == "data2_seq4" else "None"
    assert str(res[f"engine/{arch}/{mesh}/cache_spec"]) == f"P(None, {rows}, None, 'sequence')"


def test_serving_engine_refuses_what_sequence_parallelism_cannot_serve():
    from jax.sharding import AbstractMesh

    from orthros_jax.serving import device
    from orthros_jax.serving.engine import Engine

    seq8 = AbstractMesh((1, 8), ("data", "sequence"))
    data2 = AbstractMesh((2, 4), ("data", "sequence"))
    cfg, hybrid = _cfg("orthros"), tiny_config(architecture="hybrid", n_layers=4)
    compiled = device.compile_count()
    cases = [
        (cfg, AbstractMesh((8, 1), ("data", "sequence")), 2, 64, r"'sequence' axis > 1"),
        (cfg, seq8, 2, 100, r"cache length \(max_len\) 100 is not divisible"),
        (cfg, data2, 3, 64, r"batch size 3 is not divisible .*'data': 2"),
        (hybrid, seq8, 2, 64, r"cache grows with slots; layer_types .* \['gdn'\]"),
        (cfg, AbstractMesh((2, 4), ("tensor", "sequence")), 2, 64, r"tensor parallelism"),
    ]
    for c, mesh, batch, length, match in cases:
        with pytest.raises(ValueError, match=match):
            Engine(None, c, max_batch=batch, max_len=length, mesh=mesh)
    assert device.compile_count() == compiled


@pytest.mark.slow
def test_orthros_collective_bytes_do_not_grow_with_t_transformer_does(runs):
    _, stats, _ = runs
    f32, b, kv, h = 4, 2, 2, 8
    o, o2 = stats["orthros/64"], stats[f"orthros/{2 * 64}"]
    t, t2 = stats["transformer/64"], stats[f"transformer/{2 * 64}"]
    # Orthros: every collective moves the same bytes at 2x the slots; the one halo layer (the
    # last layer only writes) receives W-1 = 11 rows of K and V, over two hops.
    assert o == o2
    assert o["all-gather"] == 0
    assert o["collective-permute"] == 2 * b * kv * (WINDOW - 1) * h * f32
    # Transformer: its (one) gathering layer all-gathers the whole K and V of the layer.
    for stat, slots in ((t, 64), (t2, 2 * 64)):
        assert stat["all-gather"] == 2 * b * kv * slots * h * f32
        assert stat["collective-permute"] == 0
    # The split-K merges and the last-token broadcast do not depend on T either.
    assert t["all-reduce"] == t2["all-reduce"] > 0 and o["all-reduce"] > 0


@pytest.mark.slow
def test_two_processes_agree_with_one(runs):
    res, _, procs = runs
    p0, p1 = procs
    # The logits are replicated: each process reads its own copy, so they must agree. The cache
    # is gathered from both processes (identical by construction): only the one-process run
    # checks it.
    for key in STEPS:
        np.testing.assert_array_equal(p0[key], p1[key], err_msg=key)
    for key in (*STEPS, "k", "v", "lengths"):
        np.testing.assert_allclose(p0[key], res[f"orthros/seq8/{key}"], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_bad_input_raises_before_compiling(runs):
    from jax.sharding import AbstractMesh

    from orthros_jax.inference import init_cache

    _, stats, _ = runs
    too_long = stats["too_long"]
    assert too_long["compiled"] == 0
    assert "row 0 needs 67 cache slots (37 held + 30 prompt tokens)" in too_long["error"]
    assert "max_len=64" in too_long["error"]
    # The mesh checks run before any array exists: a mesh of shapes is enough.
    seq8 = AbstractMesh((1, 8), ("data", "sequence"))
    data2 = AbstractMesh((2, 4), ("data", "sequence"))
    cfg = _cfg("orthros")
    with pytest.raises(ValueError, match=r"cache length \(max_len\) 100 is not divisible by the "):
        init_cache(cfg, 2, 100, mesh=seq8)
    with pytest.raises(ValueError, match=r"batch size 3 is not divisible .*'data': 2.* = 2"):
        init_cache(cfg, 3, 64, mesh=data2)
    hybrid = tiny_config(architecture="hybrid", n_layers=4)
    with pytest.raises(ValueError, match=r"cache grows with slots; layer_types .* \['gdn'\]"):
        init_cache(hybrid, 2, 64, mesh=seq8)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        _worker(sys.argv[2])
    else:
        _process(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
