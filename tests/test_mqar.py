"""MQAR data (Zoology-style) by construction, its packed training batches, scoring with an
oracle, the report, and launch/mqar.py end to end at a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from orthros_jax.data import mqar
from orthros_jax.evaluation import metrics, mqar_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_example_layout_is_zoology_mqar():
    rng = np.random.default_rng(0)
    ex = mqar.mqar_example(rng, length=64, pairs=8, vocab_size=64)
    t = ex.tokens
    assert t.shape == (64,) and t.dtype == np.int32 and t.min() >= 1 and t.max() < 64
    keys, values = t[0:16:2], t[1:16:2]
    assert len(set(keys.tolist())) == 8 and keys.max() < 32 and values.min() >= 32
    answer_at = np.nonzero(ex.answer_mask)[0]
    assert len(answer_at) == 8 and (answer_at >= 17).all() and (answer_at % 2 == 1).all()
    lookup = dict(zip(keys.tolist(), values.tolist(), strict=True))
    for i in answer_at:  # each answer is the value of the key just before it, asked once
        assert t[i] == lookup[int(t[i - 1])]
    assert sorted(t[answer_at - 1].tolist()) == sorted(keys.tolist())
    assert (t < 32).sum() == 16  # keys occur only in their pairs and queries
    pair_value_at = {int(k): 2 * j + 1 for j, k in enumerate(keys)}
    want = [i - 1 - pair_value_at[int(t[i - 1])] for i in answer_at]
    np.testing.assert_array_equal(ex.distances, want)
    np.testing.assert_array_equal(ex.answers, t[answer_at])
    a = mqar.examples(64, 8, 3, 64, seed=5)
    b = mqar.examples(64, 8, 3, 64, seed=5)
    assert all((x.tokens == y.tokens).all() for x, y in zip(a, b, strict=True))
    assert not (mqar.examples(64, 8, 1, 64, seed=6)[0].tokens == a[0].tokens).all()


def test_power_law_puts_most_queries_early():
    rng = np.random.default_rng(1)
    near = far = 0
    for _ in range(200):
        ex = mqar.mqar_example(rng, 256, 4, 256, power_a=0.01)
        slot = (np.nonzero(ex.answer_mask)[0] - 1 - 8) // 2  # 120 slots after the context
        near += int((slot < 12).sum())
        far += int((slot >= 108).sum())
    # p(slot) ~ (slot+1)^-0.99: the first tenth holds most of the mass, the last tenth little.
    assert near > 3 * far > 0


def test_train_batch_packs_examples_of_one_shape():
    cfg = mqar.MQARConfig(
        vocab_size=64, seq_len=128, batch_size=4, train_lengths=(32, 64, 256), train_pairs=(4, 16)
    )
    assert cfg.shapes() == [(32, 4), (64, 4), (64, 16)] and cfg.out_len == 32  # 2 x 16
    b = mqar.train_batch(cfg, 3)
    assert b["tokens"].shape == (4, 128) and b["targets"].shape == (4, 32)
    for r in range(4):
        seg, pos, n = b["segment_ids"][r], b["positions"][r], int(b["loss_mask"][r].sum())
        length = 128 // int(seg.max())
        np.testing.assert_array_equal(pos, np.tile(np.arange(length), 128 // length))
        out = b["output_positions"][r, :n]
        np.testing.assert_array_equal(b["tokens"][r, out + 1], b["targets"][r, :n])
        assert (b["targets"][r, :n] >= 32).all()  # answers are values
        assert n * length in (4 * 128, 16 * 128)  # seq_len // L examples of D answers
    again = mqar.train_batch(cfg, 3)
    assert all((again[k] == b[k]).all() for k in b)
    it = mqar.make_train_iterator(cfg)
    first = next(it)
    np.testing.assert_array_equal(first["tokens"], mqar.train_batch(cfg, 0)["tokens"])
    state = it.get_state()
    nxt = next(it)
    it.set_state(state)
    np.testing.assert_array_equal(next(it)["tokens"], nxt["tokens"])  # resumable position
    assert not (mqar.eval_batches(cfg, 1)[0]["tokens"] == first["tokens"]).all()


def test_bad_shapes_are_value_errors():
    with pytest.raises(ValueError, match="needs a length >= 64"):
        mqar.mqar_example(np.random.default_rng(0), 32, 16, 256)
    with pytest.raises(ValueError, match="vocab_size >= 34"):
        mqar.mqar_example(np.random.default_rng(0), 128, 16, 32)
    with pytest.raises(ValueError, match="no shape fits"):
        mqar.MQARConfig(seq_len=32, train_lengths=(64,))
    with pytest.raises(ValueError, match="no \\(length, pairs\\) cell fits"):
        mqar_report.MQAREval(lengths=(16,), pairs=(8,))


def test_accuracy_by_distance_bins_on_hand_examples():
    ex = mqar.MQARExample(
        tokens=np.array([1, 40, 2, 50, 9, 1, 40, 2, 50], np.int32),
        answer_mask=np.array([0, 0, 0, 0, 0, 0, 1, 0, 1], bool),
        distances=np.array([4, 4], np.int32),
    )
    far = mqar.MQARExample(ex.tokens, ex.answer_mask, np.array([20, 70], np.int32))
    ok = mqar.queries_correct([ex, far], [np.array([40, 0]), np.array([40, 50])])
    np.testing.assert_array_equal(ok, [True, False, True, True])
    got = mqar.accuracy_by_distance([ex, far], ok, (16, 64))
    assert got == {"<=16": 0.5, "17-64": 1.0, ">64": 1.0}
    got = mqar.accuracy_by_distance([ex], np.array([True, True]), (2, 16))
    assert got == {"<=2": None, "3-16": 1.0, ">16": None}
    with pytest.raises(ValueError, match="3 query results for 2 queries"):
        mqar.accuracy_by_distance([ex], np.ones(3, bool), (2, 16))


def test_score_with_an_oracle_and_the_report(monkeypatch, tmp_path):
    """An oracle returning the batch's targets scores 1 everywhere; off by one scores 0. Then
    the markdown and plot of a results dict built from those scores."""
    from orthros_jax.config import ModelConfig

    def oracle(params, batch, cfg, shift=0):
        return (batch["targets"] + shift) % cfg.vocab_size

    cfg = ModelConfig(architecture="transformer", scale_offset=False, vocab_size=64)
    ev = mqar_report.MQAREval(lengths=(32, 64), pairs=(4, 16), examples=3, distance_bins=(8,))
    assert ev.cells() == [(32, 4), (64, 4), (64, 16)]
    data = mqar.MQARConfig(vocab_size=64)
    monkeypatch.setattr(metrics, "_answer_argmax", oracle)
    right = mqar_report.score(cfg, None, ev, data)
    assert right["accuracy"] == 1.0 and set(right["cells"].values()) == {1.0}
    assert right["by_distance"] == {"<=8": 1.0, ">8": 1.0}
    monkeypatch.setattr(metrics, "_answer_argmax", lambda p, b, cfg: oracle(p, b, cfg, 1))
    wrong = mqar_report.score(cfg, None, ev, data)
    assert wrong["accuracy"] == 0.0 and list(wrong["cells"]) == [
        "L=32 D=4",
        "L=64 D=4",
        "L=64 D=16",
    ]
    results = {
        "arms": {
            "orthros": {"accuracy_mean": 1.0, "accuracy_std": 0.0, "runs": [right]},
            "swa": {"accuracy_mean": 0.0, "accuracy_std": 0.0, "runs": [wrong]},
        },
        "setup": {
            "cells": ev.cells(),
            "vocab_size": 64,
            "model": "d=8",
            "window": 16,
            "steps": 2,
            "batch_size": 2,
            "seq_len": 64,
            "lr": 1e-3,
            "seeds": 1,
            "examples": 3,
            "distance_bins": ev.distance_bins,
        },
        "seconds": 60.0,
        "devices": "1 x cpu",
    }
    text = mqar_report.markdown(results)
    assert "| SWA | 0.00 ± 0.00 | 0.00 | 0.00 | 0.00 |" in text
    assert "| Orthros | 1.00 | 1.00 |" in text and "Run time: 1.0 min (1 x cpu)." in text
    assert text.index("| SWA |") < text.index("| Orthros |")  # report.py's arm order
    assert "| arm | <=8 | >8 |" in text
    assert mqar.distance_bins((8, 16, 32)) == ["<=8", "9-16", "17-32", ">32"]
    mqar_report.plot(results, str(tmp_path / "mqar.png"))
    assert (tmp_path / "mqar.png").stat().st_size > 0


def test_score_draws_the_training_distribution(monkeypatch):
    """score() draws its examples with the trained data's vocab_size and power_a (not the
    defaults): here power_a=1 (uniform query slots) and vocab 32."""
    from orthros_jax.config import ModelConfig

    scored = []

    def predictions(cfg, params, exs, batch_size):
        scored.extend(exs)
        return [e.answers for e in exs]

    monkeypatch.setattr(mqar_report, "teacher_forced_predictions", predictions)
    cfg = ModelConfig(architecture="transformer", scale_offset=False, vocab_size=64)
    ev = mqar_report.MQAREval(lengths=(64,), pairs=(4,), examples=4, distance_bins=(8,))
    data = mqar.MQARConfig(vocab_size=32, power_a=1.0, train_lengths=(64,), train_pairs=(4,))
    assert mqar_report.score(cfg, None, ev, data)["accuracy"] == 1.0
    want = mqar.examples(64, 4, 4, 32, seed=ev.seed, power_a=1.0)
    default = mqar.examples(64, 4, 4, 32, seed=ev.seed)
    assert not all((a.tokens == b.tokens).all() for a, b in zip(want, default, strict=True))
    assert len(scored) == 4
    for got, ex in zip(scored, want, strict=True):
        np.testing.assert_array_equal(got.tokens, ex.tokens)
        np.testing.assert_array_equal(got.distances, ex.distances)


@pytest.mark.slow
def test_launch_mqar_tiny(tmp_path):
    """launch/mqar.py --tiny: one arm, a couple of steps; results md/json/png appear."""
    out = tmp_path / "mq"
    cmd = [
        sys.executable,
        os.path.join(REPO, "launch", "mqar.py"),
        f"--out={out}",
        "--tiny",
        "--arms=orthros",
        "--keep_work=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.load(open(out / "mqar.json"))
    assert list(res["arms"]) == ["orthros"] and res["setup"]["steps"] == 2
    run = res["arms"]["orthros"]["runs"][0]
    assert 0.0 <= run["accuracy"] <= 1.0 and set(run["cells"]) == {"L=64 D=4"}
    assert res["load_average"]["start"] and res["seconds"] > run["train_seconds"] > 0
    assert (out / "mqar.md").read_text().startswith("**MQAR**")
    assert (out / "mqar.png").stat().st_size > 0 and not (out / "work").exists()
    bad = subprocess.run([*cmd[:3], "--arms=gpt"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode != 0 and "unknown arm 'gpt'" in bad.stderr
