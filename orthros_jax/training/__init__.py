"""Training: TrainState, PT/SFT losses, AdamW schedule, jitted steps and the loop.

from orthros_jax import training
cfg = training.TrainConfig.from_config(config)   # ml_collections -> frozen dataclasses
state = training.train(cfg, workdir)             # init or resume, eval, checkpoints
"""

from orthros_jax.training.config import (
    DistributedConfig,
    LoopConfig,
    MeshConfig,
    OptimizerConfig,
    TrainConfig,
)
from orthros_jax.training.loop import NonFiniteLossError, train
from orthros_jax.training.losses import masked_cross_entropy, mean_loss, pt_loss, sft_loss
from orthros_jax.training.optimizer import make_optimizer, make_schedule, weight_decay_mask
from orthros_jax.training.state import TrainState, init_train_state
from orthros_jax.training.steps import make_eval_step, make_train_step

__all__ = [
    "DistributedConfig",
    "LoopConfig",
    "MeshConfig",
    "NonFiniteLossError",
    "OptimizerConfig",
    "TrainConfig",
    "TrainState",
    "init_train_state",
    "make_eval_step",
    "make_optimizer",
    "make_schedule",
    "make_train_step",
    "masked_cross_entropy",
    "mean_loss",
    "pt_loss",
    "sft_loss",
    "train",
    "weight_decay_mask",
]
