"""Checkpoints: exported model directories (config + params [+ tokenizer]).

A model directory holds
  model.json       {"model": ModelConfig fields, "tokenizer": "tokenizer.json" | null,
                    "max_context": the longest sequence it was trained on or imported with
                    (a training run's seq_len, an imported model's max_position_embeddings),
                    absent when unknown, "source_format": the export format it was
                    imported from, "hf" | "fla" | "remote", absent when trained here}
  params/          an orbax StandardCheckpointer save of the unboxed params pytree
  tokenizer.json   optional, copied in by `save_model`
`load_model` reads such a directory (written by launch/convert.py or exported from training),
or a training workdir: model.json + checkpoints/<step>/{state,data} (TrainCheckpointer).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import warnings
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from orthros_jax.config import ModelConfig
from orthros_jax.layers import lora

MODEL_JSON = "model.json"
PARAMS_DIR = "params"
TOKENIZER_JSON = "tokenizer.json"


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    cfg: ModelConfig
    params: Any
    tokenizer_file: str | None  # absolute path of a tokenizer.json, or None for bytes
    max_context: int | None = None  # trained / source context length (None: unknown)
    # The export format it was imported from ("hf", "fla", "remote"; None: trained here): a
    # plain export writes it back in that format.
    source_format: str | None = None

    def beyond_context(self, n_tokens: int) -> str | None:
        """A warning when a sequence of n_tokens is longer than the model's known context."""
        if not self.max_context or n_tokens <= self.max_context:
            return None
        return (
            f"{n_tokens} tokens are beyond the {self.max_context} this model was trained on or "
            "imported with (model.json max_context); its output there is untested"
        )


def write_model_json(
    directory: str,
    cfg: ModelConfig,
    tokenizer_file: str | None,
    max_context: int | None = None,
    source_format: str | None = None,
) -> None:
    """Writes model.json (and copies the tokenizer file next to it)."""
    os.makedirs(directory, exist_ok=True)
    tok = None
    if tokenizer_file:
        dest = os.path.join(directory, TOKENIZER_JSON)
        if os.path.abspath(tokenizer_file) != os.path.abspath(dest):
            shutil.copyfile(tokenizer_file, dest)
        tok = TOKENIZER_JSON
    with open(os.path.join(directory, MODEL_JSON), "w") as f:
        meta = {"model": cfg.to_dict(), "tokenizer": tok}
        if max_context:
            meta["max_context"] = int(max_context)
        if source_format:
            meta["source_format"] = source_format
        json.dump(meta, f, indent=2, sort_keys=True)


def read_model_meta(directory: str) -> dict[str, Any]:
    """The parsed model.json of a model directory or workdir."""
    path = os.path.join(directory, MODEL_JSON)
    if not os.path.isfile(path):
        raise ValueError(f"{directory!r} has no {MODEL_JSON}: not a model directory or workdir")
    with open(path) as f:
        return json.load(f)


def read_model_json(directory: str) -> tuple[ModelConfig, str | None]:
    meta = read_model_meta(directory)
    tok = meta.get("tokenizer")
    return ModelConfig.from_dict(meta["model"]), (os.path.join(directory, tok) if tok else None)


def save_model(
    directory: str,
    cfg: ModelConfig,
    params: Any,
    tokenizer_file: str | None = None,
    max_context: int | None = None,
    source_format: str | None = None,
) -> None:
    """Exports params + config (+ tokenizer, + the context length it was trained / imported
    with, + the format it was imported from) to a model directory that `load_model` reads."""
    directory = os.path.abspath(directory)
    write_model_json(directory, cfg, tokenizer_file, max_context, source_format)
    target = os.path.join(directory, PARAMS_DIR)
    if os.path.exists(target):
        shutil.rmtree(target)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(target, jax.device_get(params))


def load_model(directory: str, merge_lora: bool = True) -> LoadedModel:
    """Reads a model directory written by `save_model`, or a training workdir (params only, from
    its newest readable checkpoint); params come back as host numpy arrays. A model with LoRA
    adapters (cfg.lora) comes back merged into its base weights (cfg.lora None), unless
    merge_lora=False (un-merged serving, export of the adapters, continued LoRA training)."""
    loaded = _load_model(directory)
    if merge_lora and loaded.cfg.lora is not None:
        params, cfg = lora.merge(loaded.params, loaded.cfg)
        loaded = dataclasses.replace(loaded, cfg=cfg, params=jax.tree.map(np.asarray, params))
    return loaded


