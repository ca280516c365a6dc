"""Config files: every file in configs/ loads, every section builds, the paper's recipes have the
paper's numbers, overrides of unknown keys fail listing the valid ones, and tiny_sft runs through
the loop."""

from __future__ import annotations

import dataclasses
import json
import os

import ml_collections
import pytest
from helpers import tiny_config
from training_helpers import REPO, TINY_FLAGS, run_train

from orthros_jax import checkpoint
from orthros_jax.config import ModelConfig, cli
from orthros_jax.data import DataConfig
from orthros_jax.model import num_params
from orthros_jax.training import TrainConfig
from orthros_jax.training.config import LoopConfig, OptimizerConfig


def _load(spec: str):
    return cli.load_config_file(os.path.join(REPO, "configs", spec))


def _sections(c):
    """Builds every section; the data section's files (corpus, tokenizer) may not exist here."""
    model = ModelConfig.from_dict(c.model)
    opt = cli.dataclass_from_dict(OptimizerConfig, c.optimizer, "optimizer")
    loop = cli.dataclass_from_dict(LoopConfig, c.train, "train")
    data = DataConfig.from_dict({**cli.to_plain(c.data), "tokenizer": None})
    assert set(c.keys()) == {f.name for f in dataclasses.fields(TrainConfig)}
    return model, data, opt, loop


@pytest.mark.parametrize(
    "name", sorted(f for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".py"))
)
def test_every_config_file_loads(name, tmp_path):
    """Every file in configs/ (the bench configs too) loads as the docs' commands load it:
    cli.load_config_file, with get_config's default argument where it has one."""
    spec = name
    if name == "convert_tiny.py":  # its argument, a converted model's directory, is required
        checkpoint.write_model_json(str(tmp_path), tiny_config(), None)
        spec = f"{name}:{tmp_path}"
    c = _load(spec)
    assert isinstance(c, ml_collections.ConfigDict) and len(c) > 0


def test_bench_hybrid_is_bench_with_a_cpu_sized_table4_run():
    bench, hybrid = _load("bench.py"), _load("bench_hybrid.py")
    sized = {"table4_lengths", "table4_contexts", "decode_steps", "repeats"}
    assert set(hybrid) == set(bench)
    for key in set(bench) - sized:
        assert cli.to_plain(hybrid[key]) == cli.to_plain(bench[key]), key


@pytest.mark.parametrize("spec", ["tiny_pt.py", "tiny_sft.py", "draft_so.py"])
def test_tiny_configs_build_fully(spec):
    cfg = TrainConfig.from_config(_load(spec))
    assert cfg.model.window < cfg.data.seq_len and cfg.model.architecture == "orthros"


def test_draft_so_takes_another_base_config():
    """`draft_so.py:<window>,<base>`: the base's model and batches with draft SO; the default
    argument is still tiny_pt.py's at its w."""
    default, tiny = _load("draft_so.py"), _load("tiny_pt.py")
    assert default.train.distill_draft_window == tiny.model.window == 64
    assert cli.to_plain(default.data) == cli.to_plain(tiny.data)
    bench = _load("spec_bench.py")
    for spec, window in [("draft_so.py:256,spec_bench", 256), ("draft_so.py:,spec_bench", 128)]:
        c = _load(spec)
        assert c.model.draft_scale_offset and c.train.distill_draft_window == window
        assert c.model.d_model == bench.model.d_model == 512
        assert cli.to_plain(c.data) == cli.to_plain(bench.data)
    with pytest.raises(ValueError, match="no_such"):
        _load("draft_so.py:64,no_such")


