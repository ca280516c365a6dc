"""Training checkpoints: corrupt latest skipped with a warning, other model shape -> clear
error, integrity checksums, load_model on a training workdir."""

from __future__ import annotations

import dataclasses
import functools
import gc
import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from training_helpers import pt_dataset, tiny_model, tiny_train_config

from orthros_jax import checkpoint
from orthros_jax.training import OptimizerConfig, init_train_state, make_optimizer, train

TX = make_optimizer(OptimizerConfig(), 10, tiny_model())  # the mask: by name, any width


@functools.cache
def _init_fn(d_model: int):
    return jax.jit(lambda r: init_train_state(tiny_model(d_model=d_model), TX, r))


def _state(seed: int, d_model: int = 32):
    """A fresh state of the tiny model (jitted: much faster than eager init on CPU)."""
    return _init_fn(d_model)(jax.random.PRNGKey(seed))


def _abstract(state):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)


def _workdir(tmp_path, steps=(1, 2)):
    """A workdir with model.json and checkpoints of states seeded by their step; data
    iterator advanced by `step` batches at each."""
    workdir = str(tmp_path / "run")
    checkpoint.write_model_json(workdir, tiny_model(), None)
    ckpt = checkpoint.TrainCheckpointer(workdir, keep=5)
    it = iter(pt_dataset(batch=2, seq=8))
    done = 0
    for step in steps:
        for _ in range(step - done):
            next(it)
        done = step
        ckpt.save(step, _state(step).replace(step=jnp.int32(step)), it)
    ckpt.close()
    return workdir


def _position(step: int) -> dict:
    it = iter(pt_dataset(batch=2, seq=8))
    for _ in range(step):
        next(it)
    return it.get_state()


def _truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _garble(path: str) -> None:
    data = bytearray(open(path, "rb").read())
    mid = len(data) // 2
    data[mid : mid + 32] = bytes(255 - b for b in data[mid : mid + 32])
    open(path, "wb").write(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("damage", [_truncate, _garble], ids=["truncated", "garbled"])
# When one shard's read fails, orbax drops the other shards' read coroutines unawaited; Python
# reports each when the garbage collector finds it: collected here (gc.collect below), so the
# reports fall in this test and this filter, not in whatever test runs next on the worker.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_corrupt_latest_checkpoint_is_skipped_with_warning(tmp_path, damage):
    workdir = _workdir(tmp_path)
    files = glob.glob(
        os.path.join(workdir, "checkpoints", "2", "state", "**", "d", "*"), recursive=True
    )
    biggest = max(files, key=os.path.getsize)  # the parameter data
    damage(biggest)
    ckpt = checkpoint.TrainCheckpointer(workdir, keep=5)
    it = iter(pt_dataset(batch=2, seq=8))
    with pytest.warns(UserWarning, match="checkpoint step 2 .* unreadable"):
        state = ckpt.restore_latest(_abstract(_state(0)), it)
    ckpt.close()
    assert int(state.step) == 1
    for got, want in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(_state(1).params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert it.get_state() == _position(1)  # the data position of step 1 too
    assert os.path.isdir(os.path.join(workdir, checkpoint.CORRUPT_DIR, "2"))
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1"]
    gc.collect()


@pytest.mark.slow
def test_missing_metadata_is_skipped(tmp_path):
    workdir = _workdir(tmp_path)
    os.remove(os.path.join(workdir, "checkpoints", "2", "state", "_METADATA"))
    ckpt = checkpoint.TrainCheckpointer(workdir, keep=5)
    with pytest.warns(UserWarning, match="unreadable"):
        state = ckpt.restore_latest(_abstract(_state(0)), None)
    ckpt.close()
    assert int(state.step) == 1


@pytest.mark.slow
def test_checkpoint_of_another_model_shape_fails_clearly(tmp_path):
    workdir = _workdir(tmp_path, steps=(1,))
    ckpt = checkpoint.TrainCheckpointer(workdir, keep=5)
    with pytest.raises(
        ValueError, match="different model shape: params/embedding is \\(256, 32\\)"
    ):
        ckpt.restore_latest(_abstract(_state(0, d_model=48)), None)
    ckpt.close()
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "1"))  # not quarantined
    # The same through train(), before anything compiles.
    cfg = tiny_train_config()
    cfg = dataclasses.replace(cfg, model=tiny_model(d_model=48))
    with pytest.raises(ValueError, match="different model shape"):
        train(cfg, workdir, train_iterator=iter(pt_dataset()), eval_batches=[])


def test_load_model_reads_a_training_workdir(tmp_path):
    workdir = _workdir(tmp_path)
    loaded = checkpoint.load_model(workdir)
    assert loaded.cfg == tiny_model() and loaded.tokenizer_file is None
    for got, want in zip(
        jax.tree.leaves(loaded.params), jax.tree.leaves(_state(2).params), strict=True
    ):
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, np.asarray(want))
    files = glob.glob(
        os.path.join(workdir, "checkpoints", "2", "state", "**", "d", "*"), recursive=True
    )
    _garble(max(files, key=os.path.getsize))
    with pytest.warns(UserWarning, match="skipping unreadable checkpoint"):
        loaded = checkpoint.load_model(workdir)
    np.testing.assert_array_equal(
        loaded.params["embedding"], np.asarray(_state(1).params["embedding"])
    )


def test_checksums_are_sharding_independent_and_catch_single_changes():
    tree = {"a": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "b": jnp.ones(3, jnp.bfloat16)}
    sums = checkpoint.state_checksums(tree)
    assert sums == checkpoint.state_checksums(jax.tree.map(np.asarray, tree))
    changed = {"a": tree["a"].at[1, 2].set(5.0000005), "b": tree["b"]}
    assert checkpoint.state_checksums(changed)["['a']"] != sums["['a']"]


@pytest.mark.slow
def test_init_from_loads_params_and_fills_identity_scale_offsets(tmp_path):
    from orthros_jax.model import init_params
    from orthros_jax.parallel import mesh as pmesh
    from orthros_jax.training.start import abstract_state, fresh_state

    cfg = tiny_train_config()
    tx = make_optimizer(cfg.optimizer, cfg.train.steps, cfg.model)
    abstract, params_sh = abstract_state(cfg, tx, pmesh.make_mesh(cfg.mesh))

    def start_from(model_cfg, name):
        params = init_params(model_cfg, jax.random.PRNGKey(5))
        checkpoint.save_model(str(tmp_path / name), model_cfg, params)
        run = dataclasses.replace(cfg, init_from=str(tmp_path / name))
        return params, fresh_state(run, tx, abstract, params_sh)

    params, state = start_from(cfg.model, "orthros")
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert int(state.step) == 0
    # A Transformer directory: shared weights load, scale-offsets start at the identity.
    transformer = cfg.model.replace(architecture="transformer", scale_offset=False)
    params, state = start_from(transformer, "transformer")
    layers = state.params["layers"]
    np.testing.assert_array_equal(np.asarray(layers["wq"]), np.asarray(params["layers"]["wq"]))
    np.testing.assert_array_equal(np.asarray(layers["so_out_scale"]), 1.0)
    np.testing.assert_array_equal(np.asarray(layers["so_base_offset"]), 0.0)
    with pytest.raises(ValueError, match="init_from=.*different model shape"):
        start_from(cfg.model.replace(d_ff=96), "wider")