def _load_model(directory: str) -> LoadedModel:
    directory = os.path.abspath(directory)
    cfg, tok = read_model_json(directory)
    meta = read_model_meta(directory)
    max_context, source = meta.get("max_context"), meta.get("source_format")
    target = os.path.join(directory, PARAMS_DIR)
    if not os.path.isdir(target) and os.path.isdir(os.path.join(directory, CHECKPOINTS_DIR)):
        params = _restore_params_from_workdir(directory, cfg)
        return LoadedModel(cfg, params, tok, max_context, source)
    if not os.path.isdir(target):
        raise ValueError(
            f"{directory!r} has {MODEL_JSON} but neither {PARAMS_DIR}/ nor {CHECKPOINTS_DIR}/"
        )
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(target)
    params = jax.tree.map(np.asarray, params)
    return LoadedModel(cfg, params, tok, max_context, source)


# ---------------------------------------------------------------- training checkpoints

CHECKPOINTS_DIR = "checkpoints"
CORRUPT_DIR = "corrupt_checkpoints"
STATE_ITEM, DATA_ITEM, INTEGRITY_ITEM = "state", "data", "integrity"


def _leaf_checksum(x: jax.Array) -> jax.Array:
    """Sum of the leaf's raw bits as uint32, wrapping: exact and independent of the order of
    summation, so any sharding gives the same value and any changed element shows."""
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    else:
        width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
        bits = jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32)
    return jnp.sum(bits, dtype=jnp.uint32)


_checksums_jit = jax.jit(lambda leaves: [_leaf_checksum(x) for x in leaves])


def state_checksums(tree: Any) -> dict[str, int]:
    """{leaf path: uint32 bit-sum} of a pytree of (possibly sharded) arrays. Detects the
    silently garbled data files that orbax/tensorstore would otherwise restore as-is."""
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(tree)[0], strict=True)
    sums = jax.device_get(_checksums_jit(list(leaves)))
    return {jax.tree_util.keystr(p): int(v) for p, v in zip(paths, sums, strict=True)}


