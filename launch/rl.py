"""GRPO post-training (or resume) from a config file; rollouts from the serving engine.

    python launch/rl.py --config=configs/rl_passkey.py:runs/rl_warm_orthros --workdir=runs/rl
    python launch/rl.py --config=configs/rl_arithmetic.py --config.grpo.kl_coef=0.02 ...

Everything is written inside --workdir (checkpoints/, tensorboard/, metrics.jsonl, model.json);
rerunning with a workdir that has checkpoints resumes bit-for-bit from the newest one. The
workdir is a model directory of the policy for launch/generate.py and launch/serve.py.
"""

from __future__ import annotations

from absl import app, flags, logging

from orthros_jax.config import cli
from orthros_jax.rl import RewardError, RLConfig, run

_CONFIG = cli.define_config_flag("configs/rl_passkey.py", "RL config file (get_config()).", "rl.py")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it exists).")
flags.mark_flag_as_required("workdir")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    try:
        run(RLConfig.from_config(_CONFIG.value), _WORKDIR.value)
    except (ValueError, RewardError) as e:  # user-facing errors: the message, no traceback
        raise SystemExit(f"rl.py: {e}") from None


if __name__ == "__main__":
    cli.run(main, "rl.py")
