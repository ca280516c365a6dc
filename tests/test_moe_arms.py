"""The mixture-of-experts arms of the experiments (orthros_jax/config/arms.py's transformer_moe,
orthros_moe, orthros_moe_independent): each differs from its dense arm only in model.moe, with
the dense FFN's active parameters at every experiment's width; and the expert load balance the
lm / mqar reports read from a run's metrics.jsonl."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from orthros_jax.config import ModelConfig, arms
from orthros_jax.config.cli import load_config_file, to_plain
from orthros_jax.config.moe import dense_equivalent_d_expert
from orthros_jax.evaluation import arms as experiments
from orthros_jax.evaluation import report
from orthros_jax.layers import ffn, flops
from orthros_jax.model import num_params

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# MoE arm -> (its dense arm, the copies' routing).
MOE_ARMS = {
    "transformer_moe": ("transformer", "independent"),
    "orthros_moe": ("orthros", "paired"),
    "orthros_moe_independent": ("orthros", "independent"),
}


def _model(spec: str) -> ModelConfig:
    c = load_config_file(os.path.join(REPO, "configs", spec))
    return ModelConfig.from_dict(to_plain(c.model))


@pytest.mark.parametrize("family", ["lm_byte.py", "recall_passkey.py", "mqar.py"])
@pytest.mark.parametrize("arm", list(MOE_ARMS))
def test_moe_arm_has_the_dense_arms_active_parameters(family, arm):
    dense_arm, routing = MOE_ARMS[arm]
    moe, dense = _model(f"{family}:{arm}"), _model(f"{family}:{dense_arm}")
    assert moe.moe is not None and moe.moe_routing == routing and dense.moe is None
    assert moe.replace(moe=None) == dense  # only the FFN differs
    m, d, layers = moe.moe, moe.d_model, moe.n_layers
    assert m.top_k * m.d_expert == dense.d_ff and m.shared_expert == 0
    router = layers * d * m.n_experts  # the only extra active parameters
    assert ffn.num_params(moe, active=True) == 3 * d * dense.d_ff * layers + router
    assert num_params(moe, active=True) == num_params(dense) + router
    # In all, E / k times the dense FFN's experts' parameters.
    extra = layers * 3 * d * dense.d_ff * (m.n_experts // m.top_k - 1)
    assert num_params(moe) == num_params(dense) + extra + router
    # The FLOP count follows: the dense FFN's per layer, plus the router's 2 D E.
    want = [f + 2 * d * m.n_experts for f in ffn.layer_flops(dense)]
    assert ffn.layer_flops(moe) == want
    assert flops.pt_forward_flops(moe, 128) > flops.pt_forward_flops(dense, 128)


def test_moe_arms_are_registered_opt_in_variants():
    for arm, (dense_arm, _) in MOE_ARMS.items():
        a, e = arms.ARMS[arm], experiments.ARMS[arm]
        assert a.is_variant and arms.architecture_of(arm) == dense_arm
        assert experiments.LM in e.runs and experiments.RECALL in e.runs and not e.default_in
        assert arm not in experiments.arms_for(experiments.LM, default=True)
    assert list(experiments.ARMS) == list(arms.ARMS)  # one arm a row of each table
    labels = [a.label for a in experiments.ARMS.values()]
    assert len(labels) == len(set(labels))


def test_dense_equivalent_d_expert():
    assert dense_equivalent_d_expert(192, 2) == 96 and dense_equivalent_d_expert(384, 4) == 96
    with pytest.raises(ValueError, match=r"moe.top_k=5 must divide d_ff=192"):
        dense_equivalent_d_expert(192, 5)
    with pytest.raises(ValueError, match=r"moe.top_k must be a positive int"):
        dense_equivalent_d_expert(192, 0)


def _write_metrics(workdir, rows) -> None:
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_expert_load_from_metrics(tmp_path):
    load = [0.4, 0.3, 0.2, 0.1]
    last = {"step": 20, "split": "train", "moe_balance_loss": 2.5}
    last |= {f"moe_load/{e}": v for e, v in enumerate(load)}
    rows = [
        {"step": 10, "split": "train", "moe_balance_loss": 3.0}
        | {f"moe_load/{e}": 0.25 for e in range(4)},
        last,
        {"step": 20, "split": "eval", "loss": 2.0},
    ]
    _write_metrics(tmp_path / "moe", rows)
    got = report.expert_load(str(tmp_path / "moe"))
    np.testing.assert_allclose(got["load"], load, rtol=0, atol=1e-12)
    assert got["load_step"] == 20 and got["balance_loss"] == 2.5
    np.testing.assert_allclose(got["load_max_over_min"], 4.0, rtol=1e-12)
    np.testing.assert_allclose(got["load_cv"], np.std(load) / 0.25, rtol=1e-12)
    _write_metrics(tmp_path / "dense", [{"step": 10, "split": "train", "loss": 2.0}])
    assert report.expert_load(str(tmp_path / "dense")) == {}
    assert report.expert_load(str(tmp_path / "absent")) == {}
    starved = last | {"moe_load/3": 0.0}
    _write_metrics(tmp_path / "starved", [starved])
    assert report.expert_load(str(tmp_path / "starved"))["load_max_over_min"] == float("inf")


def test_lm_report_has_load_columns_for_moe_arms():
    moe_runs = [
        {"nll": 2.0, "bpb": 2.9, "load_max_over_min": m, "load_cv": cv, "balance_loss": 2.0}
        for m, cv in ((2.0, 0.2), (4.0, 0.4))
    ]
    agg = report.aggregate_load(moe_runs)
    np.testing.assert_allclose(
        [agg["load_max_over_min_mean"], agg["load_max_over_min_std"], agg["load_cv_mean"]],
        [3.0, np.sqrt(2.0), 0.3],
        rtol=1e-12,
    )
    dense_runs = [{"nll": 2.1, "bpb": 3.0}]
    assert report.aggregate_load(dense_runs) == {}
    setup = dict(steps=10, seeds=2, seq_len=128, batch_size=4, window=16, model="d=8", lr=1e-3)
    lm_arms = {
        "transformer": report.aggregate(dense_runs, "nll") | {"bpb_mean": 3.0, "runs": dense_runs},
        "orthros_moe": report.aggregate(moe_runs, "nll")
        | agg
        | {"bpb_mean": 2.9, "runs": moe_runs},
    }
    md = report.markdown({"lm": {"arms": lm_arms, "setup": setup}})
    assert f"| {report.LOAD_HEADER} |" in md
    assert "| Transformer | 2.100 ± 0.000 | 3.000 | 2.100 | — | — | — |" in md
    assert (
        "| Orthros-MoE | 2.000 ± 0.000 | 2.900 | 2.000, 2.000 | 3.00 ± 1.41 | 0.300 ± 0.141" in md
    )
    dense_only = report.markdown(
        {"lm": {"arms": {"transformer": lm_arms["transformer"]}, "setup": setup}}
    )
    assert report.LOAD_HEADER not in dense_only