def _tree_shapes(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """{"params/layers/wq": (shape, dtype)} for every array-like leaf (arrays, ShapeDtypeStructs,
    orbax array metadata)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "/".join(
            str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path
        )
        out[name] = (tuple(leaf.shape), str(np.dtype(leaf.dtype)))
    return out


def check_same_shapes(expected: Any, found: Any, what: str) -> None:
    """Raises ValueError naming the first parameter whose shape differs (different model)."""
    want, have = _tree_shapes(expected), _tree_shapes(found)
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or extra:
        raise ValueError(
            f"{what} has a different structure than the config expects: missing {missing[:5]}, "
            f"unexpected {extra[:5]} (a different architecture or optimizer?)"
        )
    for name, (shape, _) in want.items():
        if have[name][0] != shape:
            raise ValueError(
                f"{what} was written for a different model shape: {name} is {have[name][0]} in "
                f"the checkpoint but {shape} for the current config"
            )


class TrainCheckpointer:
    """Orbax CheckpointManager over workdir/checkpoints: items "state" (a TrainState, saved
    with StandardSave) and "data" (the grain iterator's state). Async, keeps the last N.

    `restore_latest` walks back from the newest step: a checkpoint that fails to read is moved
    to workdir/corrupt_checkpoints/ with a warning and the previous one is tried; a readable
    checkpoint of a different model shape raises ValueError (never silently skipped).
    """

    def __init__(self, workdir: str, keep: int, async_save: bool = True) -> None:
        self.workdir = os.path.abspath(workdir)
        self.directory = os.path.join(self.workdir, CHECKPOINTS_DIR)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, data_iter: Any | None) -> None:
        """Starts saving; returns once device arrays are copied (the state may be donated)."""
        items = {
            STATE_ITEM: ocp.args.StandardSave(state),
            INTEGRITY_ITEM: ocp.args.JsonSave({"checksums": state_checksums(state)}),
        }
        if data_iter is not None:
            items[DATA_ITEM] = grain.checkpoint.CheckpointSave(data_iter)
        self.manager.save(step, args=ocp.args.Composite(**items), force=True)

    def restore_latest(self, abstract_state: Any, data_iter: Any | None) -> Any | None:
        """The newest readable state (arrays placed by abstract_state's shardings), also
        restoring data_iter in place; None when there is no checkpoint."""
        for step in sorted(self.manager.all_steps(), reverse=True):
            state_dir = os.path.join(self.directory, str(step), STATE_ITEM)
            try:
                found = _read_tree_metadata(state_dir)
            except Exception as e:  # noqa: BLE001 - any read failure means "unusable"
                self._quarantine(step, e)
                continue
            check_same_shapes(abstract_state, found, f"checkpoint step {step} in {self.directory}")
            items = {
                STATE_ITEM: ocp.args.StandardRestore(abstract_state),
                INTEGRITY_ITEM: ocp.args.JsonRestore(),
            }
            if data_iter is not None:
                items[DATA_ITEM] = grain.checkpoint.CheckpointRestore(data_iter)
            try:
                restored = self.manager.restore(step, args=ocp.args.Composite(**items))
                _verify(restored[STATE_ITEM], restored[INTEGRITY_ITEM]["checksums"])
            except Exception as e:  # noqa: BLE001
                self._quarantine(step, e)
                continue
            logging.info("restored checkpoint step %d from %s", step, self.directory)
            return restored[STATE_ITEM]
        return None

    def _quarantine(self, step: int, error: Exception) -> None:
        dest = os.path.join(self.workdir, CORRUPT_DIR, f"{step}")
        warnings.warn(
            f"checkpoint step {step} in {self.directory} is unreadable ({type(error).__name__}: "
            f"{str(error)[:300]}); moving it to {dest} and trying the previous one",
            stacklevel=2,
        )
        ocp.multihost.sync_global_processes(f"quarantine_{step}_start")
        if jax.process_index() == 0:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.exists(dest):
                shutil.rmtree(dest)
            shutil.move(os.path.join(self.directory, str(step)), dest)
        ocp.multihost.sync_global_processes(f"quarantine_{step}_done")
        self.manager.reload()

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _verify(state: Any, saved: dict[str, int]) -> None:
    found = state_checksums(state)
    bad = [k for k in saved if found.get(k) != saved[k]]
    if bad or set(found) != set(saved):
        raise ValueError(f"checksum mismatch in {bad[:5] or 'the tree structure'}")


def _read_tree_metadata(item_dir: str) -> Any:
    """The saved pytree's array metadata (shapes/dtypes) without reading the arrays."""
    meta = ocp.PyTreeCheckpointHandler().metadata(epath.Path(item_dir))
    tree = getattr(meta, "tree", meta)
    if tree is None:
        raise ValueError(f"{item_dir} has no pytree metadata")
    return tree


def _restore_params_from_workdir(workdir: str, cfg: ModelConfig) -> Any:
    """Params only (partial restore, no optimizer state) of the newest readable checkpoint."""
    from orthros_jax.model import init_params  # local: model imports nothing from here

    directory = os.path.join(workdir, CHECKPOINTS_DIR)
    steps = sorted((int(d) for d in os.listdir(directory) if d.isdigit()), reverse=True)
    abstract = jax.eval_shape(lambda r: init_params(cfg, r), jax.random.PRNGKey(0))
    target = {"params": jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), abstract)}
    for step in steps:
        state_dir = os.path.join(directory, str(step), STATE_ITEM)
        try:
            found = _read_tree_metadata(state_dir)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"skipping unreadable checkpoint {state_dir}: {e}", stacklevel=2)
            continue
        check_same_shapes(abstract, found["params"], f"checkpoint {state_dir}")
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
        try:
            with ocp.PyTreeCheckpointer() as ckptr:
                out = ckptr.restore(
                    state_dir,
                    args=ocp.args.PyTreeRestore(
                        item=target, restore_args=restore_args, partial_restore=True
                    ),
                )
            integrity = os.path.join(directory, str(step), INTEGRITY_ITEM, "metadata")
            if os.path.isfile(integrity):
                with open(integrity) as f:
                    saved = json.load(f)["checksums"]
                prefix = jax.tree_util.keystr((jax.tree_util.GetAttrKey("params"),))
                _verify(
                    out["params"],
                    {k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)},
                )
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"skipping unreadable checkpoint {state_dir}: {e}", stacklevel=2)
            continue
        return out["params"]
    raise ValueError(f"{directory} has no readable checkpoint (steps tried: {steps})")
