"""The MoE arms' trust_remote_code export beyond test_export_remote.py's per-arm checks (which
cover transformer / orthros-paired / orthros-independent MoE): paired and independent copies
route differently and each equals ours, Orthros-H with MoE layers, the config.json keys and
the format checks, and the PyTorch top-k's tie rule.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_export_remote import ARMS, GDN, MOE, SMALL, _ours, _params  # noqa: E402

from orthros_jax.config import ModelConfig  # noqa: E402
from orthros_jax.convert import export_hf  # noqa: E402
from orthros_jax.convert.common import check_format, fits  # noqa: E402
from orthros_jax.convert.hf_remote.moe_orthros import top_k  # noqa: E402
from orthros_jax.convert.remote import config_from_remote, remote_config  # noqa: E402

MOE_ARMS = [k for k in ARMS if ARMS[k].moe is not None]


def _load(path: str):
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, trust_remote_code=True, dtype=torch.float32
    ).eval()


def _logits(model, tokens: np.ndarray, **kw) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(tokens), use_cache=False, **kw).logits.numpy()


@pytest.mark.slow
def test_paired_and_independent_copies_differ_and_each_equals_ours(tmp_path):
    """The same weights under both routings: the output stream's logits differ (the copies'
    experts matter) and each export equals our model of its routing."""
    paired = ARMS["orthros_moe_paired"]
    assert paired.moe_routing == "paired"
    independent = paired.replace(moe=paired.moe.replace(routing="independent"))
    params = _params(paired)
    tokens = np.random.default_rng(7).integers(0, paired.vocab_size, (2, 11))
    got = {}
    for name, cfg in (("paired", paired), ("independent", independent)):
        files = export_hf(str(tmp_path / name), cfg, params)  # an orthros arm: remote
        assert "moe_orthros.py" in files
        got[name] = _logits(_load(str(tmp_path / name)), tokens)
        np.testing.assert_allclose(got[name], _ours(cfg, params, tokens), atol=1e-4, rtol=0)
    assert np.abs(got["paired"] - got["independent"]).max() > 1e-3  # 10x the tolerance


@pytest.mark.slow
def test_orthros_h_with_moe_layers_equals_ours(tmp_path):
    """GDN and attention layers with a (dense, moe) FFN cycle, independent routing (paired
    needs every kind to read the last prompt token alone): full logits, prefill's single copy
    and cached decode equal ours."""
    cfg = ModelConfig(
        **SMALL,
        **GDN,
        n_layers=4,
        architecture="orthros_h",
        moe=dict(**MOE, shared_expert=8, routing="independent", ffn_cycle=("dense", "moe")),
    )
    params = _params(cfg)
    export_hf(str(tmp_path), cfg, params)
    model = _load(str(tmp_path))
    tokens = np.random.default_rng(8).integers(0, cfg.vocab_size, (2, 9))
    ours = _ours(cfg, params, tokens)
    np.testing.assert_allclose(_logits(model, tokens), ours, atol=1e-4, rtol=0)
    ids = torch.tensor(tokens)
    with torch.no_grad():
        out = model(ids[:, :5], use_cache=True, logits_to_keep=1)
        cache, steps = out.cache if hasattr(out, "cache") else out.past_key_values, [out.logits]
        for t in range(5, 9):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
    np.testing.assert_allclose(torch.cat(steps, 1).numpy(), ours[:, 4:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arm", MOE_ARMS)
def test_moe_config_json_round_trips(arm):
    cfg = ARMS[arm]
    hf = remote_config(cfg)
    assert hf["num_experts"] == 4 and hf["moe_intermediate_size"] == 16
    dense = [i for i, t in enumerate(cfg.moe.ffn_types(cfg.n_layers)) if t == "dense"]
    assert hf["mlp_only_layers"] == dense
    assert hf["shared_expert_intermediate_size"] == cfg.moe.shared_expert
    assert config_from_remote(hf) == cfg
    from orthros_jax.convert.hf_remote.configuration_orthros import OrthrosConfig

    remote = OrthrosConfig(**{k: v for k, v in hf.items() if k != "auto_map"})
    want = [t == "moe" for t in cfg.moe.ffn_types(cfg.n_layers)]
    assert [remote.is_moe_layer(i) for i in range(cfg.n_layers)] == want
    assert remote.paired_routing == (cfg.moe_routing == "paired")


def test_moe_formats_and_bad_remote_configs_are_refused():
    cfg = ARMS["orthros_moe_paired"]
    check_format(cfg, "remote")
    assert fits(ARMS["transformer_moe"], "remote") and not fits(cfg, "fla")
    with pytest.raises(ValueError, match=r"MoE layers \(ModelConfig\.moe\) as fla"):
        check_format(ModelConfig(**SMALL, n_layers=2, architecture="gla", moe=MOE), "fla")
    from orthros_jax.convert.hf_remote.configuration_orthros import OrthrosConfig

    with pytest.raises(ValueError, match="moe_routing"):
        OrthrosConfig(architecture="transformer", scale_offset=False, moe_routing="paired")
    with pytest.raises(ValueError, match="mlp_only_layers"):
        OrthrosConfig(num_hidden_layers=2, num_experts=4, mlp_only_layers=[2])


def test_top_k_breaks_ties_towards_the_lower_index_like_ours():
    probs = np.array([[0.25, 0.25, 0.25, 0.25], [0.1, 0.4, 0.1, 0.4], [0.3, 0.2, 0.3, 0.2]])
    values, idx = top_k(torch.tensor(probs, dtype=torch.float32), 2)
    want_v, want_i = jax.lax.top_k(jnp.asarray(probs, jnp.float32), 2)
    np.testing.assert_array_equal(idx.numpy(), np.asarray(want_i))
    np.testing.assert_array_equal(idx.numpy(), [[0, 1], [1, 3], [0, 2]])
    np.testing.assert_allclose(values.numpy(), np.asarray(want_v), atol=0, rtol=0)


def test_plain_export_of_a_moe_transformer_qwen3_moe_cannot_hold_writes_remote(tmp_path):
    """transformer_moe has a shared expert (no Qwen3-MoE field): a plain export writes
    trust_remote_code (and reads back to the same parameters); asking for hf names the way."""
    import json

    from orthros_jax.convert.remote import load_remote

    cfg = ARMS["transformer_moe"]
    params = _params(cfg)
    export_hf(str(tmp_path / "plain"), cfg, params)
    hf = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert "auto_map" in hf and hf["shared_expert_intermediate_size"] == 24
    cfg2, params2 = load_remote(str(tmp_path / "plain"))
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2), strict=True):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    with pytest.raises(ValueError, match=r"try --export_format=remote"):
        export_hf(str(tmp_path / "hf"), cfg, params, fmt="hf")
