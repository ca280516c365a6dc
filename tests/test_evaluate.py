"""Evaluation metrics on hand examples and oracles; launch/evaluate.py on a checkpoint made here."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orthros_jax import checkpoint
from orthros_jax.config import ModelConfig
from orthros_jax.data import ByteTokenizer, RecallTask
from orthros_jax.evaluation import (
    EvalSpec,
    answer_tokens,
    bits_per_byte,
    evaluate,
    greedy_predictions,
    grid_matrix,
    masked_nll_sums,
    metrics,
    query_correct,
    recall_records,
    report,
    summarize_records,
    teacher_forced_predictions,
    write_results,
)
from orthros_jax.model import init_params

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = ByteTokenizer()


def tiny(arch: str = "orthros", **kw) -> ModelConfig:
    base = dict(
        vocab_size=256,
        d_model=32,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        head_dim=16,
        d_ff=64,
        window=16,
        architecture=arch,
        scale_offset=arch == "orthros",
        attention_block_q=64,
        attention_block_k=64,
        prefill_chunk=256,
    )
    return ModelConfig(**(base | kw))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """A small directory corpus (the embedded one takes seconds to tokenise)."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = ["def", "return", "value", "self", "import", "class", "None", "for", "in", "x"]
    for i in range(60):
        text = " ".join(rng.choice(words, 300)) + "\n"
        (root / f"doc{i:02d}.txt").write_text(text)
    return str(root)


# ---------------------------------------------------------------- pure metrics


def test_masked_nll_sums_matches_hand_computation():
    # Two positions, vocab 3. Row 0: logits (0, ln 2, 0) -> p = (1/4, 1/2, 1/4); target 1.
    logits = jnp.array([[[0.0, math.log(2.0), 0.0], [5.0, 0.0, 0.0]]])
    targets = jnp.array([[1, 2]])
    nll, correct, weight = masked_nll_sums(logits, targets, jnp.array([[1.0, 0.0]]))
    assert float(weight) == 1.0 and float(correct) == 1.0
    np.testing.assert_allclose(float(nll), math.log(2.0), rtol=1e-6)  # -log(1/2)
    nll, correct, weight = masked_nll_sums(logits, targets, jnp.ones((1, 2)))
    p2 = 1.0 / (math.exp(5.0) + 2.0)  # softmax(5, 0, 0)[2]
    np.testing.assert_allclose(float(nll), math.log(2.0) - math.log(p2), rtol=1e-6)
    assert float(correct) == 1.0 and float(weight) == 2.0  # argmax of row 1 is 0, not 2


def test_bits_per_byte():
    assert bits_per_byte(8 * math.log(2.0), 8) == pytest.approx(1.0)
    assert bits_per_byte(math.log(256.0) * 10, 10) == pytest.approx(8.0)  # uniform bytes


def test_query_correct_splits_tokens_by_answer():
    ok = np.array([True, True, False, True, True, True])
    np.testing.assert_array_equal(query_correct(ok, [2, 3, 1]), [True, False, True])
    with pytest.raises(ValueError, match="answer tokens"):
        query_correct(ok, [2, 2])


def test_summaries_and_grid_on_hand_records():
    recs = [
        dict(
            context_len=64,
            depth=0.0,
            queries=1,
            queries_correct=1,
            answer_tokens=5,
            tokens_correct=5,
        ),
        dict(
            context_len=64,
            depth=0.0,
            queries=1,
            queries_correct=0,
            answer_tokens=5,
            tokens_correct=3,
        ),
        dict(
            context_len=64,
            depth=1.0,
            queries=1,
            queries_correct=1,
            answer_tokens=5,
            tokens_correct=5,
        ),
        dict(
            context_len=128,
            depth=1.0,
            queries=2,
            queries_correct=0,
            answer_tokens=8,
            tokens_correct=0,
        ),
    ]
    s = summarize_records(recs)
    assert s["accuracy"] == pytest.approx(2 / 5) and s["token_accuracy"] == pytest.approx(13 / 23)
    grid = grid_matrix(recs, [64, 128], [0.0, 1.0])
    np.testing.assert_array_equal(grid[0], [0.5, 1.0])
    assert np.isnan(grid[1, 0]) and grid[1, 1] == 0.0
    agg = report.aggregate([{"nll": 1.0}, {"nll": 3.0}], "nll")
    assert agg["nll_mean"] == 2.0 and agg["nll_std"] == pytest.approx(math.sqrt(2.0))


