"""RL post-training: GRPO / GSPO with rollouts from the serving engine and SFT-shaped updates.

    state = run(RLConfig.from_config(config), workdir)     # launch/rl.py

config.py (the frozen config), tasks.py (verifiable tasks and rewards, plug-ins),
rollout.py (the engine as the sampler), batch.py (advantages, the packed SFT-shaped batch),
loss.py (the objective and its update step), loop.py (the run: resumable bit-for-bit).
"""

from orthros_jax.rl.config import GRPOConfig, LossNorm, Ratio, RLConfig, RolloutConfig, TaskConfig
from orthros_jax.rl.loop import run
from orthros_jax.rl.tasks import TASKS, RewardError

__all__ = [
    "GRPOConfig",
    "LossNorm",
    "RLConfig",
    "Ratio",
    "RewardError",
    "RolloutConfig",
    "TASKS",
    "TaskConfig",
    "run",
]
