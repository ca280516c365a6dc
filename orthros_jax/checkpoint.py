"""Checkpoints: exported model directories (config + params [+ tokenizer]).

A model directory holds
  model.json       {"model": ModelConfig fields, "tokenizer": "tokenizer.json" | null}
  params/          an orbax StandardCheckpointer save of the unboxed params pytree
  tokenizer.json   optional, copied in by `save_model`
`load_model` reads such a directory (written by launch/convert.py or exported from training).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from orthros_jax.config import ModelConfig

MODEL_JSON = "model.json"
PARAMS_DIR = "params"
TOKENIZER_JSON = "tokenizer.json"


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    cfg: ModelConfig
    params: Any
    tokenizer_file: str | None  # absolute path of a tokenizer.json, or None for bytes


def write_model_json(directory: str, cfg: ModelConfig, tokenizer_file: str | None) -> None:
    """Writes model.json (and copies the tokenizer file next to it)."""
    os.makedirs(directory, exist_ok=True)
    tok = None
    if tokenizer_file:
        dest = os.path.join(directory, TOKENIZER_JSON)
        if os.path.abspath(tokenizer_file) != os.path.abspath(dest):
            shutil.copyfile(tokenizer_file, dest)
        tok = TOKENIZER_JSON
    with open(os.path.join(directory, MODEL_JSON), "w") as f:
        json.dump({"model": cfg.to_dict(), "tokenizer": tok}, f, indent=2, sort_keys=True)


def read_model_json(directory: str) -> tuple[ModelConfig, str | None]:
    path = os.path.join(directory, MODEL_JSON)
    if not os.path.isfile(path):
        raise ValueError(f"{directory!r} has no {MODEL_JSON}: not a model directory or workdir")
    with open(path) as f:
        meta = json.load(f)
    tok = meta.get("tokenizer")
    return ModelConfig.from_dict(meta["model"]), (os.path.join(directory, tok) if tok else None)


def save_model(
    directory: str, cfg: ModelConfig, params: Any, tokenizer_file: str | None = None
) -> None:
    """Exports params + config (+ tokenizer) to a model directory that `load_model` reads."""
    directory = os.path.abspath(directory)
    write_model_json(directory, cfg, tokenizer_file)
    target = os.path.join(directory, PARAMS_DIR)
    if os.path.exists(target):
        shutil.rmtree(target)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(target, jax.device_get(params))


def load_model(directory: str) -> LoadedModel:
    """Reads a model directory written by `save_model`; params come back as host numpy arrays."""
    directory = os.path.abspath(directory)
    cfg, tok = read_model_json(directory)
    target = os.path.join(directory, PARAMS_DIR)
    if not os.path.isdir(target):
        raise ValueError(f"{directory!r} has {MODEL_JSON} but no {PARAMS_DIR}/ checkpoint")
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(target)
    params = jax.tree.map(np.asarray, params)
    return LoadedModel(cfg, params, tok)
