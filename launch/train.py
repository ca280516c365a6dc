"""Train (or resume) an Orthros model from a config file.

    python launch/train.py --config=configs/tiny_pt.py --workdir=runs/tiny
    python launch/train.py --config=configs/tiny_pt.py --config.optimizer.lr=1e-3 \
        --config.train.steps=100 --workdir=runs/tiny_lr

Everything is written inside --workdir (checkpoints/, tensorboard/, metrics.jsonl, model.json);
rerunning with a workdir that has checkpoints resumes from the newest good one. The workdir is
also a model directory for launch/generate.py. Multi-host: set --config.distributed.* (or run
where jax.distributed auto-detects) and start the same command on every host.
"""

from __future__ import annotations

from absl import app, flags, logging

from orthros_jax.config import cli
from orthros_jax.training import NonFiniteLossError, TrainConfig, train

_CONFIG = cli.define_config_flag(
    "configs/tiny_pt.py", "Training config file (get_config()).", "train.py"
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it exists).")
flags.mark_flag_as_required("workdir")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        # Orbax logs every file it renames at INFO; default to warnings (--verbosity=0: all).
        logging.set_verbosity(logging.WARNING)
    try:
        cfg = TrainConfig.from_config(_CONFIG.value)
        logging.info("config:\n%s", _CONFIG.value)
        train(cfg, _WORKDIR.value)
    except (ValueError, NonFiniteLossError) as e:  # user-facing errors: the message, no traceback
        raise SystemExit(f"train.py: {e}") from None


if __name__ == "__main__":
    cli.run(main, "train.py")
