"""The options of the mixture-of-experts FFN (ModelConfig.moe; None: every FFN is dense SwiGLU).

A frozen dataclass checked on construction; ModelConfig checks what depends on the rest of the
config (ModelConfig._check_moe), the registry (layers/registry.validate) what needs the FFN
choices and the layer kinds. Every error is a one-line ValueError naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from orthros_jax.config.kinds import MOE_FFN
from orthros_jax.config.options import OptionGroup, check_choice, check_positive_int

PAIRED, INDEPENDENT = "paired", "independent"
ROUTINGS: tuple[str, ...] = (PAIRED, INDEPENDENT)
MOE_IMPLS: tuple[str, ...] = ("grouped", "dense")  # kernels/moe.py's two implementations
# The default ffn_cycle: every layer's FFN the routed mixture (a name of layers/ffn.FFNS).
ROUTED_CYCLE: tuple[str, ...] = (MOE_FFN,)


def dense_equivalent_d_expert(d_ff: int, top_k: int) -> int:
    """The expert width I at which top_k experts hold a dense SwiGLU of width d_ff's parameters
    (k x 3 D I = 3 D d_ff: equal active FFN parameters, the router's D x E aside)."""
    check_positive_int("ModelConfig.moe.top_k", top_k)
    if d_ff % top_k:
        raise ValueError(
            f"ModelConfig.moe.top_k={top_k} must divide d_ff={d_ff} for experts of equal active "
            "parameters"
        )
    return d_ff // top_k


@dataclasses.dataclass(frozen=True)
class MoEOptions(OptionGroup):
    """n_experts E, top_k K experts per token, d_expert I (each expert's SwiGLU width: HF's
    moe_intermediate_size), norm_topk_prob (renormalise the k gates to sum 1), shared_expert
    (width of an always-on SwiGLU scaled by sigmoid(Linear D -> 1), Qwen3.5-MoE; 0: none),
    routing ("paired": an output copy uses its base token's experts, the default of the
    two-stream arms; "independent": each copy routes itself; None: the arm's default),
    impl (the experts' kernel: "grouped" ragged_dot or the "dense" reference), ffn_cycle (the
    FFN choice of each layer of the model's cycle, a name of layers/ffn.FFNS, repeated like
    layer_types; by default every layer the routed one),
    aux_loss_coef (transformers' load-balancing loss, router_aux_loss_coef) and z_loss_coef
    (the router z-loss), both added to the training loss."""

    n_experts: int = 8
    top_k: int = 2
    d_expert: int = 128
    norm_topk_prob: bool = True
    shared_expert: int = 0
    routing: str | None = None
    impl: str = "grouped"
    ffn_cycle: tuple[str, ...] = ROUTED_CYCLE
    aux_loss_coef: float = 0.0
    z_loss_coef: float = 0.0
    # Options that change how the model runs or trains, not what its weights compute (a resumed
    # run may change them: ModelConfig.runtime_keys): the experts' kernel, the loss coefficients.
    RUNTIME_FIELDS: ClassVar[tuple[str, ...]] = ("impl", "aux_loss_coef", "z_loss_coef")

    def __post_init__(self) -> None:
        if isinstance(self.ffn_cycle, list):
            object.__setattr__(self, "ffn_cycle", tuple(self.ffn_cycle))
        for name in ("n_experts", "top_k", "d_expert"):
            check_positive_int(f"ModelConfig.moe.{name}", getattr(self, name))
        if self.top_k > self.n_experts:
            raise ValueError(
                f"ModelConfig.moe.top_k={self.top_k} must be <= n_experts={self.n_experts}"
            )
        if not isinstance(self.shared_expert, int) or self.shared_expert < 0:
            raise ValueError(
                f"ModelConfig.moe.shared_expert must be an int >= 0 (0: none), "
                f"got {self.shared_expert!r}"
            )
        if self.routing is not None and self.routing not in ROUTINGS:
            raise ValueError(
                f"ModelConfig.moe.routing={self.routing!r} is unknown; allowed: "
                f"{', '.join(ROUTINGS)} (or None: the arm's default)"
            )
        check_choice("ModelConfig.moe.impl", self.impl, MOE_IMPLS)
        if not self.ffn_cycle or not all(isinstance(f, str) for f in self.ffn_cycle):
            raise ValueError(
                f"ModelConfig.moe.ffn_cycle={self.ffn_cycle!r}: a non-empty cycle of FFN choices"
            )
        for name in ("aux_loss_coef", "z_loss_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"ModelConfig.moe.{name} must be a number >= 0, got {value!r}")

    def resolved_routing(self, two_streams: bool) -> str:
        """The routing of the output copies (ValueError: paired on a single-stream arm)."""
        if self.routing == "paired" and not two_streams:
            raise ValueError(
                "ModelConfig.moe.routing='paired' needs a two-stream architecture (orthros): a "
                "single-stream arm has no output copies to pair; use None or 'independent'"
            )
        return self.routing or ("paired" if two_streams else "independent")

    def layer_cycle(self, layer_types: tuple[str, ...], n_layers: int) -> tuple[str, ...]:
        """layer_types repeated to the least common multiple of its and ffn_cycle's lengths
        (one cycle of both), which must divide n_layers."""
        n = math.lcm(len(layer_types), len(self.ffn_cycle))
        if n_layers % n:
            raise ValueError(
                f"ModelConfig.moe.ffn_cycle={self.ffn_cycle!r} and layer_types="
                f"{layer_types!r} repeat every {n} layers, which must divide n_layers={n_layers}"
            )
        return layer_types * (n // len(layer_types))

    def ffn_types(self, n: int) -> tuple[str, ...]:
        """The FFN choice of each of the n positions of a layer cycle."""
        return tuple(self.ffn_cycle[j % len(self.ffn_cycle)] for j in range(n))

    def replace(self, **changes: Any) -> MoEOptions:
        return dataclasses.replace(self, **changes)
