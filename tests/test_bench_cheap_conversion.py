"""benchmarks/cheap_conversion.py's study plan, without training: the flags' checks, the lr
sweep and the seeds at each arm's best lr, the passkey stage's config, the reuse of finished
runs and the tables (the training and scoring are the library's, tested elsewhere)."""

from __future__ import annotations

import json
import math
import os
import types

import pytest

from benchmarks import cheap_conversion as cc
from orthros_jax.evaluation.arms import RECALL_EVAL


def flags(**changes):
    base = dict(arms=["so"], seeds=["0"], lrs=[], pretrain_steps=2, steps=2, passkey_steps=0)
    return types.SimpleNamespace(**(base | changes))


@pytest.mark.parametrize(
    "changes, names",
    [
        (dict(arms=["so", "lora7"]), "--arms"),
        (dict(arms=[]), "--arms"),
        (dict(seeds=["0", "x"]), "--seeds"),
        (dict(seeds=["1", "1"]), "--seeds"),
        (dict(lrs=["1e-3", "fast"]), "--lrs"),
        (dict(lrs=["1e-3", "0"]), "--lrs"),
        (dict(lrs=["3e-3", "3e-3"]), "--lrs"),
        (dict(steps=0), "--steps"),
        (dict(passkey_steps=-1), "--passkey_steps"),
    ],
)
def test_bad_flags_are_one_line_errors(changes, names):
    with pytest.raises(ValueError) as e:
        cc.Study.from_flags(flags(**changes))
    assert names in str(e.value) and "\n" not in str(e.value)


def test_another_setup_in_the_same_out_is_refused(tmp_path):
    out = str(tmp_path)
    cc.claim(out, cc.Study(arms=("so",), seeds=(0,), steps=100))
    cc.claim(out, cc.Study(arms=("full",), seeds=(0, 1), lrs=(1e-3,), steps=100))  # same runs
    with pytest.raises(ValueError, match="holds a study with"):
        cc.claim(out, cc.Study(arms=("so",), seeds=(0,), steps=50))


@pytest.mark.parametrize("arm, trainable", [("so", "scale_offset"), ("lora8", "lora")])
def test_passkey_stage_trains_the_arms_subset_on_the_recall_data(arm, trainable):
    cfg = cc.passkey_config(arm, 0.02, 2, 7, "/w/lr0.02_s2")
    recall = cc.config("recall_passkey.py:orthros").data
    assert (
        cfg.train.trainable == trainable and cfg.model == cc.config(f"convert_cheap.py:{arm}").model
    )
    assert (cfg.train.steps, cfg.train.seed, cfg.optimizer.lr) == (7, 2, 0.02)
    assert cfg.init_from == "/w/lr0.02_s2"
    assert cfg.data == recall.replace(seed=2) and cfg.data.sft_task == "passkey"


def test_each_arm_runs_its_sweep_then_its_seeds_at_the_best_lr(tmp_path, monkeypatch):
    trained = []

    def fake_run(cfg, workdir, score):
        trained.append((os.path.relpath(workdir, tmp_path), cfg.init_from, cfg.optimizer.lr))
        if workdir.endswith("_passkey"):
            acc = {str(n): cfg.train.seed / 4 for n in RECALL_EVAL.context_lengths}
            return {"accuracy": cfg.train.seed / 4, "accuracy_by_length": acc}
        # held-out loss lowest at lr 1e-2, and + 0.01 per seed
        return 2.0 + abs(math.log10(cfg.optimizer.lr) + 2) + 0.01 * cfg.train.seed

    monkeypatch.setattr(cc, "run", fake_run)
    monkeypatch.setattr(cc, "footprint", lambda cfg: (512, 4096))
    s = cc.Study(arms=("so",), seeds=(0, 1, 2), lrs=(1e-3, 1e-2, 1e-1), passkey_steps=5)
    res = cc.study_arm(s, "so", str(tmp_path), "/conv")
    sweep = [(f"so/lr{lr:g}_s0", "/conv", lr) for lr in (1e-3, 1e-2, 1e-1)]
    seeds = [(f"so/lr0.01_s{i}", "/conv", 1e-2) for i in (1, 2)]
    passkey = [(f"so/lr0.01_s{i}_passkey", f"{tmp_path}/so/lr0.01_s{i}", 1e-2) for i in range(3)]
    assert trained == sweep + seeds + passkey
    assert res["lr"] == 1e-2 and res["sweep"] == {"0.001": 3.0, "0.01": 2.0, "0.1": 3.0}
    assert res["runs"] == [2.0, 2.01, 2.02]
    assert res["nll"] == pytest.approx(2.01, abs=1e-12) and res["std"] == pytest.approx(0.01)
    table = cc.markdown({"arms": {"so": res}})
    assert "| so | 3.000 | 2.000 | 3.000 | 0.01 |" in table
    want = "| so | 0.01 | 2.010 ± 0.010 | 2.000, 2.010, 2.020 | 512 | 4.0 KiB |"
    assert want + " 0.25 ± 0.25 | 0.25 ± 0.25 | 0.25 ± 0.25 |" in table


def test_a_finished_run_is_reused_and_an_unfinished_one_retrained(tmp_path, monkeypatch):
    calls = []

    def fake_train(cfg, workdir):
        calls.append(sorted(os.listdir(workdir)) if os.path.isdir(workdir) else None)
        os.makedirs(workdir)

    monkeypatch.setattr(cc, "train", fake_train)
    done, half = tmp_path / "done", tmp_path / "half"
    done.mkdir()
    (done / cc.RESULT).write_text(json.dumps(1.5))
    half.mkdir()
    (half / "checkpoints").mkdir()
    assert cc.run(None, str(done), lambda w: 9.0) == 1.5
    assert cc.run(None, str(half), lambda w: 2.5) == 2.5 and calls == [None]
    assert json.loads((half / cc.RESULT).read_text()) == 2.5
