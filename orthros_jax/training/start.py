"""How a training run starts: the initial params (init_from, identity SO filled in), the train
state's shapes and shardings and a fresh state placed in them, the check that a resumed workdir
holds the same model, the config's likely mistakes, model.json. Shared by training/loop.py and
rl/loop.py.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import grain
import jax
import numpy as np
import optax

from orthros_jax import checkpoint
from orthros_jax.layers import lora, stack
from orthros_jax.model import Params
from orthros_jax.parallel import mesh as pmesh
from orthros_jax.parallel import sharding
from orthros_jax.training.config import TrainConfig
from orthros_jax.training.state import TrainState, init_train_state
from orthros_jax.training.trainable import Trainable, trainable_subset

TRAINABLE_JSON = "trainable.json"  # the trained subset of a workdir's checkpoints


def trainable_of(cfg: TrainConfig) -> Trainable:
    """The run's trainable subset (train.trainable; ValueError when it selects nothing)."""
    return trainable_subset(cfg.model, cfg.train.trainable)


def initial_params(cfg: TrainConfig, abstract_params: Params) -> Params:
    """Host params from cfg.init_from (a model dir or training workdir). Scale-offset vectors a
    Transformer checkpoint lacks are filled with the identity (scale 1, offset 0), which is the
    paper's Transformer -> Orthros conversion; any other difference is a ValueError."""
    assert cfg.init_from is not None
    # A LoRA run's weights come merged unless this run trains adapters too (then its own).
    loaded = checkpoint.load_model(cfg.init_from, merge_lora=cfg.model.lora is None)
    params = jax.tree.map(np.asarray, loaded.params)
    params, added = stack.fill_identity_so(params, cfg.model)  # every kind's stack
    for name in added:
        logging.info("init_from: %s not in %s, using the identity", name, cfg.init_from)
    if cfg.model.lora is not None and loaded.cfg.lora is None:  # new adapters (B = 0)
        rng = jax.random.PRNGKey(cfg.train.seed)
        fresh = jax.tree.map(np.asarray, lora.init_adapters(cfg.model, rng))
        params = lora.join(params, fresh)
        logging.info("init_from: new LoRA adapters on %s", cfg.init_from)
    checkpoint.check_same_shapes(abstract_params, params, f"init_from={cfg.init_from!r}")
    return jax.tree.map(lambda p, a: p.astype(a.dtype), params, abstract_params)


def abstract_state(
    cfg: TrainConfig, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh
) -> tuple[TrainState, Params]:
    """The TrainState's shapes with their shardings (ShapeDtypeStructs), and the params'
    shardings: the restore target and the init out_shardings."""
    rng, trainable = jax.random.PRNGKey(cfg.train.seed), trainable_of(cfg)
    shapes = jax.eval_shape(lambda r: init_train_state(cfg.model, tx, r, None, trainable), rng)
    params_sh = sharding.param_shardings(cfg.model, mesh)
    trained_sh = trainable.split(params_sh)[0]
    state_sh = sharding.state_shardings(shapes, params_sh, tx, mesh, trained_sh)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, state_sh
    )
    return abstract, params_sh


def fresh_state(
    cfg: TrainConfig, tx: optax.GradientTransformation, abstract: TrainState, params_sh: Params
) -> TrainState:
    """A new state created directly in its shardings (jit with out_shardings): random init
    from train.seed, or the params of cfg.init_from with a fresh optimizer state."""
    rng, trainable = jax.random.PRNGKey(cfg.train.seed), trainable_of(cfg)
    state_sh = jax.tree.map(lambda a: a.sharding, abstract)
    if cfg.init_from:
        params = pmesh.put_tree(initial_params(cfg, abstract.params), params_sh)

        def init_from(p: Params, r: jax.Array) -> TrainState:
            return init_train_state(cfg.model, tx, r, p, trainable)

        return jax.jit(init_from, out_shardings=state_sh)(params, rng)

    def init(r: jax.Array) -> TrainState:
        return init_train_state(cfg.model, tx, r, None, trainable)

    return jax.jit(init, out_shardings=state_sh)(rng)


def is_checkpointable(it: Any) -> bool:
    return isinstance(it, grain.DatasetIterator | grain.DataLoaderIterator)


def check_resumed_model(cfg: TrainConfig, workdir: str) -> None:
    """ValueError naming every model field that differs from the workdir's model.json when
    the workdir holds checkpoints (their weights were trained with model.json's config). The
    fields that change how the model runs, not the function its weights compute
    (ModelConfig.runtime_keys), may change; model.json then records the new value."""
    ckpt_dir = os.path.join(workdir, checkpoint.CHECKPOINTS_DIR)
    has_ckpt = os.path.isdir(ckpt_dir) and any(d.isdigit() for d in os.listdir(ckpt_dir))
    if not (has_ckpt and os.path.isfile(os.path.join(workdir, checkpoint.MODEL_JSON))):
        return
    check_resumed_trainable(cfg, workdir)
    old, _ = checkpoint.read_model_json(workdir)
    new, runtime = cfg.model.flat(), cfg.model.runtime_keys()
    changed = {
        k: (v, new.get(k)) for k, v in old.flat().items() if new.get(k) != v and k not in runtime
    }
    if changed:
        what = ", ".join(
            f"model.{k}={new!r} (trained with {was!r})" for k, (was, new) in changed.items()
        )
        raise ValueError(
            f"{workdir} holds checkpoints of a different model shape or math: {what}; resume "
            "with the workdir's config, or train the changed model in a new workdir"
        )


def check_resumed_trainable(cfg: TrainConfig, workdir: str) -> None:
    """ValueError when the workdir's checkpoints trained another subset (its trainable.json;
    absent: every parameter, as before subsets existed): their optimizer state holds other
    parameters' moments."""
    path = os.path.join(workdir, TRAINABLE_JSON)
    was = "all"
    if os.path.isfile(path):
        with open(path) as f:
            was = json.load(f)["trainable"]
    if was != cfg.train.trainable:
        raise ValueError(
            f"{workdir} holds checkpoints trained with train.trainable={was!r}, not "
            f"{cfg.train.trainable!r}; resume with the workdir's trainable set, or start the "
            "new one in a new workdir (init_from the old one)"
        )


def config_warnings(cfg: TrainConfig) -> list[str]:
    """Settings that are valid but almost certainly not meant."""
    out = []
    if cfg.optimizer.warmup_steps >= cfg.train.steps:
        out.append(
            f"optimizer.warmup_steps={cfg.optimizer.warmup_steps} >= train.steps="
            f"{cfg.train.steps}: the whole run is warmup (lr never reaches optimizer.lr="
            f"{cfg.optimizer.lr:g})"
        )
    return out


def write_model_json(cfg: TrainConfig, workdir: str) -> None:
    """workdir/model.json, so checkpoint.load_model(workdir) and launch/generate.py work; it
    records the training sequence length as the model's context."""
    if jax.process_index() != 0:
        return
    tokenizer = getattr(cfg.data, "tokenizer", None)
    seq_len = getattr(cfg.data, "seq_len", None)
    checkpoint.write_model_json(workdir, cfg.model, tokenizer, seq_len)
    write_trainable(cfg, workdir)


def write_trainable(cfg: TrainConfig, workdir: str) -> None:
    """workdir/trainable.json: train.trainable and the paths it trains (the resume check)."""
    if jax.process_index() != 0:
        return
    trainable = trainable_of(cfg)
    with open(os.path.join(workdir, TRAINABLE_JSON), "w") as f:
        json.dump({"trainable": trainable.spec, "paths": trainable.paths()}, f, indent=1)
