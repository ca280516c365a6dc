"""Which parameters a run trains (train.trainable), and the frozen rest kept out of the update.

  all           every parameter (the default; what training did before)
  scale_offset  the scale-offset vectors only (kind.Role.SCALE_OFFSET): the cheapest conversion
  lora          the LoRA adapters (ModelConfig.lora; kind.Role.ADAPTER) and the scale-offsets
  <regex>       the parameters whose path ("layers/wq", "embedding") re.search matches

The roles come from the parameters' declarations (model.param_decls), so nothing here names a
parameter. The update sees the trainable parameters only: `split` puts None at the frozen
leaves (an empty subtree to jax and optax), so the optimizer holds no state for them, the
gradient is taken with respect to the trainable ones only (XLA drops the frozen weights'
gradient products), and `join` puts the untouched frozen leaves back.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax
import optax

from orthros_jax.config import ModelConfig
from orthros_jax.layers.kind import Role
from orthros_jax.model import param_decls

ALL, SCALE_OFFSET, LORA = "all", "scale_offset", "lora"
MODES = (ALL, SCALE_OFFSET, LORA)


def _path(path: Any) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in path)


@dataclasses.dataclass(frozen=True)
class Trainable:
    """The trainable subset of `model`'s parameters chosen by `spec` (a mode of MODES or a
    regex); built by `trainable_subset`, which checks the spec first."""

    model: ModelConfig
    spec: str

    @property
    def everything(self) -> bool:
        return self.spec == ALL

    def selects(self, path: str, role: Role) -> bool:
        if self.spec == ALL:
            return True
        if self.spec == SCALE_OFFSET:
            return role is Role.SCALE_OFFSET
        if self.spec == LORA:
            return role in (Role.SCALE_OFFSET, Role.ADAPTER)
        return re.search(self.spec, path) is not None

    def paths(self) -> list[str]:
        """The trainable parameters' paths, in tree order."""
        decls = param_decls(self.model)
        leaves = jax.tree_util.tree_leaves_with_path(decls, is_leaf=_is_decl)
        return [_path(p) for p, d in leaves if self.selects(_path(p), d.role)]

    def mask(self, params: Any) -> Any:
        """params -> the tree of bools, True where the parameter trains."""
        chosen = set(self.paths())
        return jax.tree_util.tree_map_with_path(lambda p, _: _path(p) in chosen, params)

    def split(self, params: Any) -> tuple[Any, Any]:
        """(trainable, frozen): params with None at the frozen / the trainable leaves."""
        if self.everything:
            return params, jax.tree.map(lambda _: None, params)
        mask = self.mask(params)
        pick = lambda keep: jax.tree.map(lambda p, m: p if m == keep else None, params, mask)
        return pick(True), pick(False)

    def join(self, trainable: Any, frozen: Any) -> Any:
        """The full params from `split`'s two halves."""
        return jax.tree.map(
            lambda t, f: f if t is None else t, trainable, frozen, is_leaf=lambda x: x is None
        )

    def value_and_grad(self, fn: Callable[[Any], tuple[jax.Array, Any]], params: Any) -> Any:
        """((value, aux), grads) of fn(params) -> (value, aux), the gradient with respect to
        the trainable parameters only (None at the frozen ones)."""
        trained, frozen = self.split(params)
        return jax.value_and_grad(lambda t: fn(self.join(t, frozen)), has_aux=True)(trained)

    def update(
        self, tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any
    ) -> tuple[Any, Any]:
        """(params, opt_state) after one optimizer step on the trainable parameters."""
        trained, frozen = self.split(params)
        updates, opt_state = tx.update(grads, opt_state, trained)
        return self.join(optax.apply_updates(trained, updates), frozen), opt_state


def _is_decl(x: Any) -> bool:
    return hasattr(x, "role") and hasattr(x, "shape")


def trainable_subset(model: ModelConfig, spec: str) -> Trainable:
    """The checked Trainable: ValueError naming train.trainable when the spec selects nothing
    (a model without scale-offsets or adapters, a regex matching no path) or is no regex."""
    if spec not in MODES:
        try:
            re.compile(spec)
        except re.error as e:
            raise ValueError(
                f"train.trainable={spec!r} is neither one of {', '.join(MODES)} nor a regex: {e}"
            ) from None
    if spec == LORA and model.lora is None:
        raise ValueError("train.trainable='lora' needs model.lora (the adapters' options)")
    t = Trainable(model, spec)
    if not t.paths():
        raise ValueError(
            f"train.trainable={spec!r} selects no parameter of this model "
            f"({model.architecture}, scale_offset={model.scale_offset}, lora={model.lora})"
        )
    return t
