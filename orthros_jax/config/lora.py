"""The options of the LoRA adapters (ModelConfig.lora; None: the model has none).

A frozen dataclass checked on construction; which projections may carry an adapter is the
layer kinds' declaration (kind.ParamDecl.adapter_in), checked against `targets` by
layers/registry.validate. Every error is a
one-line ValueError naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from orthros_jax.config.options import OptionGroup, check_positive_int


@dataclasses.dataclass(frozen=True)
class LoRAOptions(OptionGroup):
    """rank r and alpha (the adapter adds (alpha / r) A @ B to each target projection W),
    dropout (training only: each of the r rank components of a layer's adapter dropped with
    this probability per step, the rest scaled by 1 / (1 - dropout); see docs/lora.md for why
    not peft's input dropout), targets (the names of the declared projections that get an
    adapter, e.g. ("wq", "wv"); (): every projection the model's kinds declare)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ()
    # Options that change how the model trains, not what its weights compute (a resumed run
    # may change them: ModelConfig.runtime_keys).
    RUNTIME_FIELDS: ClassVar[tuple[str, ...]] = ("dropout",)

    def __post_init__(self) -> None:
        if isinstance(self.targets, list | str):
            targets = (self.targets,) if isinstance(self.targets, str) else self.targets
            object.__setattr__(self, "targets", tuple(targets))
        check_positive_int("ModelConfig.lora.rank", self.rank)
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
            raise ValueError(f"ModelConfig.lora.alpha must be a number > 0, got {alpha!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"ModelConfig.lora.dropout must be in [0, 1), got {self.dropout!r}")
        if not all(isinstance(t, str) and t for t in self.targets):
            raise ValueError(
                f"ModelConfig.lora.targets must be parameter names, got {self.targets!r}"
            )

    @property
    def scale(self) -> float:
        """alpha / rank: the factor of the adapter's product."""
        return self.alpha / self.rank