@pytest.mark.parametrize(
    "budget, tokens_per_step, steps",
    [("100b", 2_097_152, 47_683), ("10b", 262_144, 38_146)],  # Table 1: 2M; Table 5: 0.25M
)
def test_pt_1p3b_is_the_papers_recipe(budget, tokens_per_step, steps):
    model, data, opt, loop = _sections(_load(f"pt_1p3b.py:{budget}"))
    assert data.seq_len * data.batch_size * opt.grad_accum_steps == tokens_per_step
    assert loop.steps == steps == int(float(budget[:-1]) * 1e9 // tokens_per_step)
    assert loop.seed == data.seed == 42
    assert 1.3e9 < num_params(model) < 1.4e9
    assert (opt.lr, opt.warmup_steps, opt.weight_decay) == (3e-4, 1500, 0.05)
    assert (model.architecture, model.window, model.scale_offset) == ("orthros", 128, True)


@pytest.mark.parametrize("budget", ["100b", "10b"])
def test_pt_1p3b_swa_is_table_1_baseline(budget):
    """SWA with w = 512, one stream, no scale-offset; every other field equals Orthros's."""
    swa, orthros = _load(f"pt_1p3b_swa.py:{budget}"), _load(f"pt_1p3b.py:{budget}")
    model, _, _, _ = _sections(swa)
    assert (model.architecture, model.window, model.scale_offset) == ("swa", 512, False)
    orthros_model = ModelConfig.from_dict(orthros.model)
    assert model == orthros_model.replace(architecture="swa", window=512, scale_offset=False)
    assert num_params(orthros_model) - num_params(model) == 4 * 24 * 16 * 128  # the SO vectors
    for name in ("data", "optimizer", "train", "mesh", "distributed"):
        assert cli.to_plain(swa[name]) == cli.to_plain(orthros[name]), name


@pytest.mark.parametrize(
    "spec, params", [("convert_llama31_8b.py", 8.03e9), ("convert_qwen3_8b.py", 8.19e9)]
)
def test_conversion_configs_are_table_6(spec, params):
    c = _load(f"{spec}:/models/converted")
    model, data, opt, loop = _sections(c)
    assert c.init_from == "/models/converted"
    assert c.data.tokenizer == "/models/converted/tokenizer.json"
    assert abs(num_params(model) - params) / params < 0.01
    assert data.seq_len == 32768 and model.remat == "full" and model.window == 128
    assert data.seq_len * data.batch_size * opt.grad_accum_steps == 8 * 2**20  # 8M tokens
    assert (opt.lr, loop.steps, opt.warmup_steps) == (3e-5, 10_000, 500)
    assert (opt.min_lr_ratio, opt.weight_decay) == (0.1, 0.1)


def test_unknown_override_fails_listing_valid_keys():
    argv = ["train.py", "--config=configs/tiny_pt.py", "--config.optimizer.lrr=1"]
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with pytest.raises(ValueError, match=r"(?s)optimizer.lrr.*valid keys:.*optimizer\.lr\b"):
            cli.check_override_keys(argv)
        cli.check_override_keys([*argv[:2], "--config.optimizer.lr=1e-3"])  # known: fine
    finally:
        os.chdir(cwd)
    with pytest.raises(ValueError, match="unknown key.*'optimizer'.*valid keys: lr"):
        cli.dataclass_from_dict(OptimizerConfig, {"lrr": 1.0}, "optimizer")


@pytest.mark.slow
def test_launcher_trains_sft_and_says_where_it_starts_and_ends(tmp_path):
    """launch/train.py on configs/tiny_sft.py trains, says where it starts and ends, warns of
    a warmup covering the run, and logs per-step records with no zero throughput (issue 22's
    training summaries). Its refusal of an unknown key: test_rough_edges.py."""
    sft = [
        f.replace("configs/tiny_pt.py", "configs/tiny_sft.py")
        for f in TINY_FLAGS
        if not f.startswith("--config.data.seq_len")
    ]
    flags = ["--config.data.seq_len=128", "--config.data.out_len=32", "--config.train.steps=3"]
    flags += ["--config.train.eval_every=0", "--config.optimizer.lr=1e-3"]
    flags += ["--config.train.log_every=1", "--config.optimizer.warmup_steps=5"]
    work = str(tmp_path / "sft")
    done = run_train([*sft, *flags, f"--workdir={work}"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert "training orthros (" in out and "random init (seed" in out and work in out
    assert f"done: step 3 in {work}" in out
    assert "warmup_steps=5 >= train.steps=3" in out
    logged = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [x["split"] for x in logged][-1] == "eval" and all(x["loss"] > 0 for x in logged)
    train_rows = [x for x in logged if x["split"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    assert "tokens_per_s" not in train_rows[0]  # only the compiling step: not timed
    assert all(r["tokens_per_s"] > 0 for r in train_rows[1:])
    assert train_rows[0]["lr"] > 0  # the first update moves the weights
    # SFT loss tokens are answer tokens only: at most out_len per row (4 rows x 32 a step).
    assert all(0 < r["loss_tokens"] <= 4 * 32 for r in train_rows)
    assert checkpoint.load_model(work).max_context == 128  # the training sequence length
