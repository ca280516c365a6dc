"""The frozen dataclasses a GRPO run reads (built once from the ml_collections config).

Config file layout (configs/rl_*.py, `get_config()`):
  model        ModelConfig fields (read from init_from's model.json when starting from a run)
  task         TaskConfig: the verifiable task (prompts and their reward)
  rollout      RolloutConfig: how the serving engine samples the group of each prompt
  grpo         GRPOConfig: advantages, the clipped ratio, KL, normalisation
  optimizer    training.OptimizerConfig
  train        training.LoopConfig (steps, logging, checkpointing; eval_every = reward evals)
  mesh         training.MeshConfig
  init_from    None or a model directory / training workdir (policy and reference start there)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import dataclass_from_dict, to_plain
from orthros_jax.config.options import check_choice, check_positive, check_positive_int
from orthros_jax.training.config import LoopConfig, MeshConfig, OptimizerConfig


class LossNorm(enum.Enum):
    """How token terms become the loss. TOKEN: the mean over every completion token of the
    batch (DAPO / Dr. GRPO: long completions weigh by their length); SEQUENCE: each
    completion's mean, then the mean over completions (the original GRPO)."""

    TOKEN = "token"
    SEQUENCE = "sequence"


class Ratio(enum.Enum):
    """The importance ratio. TOKEN: per token, pi / pi_old (GRPO); SEQUENCE: per completion,
    exp(mean over its tokens of log pi - log pi_old), clipped per sequence (GSPO)."""

    TOKEN = "token"
    SEQUENCE = "sequence"


def _enum(section: str, name: str, value: Any, cls: type[enum.Enum]) -> enum.Enum:
    if isinstance(value, cls):
        return value
    check_choice(f"{section}.{name}", value, [m.value for m in cls])
    return cls(value)


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """name: a task of rl.tasks.TASKS (passkey, mqar, arithmetic). context_len: prompt +
    answer tokens of the recall tasks; digits: the passkey's or the operands' digits; pairs /
    queries / gap: MQAR's (one query is asked: the last); filler: recall filler (fixed,
    pydoc); eval_prompts: held-out prompts of the reward evaluation (greedy); tokenizer: a
    tokenizer.json (None: bytes)."""

    name: str = "passkey"
    context_len: int = 128
    digits: int = 2
    pairs: int = 4
    queries: int = 1
    gap: int = 32
    filler: str = "fixed"
    eval_prompts: int = 32
    tokenizer: str | None = None  # a tokenizer.json; None: bytes

    def __post_init__(self) -> None:
        for name in ("context_len", "digits", "pairs", "queries", "gap", "eval_prompts"):
            check_positive_int(f"task.{name}", getattr(self, name))


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """prompts: prompts per RL step; group_size: completions sampled per prompt (>= 2: the
    advantage is relative to the group); max_new_tokens; temperature (> 0: the policy is
    softmax(logits / temperature), which the engine samples from and whose log-probs it
    returns, so the update needs no second pass for the old policy); max_batch / max_len:
    the engine's slots and their cache positions."""

    prompts: int = 8
    group_size: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    max_batch: int = 16
    max_len: int = 256

    def __post_init__(self) -> None:
        for name in ("prompts", "max_new_tokens", "max_batch", "max_len"):
            check_positive_int(f"rollout.{name}", getattr(self, name))
        if not isinstance(self.group_size, int) or self.group_size < 2:
            raise ValueError(
                f"rollout.group_size must be an int >= 2 (GRPO's advantage is relative to the "
                f"other samples of the same prompt; 1 gives no advantage), got {self.group_size!r}"
            )
        check_positive("rollout.temperature", self.temperature)


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """clip_low / clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high]
    (DAPO's asymmetric clip; equal = PPO's); kl_coef: weight of the k3 estimate of
    KL(pi || pi_ref) to the frozen reference (0: no reference pass); scale_rewards: divide
    the group-centred reward by the group's std (GRPO) or not (Dr. GRPO); loss_norm, ratio:
    LossNorm / Ratio values; rows / seq_len / out_len: the update batch, prompt + completion
    pairs packed first-fit into rows of seq_len tokens with out_len output copies."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    scale_rewards: bool = True
    loss_norm: Any = "token"
    ratio: Any = "token"
    rows: int = 16
    seq_len: int = 256
    out_len: int = 64

    def __post_init__(self) -> None:
        for name in ("rows", "seq_len", "out_len"):
            check_positive_int(f"grpo.{name}", getattr(self, name))
        for name in ("clip_low", "clip_high", "kl_coef"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"grpo.{name} must be >= 0, got {getattr(self, name)!r}")
        object.__setattr__(self, "loss_norm", _enum("grpo", "loss_norm", self.loss_norm, LossNorm))
        object.__setattr__(self, "ratio", _enum("grpo", "ratio", self.ratio, Ratio))


@dataclasses.dataclass(frozen=True)
class RLConfig:
    model: ModelConfig
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    grpo: GRPOConfig = GRPOConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: LoopConfig = LoopConfig()
    mesh: MeshConfig = MeshConfig()
    init_from: str | None = None

    def __post_init__(self) -> None:
        r, g = self.rollout, self.grpo
        if r.max_batch < r.group_size:
            raise ValueError(
                f"rollout.max_batch={r.max_batch} must hold one group "
                f"(rollout.group_size={r.group_size})"
            )
        if g.out_len < r.max_new_tokens:
            raise ValueError(
                f"grpo.out_len={g.out_len} must be >= rollout.max_new_tokens={r.max_new_tokens} "
                "(a completion's output copies share one row)"
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RLConfig:
        """Every section from a (locked) ml_collections config; unknown keys fail by name."""
        plain = to_plain(config)
        sections = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(plain) - set(sections))
        if unknown:
            raise ValueError(f"unknown top-level config key(s) {unknown}; valid: {sections}")
        kinds = {
            "task": TaskConfig,
            "rollout": RolloutConfig,
            "grpo": GRPOConfig,
            "optimizer": OptimizerConfig,
            "train": LoopConfig,
            "mesh": MeshConfig,
        }
        missing = sorted(set(sections) - set(plain))
        if missing:
            raise ValueError(f"config is missing section(s) {missing}; every section is required")
        parts: dict[str, Any] = {k: dataclass_from_dict(c, plain[k], k) for k, c in kinds.items()}
        return cls(
            model=ModelConfig.from_dict(plain["model"]),
            init_from=plain["init_from"] or None,
            **parts,
        )
