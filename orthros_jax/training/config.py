"""The frozen dataclasses a training run reads (built from the ml_collections config once).

Config file layout (configs/*.py, `get_config()`):
  model        ModelConfig fields
  data         orthros_jax.data.DataConfig fields
  optimizer    OptimizerConfig
  train        LoopConfig (steps, logging, eval, checkpointing)
  mesh         MeshConfig  (data, fsdp, tensor, expert; -1 = all remaining devices)
  distributed  DistributedConfig (jax.distributed.initialize arguments)
  init_from    None or a model directory / training workdir readable by checkpoint.load_model
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import dataclass_from_dict, to_plain

if TYPE_CHECKING:  # imported where a config is read: the data package is heavy
    from orthros_jax.data.config import DataConfig


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with linear warmup then cosine decay to lr * min_lr_ratio at the last step."""

    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # global-norm clipping threshold; <= 0 disables
    grad_accum_steps: int = 1  # micro-batches per optimizer update (optax.MultiSteps)

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optimizer.lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optimizer.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps < 0:
            raise ValueError(f"optimizer.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.grad_accum_steps < 1:
            raise ValueError(
                f"optimizer.grad_accum_steps must be >= 1, got {self.grad_accum_steps}"
            )


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Steps count optimizer updates (each = grad_accum_steps micro-batches)."""

    steps: int = 1000
    seed: int = 0
    log_every: int = 10
    eval_every: int = 100  # 0 disables periodic eval (a final eval still runs)
    eval_batches: int = 8
    checkpoint_every: int = 100  # 0 disables periodic checkpoints (the final one is still saved)
    keep_checkpoints: int = 3
    async_checkpointing: bool = True
    # Writes workdir/data_fingerprints.jsonl: a crc32 of every batch's tokens (data-order audit).
    data_fingerprints: bool = False
    progress_bar: bool = True
    # Positions per chunk of the cross-entropy (training/losses.py): -1 = auto (1024 when
    # model.vocab_size >= 32000, else the full logits), 0 = the full [B, T, V] logits, N > 0 =
    # chunks of N positions whose logits are recomputed in the backward pass.
    loss_chunk: int = -1
    # Optimizer steps to trace with jax.profiler into workdir/profile/: () none, (n,) step n,
    # (first, last) steps first..last.
    profile_steps: tuple[int, ...] = ()
    # What trains (training/trainable.py): "all", "scale_offset" (the SO vectors only), "lora"
    # (model.lora's adapters and the SO vectors) or a regex over parameter paths ("layers/wq").
    # The frozen rest gets no optimizer state; a resumed run must keep it (start.py).
    trainable: str = "all"
    # > 0: the loss is the draft distillation's KL (training/losses.draft_kl_sums): output copies
    # reading only their last distill_draft_window keys, with model.draft_scale_offset's SO,
    # towards the full output stream (configs/draft_so.py). 0: the LM loss.
    distill_draft_window: int = 0

    def __post_init__(self) -> None:
        steps = tuple(self.profile_steps)
        if len(steps) > 2 or not all(1 <= s for s in steps) or steps != tuple(sorted(steps)):
            raise ValueError(
                "train.profile_steps must be (), (step,) or (first, last) with "
                f"1 <= first <= last, got {self.profile_steps}"
            )
        if self.loss_chunk < -1:
            raise ValueError(
                f"train.loss_chunk must be -1 (auto), 0 (full logits) or > 0, got {self.loss_chunk}"
            )
        for name in ("steps", "log_every", "eval_batches", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "checkpoint_every", "distill_draft_window"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh sizes over ("data", "fsdp", "tensor", "expert"); one of them may be -1 (the
    rest). expert > 1: expert parallelism (a MoE model's experts split over it, batch rows
    too)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """Multi-host start-up. With initialize=True, jax.distributed.initialize is called with the
    given coordinator/num_processes/process_id (empty/-1 = let JAX auto-detect, e.g. on TPU)."""

    initialize: bool = False
    coordinator_address: str = ""
    num_processes: int = -1
    process_id: int = -1


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig
    data: DataConfig | None  # None when a caller supplies its own iterators
    optimizer: OptimizerConfig = OptimizerConfig()
    train: LoopConfig = LoopConfig()
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedConfig = DistributedConfig()
    init_from: str | None = None

    def __post_init__(self) -> None:
        if self.train.distill_draft_window and not self.model.draft_scale_offset:
            raise ValueError(
                "train.distill_draft_window > 0 needs model.draft_scale_offset=True (it trains it)"
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TrainConfig:
        """Builds every section from a (locked) ml_collections config; unknown keys fail."""
        from orthros_jax import data as data_lib  # the data package owns DataConfig

        plain = to_plain(config)
        sections = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(plain) - set(sections))
        if unknown:
            raise ValueError(f"unknown top-level config key(s) {unknown}; valid: {sections}")
        return cls(
            model=ModelConfig.from_dict(plain["model"]),
            data=data_lib.DataConfig.from_dict(plain["data"]),
            optimizer=dataclass_from_dict(OptimizerConfig, plain["optimizer"], "optimizer"),
            train=dataclass_from_dict(LoopConfig, plain["train"], "train"),
            mesh=dataclass_from_dict(MeshConfig, plain["mesh"], "mesh"),
            distributed=dataclass_from_dict(DistributedConfig, plain["distributed"], "distributed"),
            init_from=plain["init_from"] or None,
        )
