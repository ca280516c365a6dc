"""The experiment driver end to end at a tiny size, the experiment configs, and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orthros_jax.config.cli import load_config_file
from orthros_jax.evaluation import report
from orthros_jax.training import TrainConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = ("transformer", "swa", "orthros", "orthros_noso")


def _config(spec: str) -> TrainConfig:
    return TrainConfig.from_config(load_config_file(os.path.join(REPO, "configs", spec)))


@pytest.mark.parametrize("family", ["lm_byte.py", "recall_passkey.py"])
def test_arms_differ_only_in_attention(family):
    cfgs = {arm: _config(f"{family}:{arm}") for arm in ARMS}
    assert {a: (c.model.architecture, c.model.scale_offset) for a, c in cfgs.items()} == {
        "transformer": ("transformer", False),
        "swa": ("swa", False),
        "orthros": ("orthros", True),
        "orthros_noso": ("orthros", False),
    }
    ref = cfgs["orthros"]
    for cfg in cfgs.values():  # same data, optimizer, budget and shapes
        assert cfg.data == ref.data and cfg.optimizer == ref.optimizer and cfg.train == ref.train
        assert cfg.model.replace(architecture="orthros", scale_offset=True) == ref.model
    with pytest.raises(ValueError, match="unknown arm"):
        _config(f"{family}:gpt")


def test_recall_needs_the_global_stream():
    cfg = _config("recall_passkey.py:orthros")
    assert cfg.data.context_len >= 8 * cfg.model.window  # experiment 1: context >= 8 x window
    # The needle ends >= len(question) tokens before the answer: beyond what SWA's stacked
    # windows reach from the answer position.
    question = len("\nWhat is the pass key? The pass key is ")
    assert question > cfg.model.n_layers * (cfg.model.window - 1)


def test_convert_stages():
    pre = _config("lm_convert.py:pretrain")
    assert pre.model.architecture == "transformer" and pre.init_from is None
    orth, cpt = _config("lm_convert.py:orthros"), _config("lm_convert.py:transformer")
    assert orth.model.window < orth.data.seq_len  # w < T: conversion really changes the base
    assert orth.train == cpt.train and orth.optimizer == cpt.optimizer and orth.data == cpt.data
    assert orth.data.seed != pre.data.seed


# --help's default arms (the attention arms): test_rough_edges.py.


@pytest.mark.slow
def test_driver_end_to_end_tiny(tmp_path):
    """All three experiments, one arm each, a couple of steps: results.json/md/png appear."""
    out = tmp_path / "exp"
    cmd = [
        sys.executable,
        os.path.join(REPO, "launch", "experiments.py"),
        f"--out={out}",
        "--tiny",
        "--arms=orthros",
        "--seeds=1",
        "--recall_seeds=1",
        "--convert_seeds=1",
        "--convert_arms=orthros",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["exp"]  # writes only into --out
    assert {"results.json", "results.md", "results.png", "results_niah.png"} <= set(os.listdir(out))
    res = json.load(open(out / "results.json"))
    assert 0.0 <= res["recall"]["arms"]["orthros"]["accuracy_mean"] <= 1.0
    assert res["lm"]["arms"]["orthros"]["nll_mean"] > 0
    conv = res["convert"]["arms"]["orthros"]
    assert conv["before"]["nll"] > 0 and conv["n"] == 1 and res["convert"]["pretrain"]["nll"] > 0
    md = open(out / "results.md").read()
    for title in ("Recall beyond the window", "Byte-level LM", "Conversion"):
        assert title in md


def _fake_results() -> dict:
    grid = [[1.0, 0.5], [0.0, 0.25]]
    run = {
        "accuracy": 0.5,
        "token_accuracy": 0.6,
        "grid": grid,
        "accuracy_by_length": {"128": 0.75, "256": 0.125},
    }
    lm_run = {"nll": 2.0, "bpb": 2.0 / 0.6931}
    setup = {
        "steps": 10,
        "seeds": 2,
        "seq_len": 128,
        "batch_size": 4,
        "window": 16,
        "model": "d=8",
        "lr": 1e-3,
    }
    curve = [(5, 2.5), (10, 2.2)]
    return {
        "recall": {
            "arms": {
                a: report.aggregate([run, run], "accuracy") | {"runs": [run, run]} for a in ARMS
            },
            "setup": {
                "train_context": 128,
                "window": 16,
                "steps": 10,
                "seeds": 2,
                "digits": 2,
                "eval": {"context_lengths": [128, 256], "depths": [0.0, 1.0], "samples": 1},
            },
        },
        "lm": {
            "arms": {
                a: report.aggregate([lm_run], "nll") | {"bpb_mean": 2.9, "runs": [lm_run]}
                for a in ARMS
            },
            "setup": setup,
        },
        "convert": {
            "arms": {
                s: report.aggregate([lm_run], "nll")
                | {"before": lm_run, "runs": [lm_run], "curves": [curve]}
                for s in ("orthros", "transformer")
            },
            "pretrain": lm_run,
            "setup": setup | {"pretrain_steps": 20, "continue_steps": 10},
        },
        "seconds": 90.0,
        "devices": "1 x cpu",
    }


def test_report_tables_and_plots(tmp_path):
    res = _fake_results()
    md = report.markdown(res)
    assert "| Orthros w/o SO | 0.50 ± 0.00 | 0.75 | 0.12 |" in md
    assert "| Transformer (base CPT) | 2.000 | 2.000 ± 0.000 | 2.000 |" in md
    assert "Run time: " not in md  # no per-experiment seconds in the fake results
    report.plot(res, str(tmp_path / "r.png"))
    assert report.plot_recall_heatmaps(res, str(tmp_path / "h.png"))
    assert (tmp_path / "r.png").stat().st_size > 0 and (tmp_path / "h.png").stat().st_size > 0