@pytest.mark.slow
def test_lm_metrics_agree_with_the_training_eval_step(corpus):
    """Held-out NLL here is the training loop's eval loss on the same batches (PT batches)."""
    from orthros_jax.data import DataConfig, make_eval_batches
    from orthros_jax.training import make_eval_step

    cfg = tiny()
    params = init_params(cfg, jax.random.PRNGKey(1))
    data = DataConfig(
        kind="pt", corpus=(corpus,), seq_len=64, batch_size=4, validation_fraction=0.2
    )
    batches = make_eval_batches(data, 2, process_index=0, process_count=1)
    step = jax.jit(make_eval_step(cfg))
    sums = [jax.device_get(step(params, b)) for b in batches]
    want = sum(float(s["loss_sum"]) for s in sums) / sum(float(s["weight"]) for s in sums)
    got = metrics.lm_metrics(cfg, params, batches)
    np.testing.assert_allclose(got["nll"], want, rtol=1e-5)
    assert got["tokens"] == sum(int(b["loss_mask"].sum()) for b in batches) == got["bytes"]


# ---------------------------------------------------------------- recall scoring


def _passkey(n: int = 3, context: int = 128) -> list:
    task = RecallTask(TOK, "passkey", context_len=context)
    return [task.sample(0, i) for i in range(n)]


def _mqar(n: int = 2) -> list:
    task = RecallTask(TOK, "mqar", context_len=128, n_pairs=4, n_queries=3, gap=32)
    return [task.sample(1, i) for i in range(n)]


def test_oracle_predictions_score_one_and_wrong_ones_zero(monkeypatch):
    """An oracle that returns the batch's targets at every output position -> accuracy 1; one
    off by one -> 0. Runs the whole pipeline (batching, padding rows, per-query grouping)."""

    def oracle(params, batch, cfg, shift=0):
        return (batch["targets"] + shift) % cfg.vocab_size

    examples = _passkey(3) + _mqar(2)
    cfg = tiny()
    monkeypatch.setattr(metrics, "_answer_argmax", oracle)
    recs = recall_records(cfg, None, examples, batch_size=4)
    s = summarize_records(recs)
    assert s["accuracy"] == 1.0 and s["token_accuracy"] == 1.0
    assert s["queries"] == 3 + 2 * 3 and s["examples"] == 5
    monkeypatch.setattr(metrics, "_answer_argmax", lambda p, b, cfg: oracle(p, b, cfg, 1))
    s = summarize_records(recall_records(cfg, None, examples, batch_size=4))
    assert s["accuracy"] == 0.0 and s["token_accuracy"] == 0.0


@pytest.mark.slow
def test_greedy_first_token_equals_teacher_forced_argmax():
    """Greedy decoding (prefill + decode) and the SFT forward see the same prompt for the
    first answer token of each query, so their argmaxes must agree (the CLI test below runs
    greedy on the swa arm; the inference tests cover prefill/decode of every arm)."""
    cfg = tiny("orthros")
    params = init_params(cfg, jax.random.PRNGKey(3))
    examples = _mqar(2)
    tf = teacher_forced_predictions(cfg, params, examples, batch_size=2)
    gr = greedy_predictions(cfg, params, examples, batch_size=8)
    for ex, a, b in zip(examples, tf, gr, strict=True):
        assert a.shape == b.shape == answer_tokens(ex).shape
        firsts = np.cumsum([0] + [e - s for s, e in ex.answer_spans])[:-1]
        np.testing.assert_array_equal(a[firsts], b[firsts])


