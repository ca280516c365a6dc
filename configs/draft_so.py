"""Issue 35 item 2: train the draft scale-offsets of a trained tiny_pt.py model by distillation.

    python launch/train.py --config=configs/tiny_pt.py --workdir=runs/tiny
    python launch/train.py --config=configs/draft_so.py \
        --config.init_from=runs/tiny --workdir=runs/tiny_draft_so

The model is tiny_pt.py's with model.draft_scale_offset=True: a third query SO per layer that
only a self-speculative draft step's windowed output copy reads (docs/speculative.md). They
start as copies of the output stream's SO (so the untrained draft is the plain windowed draft)
and are the only trained parameters (train.trainable selects them by path; every other weight
is frozen and gets no optimizer state). The loss is the KL from the output stream (stop-gradient
teacher) to the draft at train.distill_draft_window keys (= the base window w here), on
tiny_pt.py's PT batches. The argument `:<window>` sets that window (default 64 = w).

Another base model's draft SO: `:<window>,<base>` takes the model and batches from
configs/<base>.py instead (an empty window is the base's w), e.g. the bench-shape model's:

    python launch/train.py --config=configs/draft_so.py:128,spec_bench \
        --config.init_from=runs/spec_bench --config.train.steps=60 --workdir=runs/spec_bench_draft_so
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file


def get_config(arg: str = "64") -> ml_collections.ConfigDict:
    window, _, base = arg.partition(",")
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, f"{base or 'tiny_pt'}.py")
    if not os.path.isfile(path):
        raise ValueError(f"configs/draft_so.py: base config {path!r} does not exist")
    c = load_config_file(path)
    c.model.draft_scale_offset = True
    c.train.trainable = r"/so_draft_(scale|offset)$"
    c.train.distill_draft_window = int(window) if window else c.model.window
    c.train.steps = 150
    c.train.eval_every = 50
    c.train.checkpoint_every = 50
    # A few thousand vectors: a larger lr than the full run's; the SO are never decayed.
    c.optimizer.lr = 1e-2
    c.optimizer.warmup_steps = 10
    return c