@pytest.mark.slow
def test_evaluate_writes_metrics_and_heatmap(tmp_path, corpus):
    cfg = tiny()
    params = init_params(cfg, jax.random.PRNGKey(0))
    spec = EvalSpec(
        tasks=("lm", "passkey", "mqar"),
        lm_corpus=(corpus,),
        lm_validation_fraction=0.2,
        lm_seq_len=64,
        lm_batches=1,
        batch_size=4,
        context_lengths=(128,),
        depths=(0.0, 1.0),
        samples=1,
        mqar_pairs=4,
        mqar_queries=2,
    )
    res = evaluate(cfg, params, spec)
    # An untrained byte model is close to uniform: ~ln 256 nats, ~8 bits per byte.
    assert 4.5 < res["lm"]["nll"] < 7.0 and res["lm"]["bpb"] == pytest.approx(
        res["lm"]["nll"] / math.log(2), rel=1e-6
    )
    assert res["passkey"]["examples"] == 2 and len(res["passkey"]["grid"][0]) == 2
    assert res["mqar"]["queries"] == 2 and res["passkey"]["min_distance"] > cfg.window
    paths = write_results(res, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["metrics.json", "niah_mqar.png", "niah_passkey.png"]
    assert json.load(open(paths[0]))["lm"]["tokens"] > 0


def test_spec_errors_are_value_errors():
    with pytest.raises(ValueError, match="tasks"):
        EvalSpec(tasks=("bleu",))
    with pytest.raises(ValueError, match="decode"):
        EvalSpec(decode="beam")
    with pytest.raises(ValueError, match="too short"):
        evaluate(tiny(), None, EvalSpec(tasks=("passkey",), context_lengths=(32,)))


# ---------------------------------------------------------------- the job config


def _job(**overrides):
    """EvalJob of configs/eval.py (or `config=`) with dotted overrides, as the CLI builds it."""
    from orthros_jax.config.cli import load_config_file
    from orthros_jax.evaluation.job import EvalJob

    c = load_config_file(os.path.join(REPO, "configs", overrides.pop("config", "eval.py")))
    c.update_from_flattened_dict(overrides)
    return EvalJob.from_config(c)


def test_eval_configs_become_frozen_jobs():
    job = _job()
    assert job.suite == EvalSpec() and job.harness.tasks == ()
    job = _job(**{"tasks": ("lm,mqar",), "harness.tasks": ("piqa, arc_easy",), "samples": 2})
    assert job.suite.tasks == ("lm", "mqar") and job.suite.samples == 2
    assert job.harness.tasks == ("piqa", "arc_easy")  # a comma list from the command line
    from orthros_jax.evaluation.harness_run import HarnessSpec

    assert HarnessSpec(tasks="piqa, arc_easy").tasks == ("piqa", "arc_easy")  # a bare string too
    job = _job(config="eval_paper.py")
    assert job.suite is None and job.harness.num_fewshot == 0
    assert job.harness.tasks == (
        "arc_easy",
        "arc_challenge",
        "hellaswag",
        "piqa",
        "openbookqa",
        "social_iqa",
        "winogrande",
    )
    assert _job(config="eval_paper.py:table2").harness.tasks[-1] == "mmlu"
    with pytest.raises(ValueError, match="nothing to evaluate"):
        _job(tasks=())
    with pytest.raises(ValueError, match="decode"):
        _job(decode="beam")
    with pytest.raises(ValueError, match="harness.max_length must be >= 1"):
        _job(**{"harness.max_length": 0})
    with pytest.raises(ValueError, match="unknown key.*'sample'.*valid keys"):
        from orthros_jax.evaluation.job import EvalJob

        EvalJob.from_config({"tasks": ("lm",), "harness": {}, "sample": 3})


# ---------------------------------------------------------------- the CLI


@pytest.mark.slow
def test_evaluate_cli_on_saved_model_dir(tmp_path, corpus):
    """launch/evaluate.py reads a model directory made here and writes only into --out; with
    lm-eval installed it also runs a local harness task through the same command."""
    cfg = tiny("swa")
    model_dir, out = tmp_path / "model", tmp_path / "out"
    checkpoint.save_model(str(model_dir), cfg, init_params(cfg, jax.random.PRNGKey(0)))
    before = sorted(os.listdir(model_dir))
    cmd = [
        sys.executable,
        os.path.join(REPO, "launch", "evaluate.py"),
        f"--model={model_dir}",
        f"--out={out}",
        "--config.tasks=lm,passkey",
        "--config.lm_seq_len=64",
        "--config.lm_batches=1",
        "--config.batch_size=4",
        "--config.context_lengths=128",
        "--config.depths=0.5",
        "--config.samples=2",
        "--config.decode=greedy",
        f"--config.lm_corpus={corpus}",
        "--config.lm_validation_fraction=0.2",
    ]
    harness = importlib.util.find_spec("lm_eval") is not None
    if harness:
        cmd += [
            "--config.harness.tasks=orthros_tiny_mc",
            "--config.harness.include_defaults=false",
            "--config.harness.include_path=tests/harness_tasks",
            "--config.harness.batch_size=4",
            "--config.harness.max_length=64",
            "--config.harness.bootstrap_iters=0",
        ]
    env = os.environ | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.load(open(out / "metrics.json"))
    assert res["model"]["architecture"] == "swa" and res["passkey"]["decode"] == "greedy"
    assert res["passkey"]["examples"] == 2 and res["lm"]["nll"] > 0
    assert (out / "niah_passkey.png").stat().st_size > 0
    assert sorted(os.listdir(model_dir)) == before
    if harness:
        full = json.load(open(out / "harness_results.json"))
        acc = full["results"]["orthros_tiny_mc"]["acc,none"]
        assert res["harness"]["tasks"]["orthros_tiny_mc"]["acc"] == acc
        assert full["n-samples"]["orthros_tiny_mc"]["effective"] == 7  # every local example
    # Its refusals (a dir without model.json, an unknown config key): test_rough_edges.py.
