"""The kind interface's declarations at work: the weight-decay mask, recurrence, the export
formats (a kind without a form in one is refused in one line) and the source format."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from orthros_jax import checkpoint
from orthros_jax.config import ModelConfig
from orthros_jax.convert import export_hf
from orthros_jax.layers.registry import KINDS
from orthros_jax.model import init_params, param_decls
from orthros_jax.training.optimizer import weight_decay_mask

SMALL = dict(
    vocab_size=32,
    d_model=16,
    n_heads=2,
    n_kv_heads=1,
    head_dim=8,
    d_ff=24,
    window=4,
    kinds=dict(
        gdn=dict(num_k_heads=1, num_v_heads=2, k_head_dim=8, v_head_dim=4),
        gla=dict(heads=2, kv_heads=1, k_head_dim=8, v_head_dim=4, short_conv=True),
        retention=dict(heads=2, kv_heads=2, k_head_dim=8, v_head_dim=4),
    ),
)
# The projections of each kind, which AdamW decays (every other parameter is a gain, bias,
# conv tap, decay parameter or scale-offset and is not).
PROJECTIONS = {
    "attention": {"wq", "wk", "wv", "wo", "wq_gate"},
    "gdn": {"gdn_wq", "gdn_wk", "gdn_wv", "gdn_wz", "gdn_wb", "gdn_wa", "gdn_out"},
    "gla": {"gla_wq", "gla_wk", "gla_wv", "gla_wg", "gla_out", "gla_wgk1", "gla_wgk2"},
    "retention": {"retention_wq", "retention_wk", "retention_wv", "retention_wg", "retention_out"},
}
FFN = {"w_gate", "w_up", "w_down"}


def _cfg(arch: str, layer_types: tuple[str, ...] = (), **kw) -> ModelConfig:
    return ModelConfig(architecture=arch, layer_types=layer_types, **SMALL | kw)


@pytest.mark.parametrize(
    "arch,layer_types",
    [
        ("orthros_h", ("gla", "attention")),
        ("hybrid", ("retention", "gdn", "attention", "gdn")),
        ("orthros", ()),
    ],
)
def test_weight_decay_mask_is_the_declarations(arch, layer_types):
    cfg = _cfg(arch, layer_types, n_layers=4, attn_output_gate=True, qk_norm=True)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    mask = weight_decay_mask(cfg)(params)
    assert mask["lm_head"] and not mask["embedding"] and not mask["final_norm"]
    for kind in {KINDS[k] for k in cfg.layer_types}:
        decayed = {n for n, on in mask[kind.params_key].items() if on}
        assert decayed == (PROJECTIONS[kind.name] | FFN) & set(kind.params(cfg)), kind.name
    # A parameter nothing declares is an error, not silently undecayed.
    with pytest.raises(ValueError, match="layers/w_new has no declaration"):
        key = KINDS[cfg.layer_types[-1]].params_key
        weight_decay_mask(cfg)({**params, key: {**params[key], "w_new": params["embedding"]}})


def test_declarations_match_the_parameter_tree():
    cfg = _cfg("orthros_h", ("gla", "retention", "gdn", "attention"), n_layers=4)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    decls = param_decls(cfg)
    assert set(params) == set(decls)
    for key, tree in params.items():
        if isinstance(tree, dict):  # a kind's stack: [layers, *declared shape]
            assert {n: a.shape[1:] for n, a in tree.items()} == {
                n: d.shape for n, d in decls[key].items()
            }
        else:
            assert tree.shape == decls[key].shape


def test_recurrent_kinds_are_declared():
    assert {n for n, k in KINDS.items() if k.recurrent} >= {"gdn", "gla", "retention"}
    assert not KINDS["attention"].recurrent


@pytest.mark.slow
def test_gla_hybrid_export_is_refused_in_one_line(tmp_path):
    """orthros_h with GLA layers, as the config accepts it: modeling_orthros.py has no GLA layer
    and fla no two-stream model, so the export is refused, naming the kind and its formats."""
    cfg = _cfg("orthros_h", ("gla", "attention"))
    params = init_params(cfg, jax.random.PRNGKey(0))
    for fmt in (None, "remote", "hf", "fla"):
        with pytest.raises(ValueError) as err:
            export_hf(str(tmp_path / "out"), cfg, params, fmt=fmt)
        msg = str(err.value)
        assert "\n" not in msg and "'gla'" in msg or "single-stream pure stacks" in msg, msg
    with pytest.raises(ValueError, match=r"'gla' layers have no remote form.*--export_format=fla"):
        export_hf(str(tmp_path / "out"), cfg, params)
    assert not (tmp_path / "out").exists()  # refused before anything is written


@pytest.mark.slow
def test_a_model_exports_to_its_source_format_by_default(tmp_path):
    """A GDN model imported from fla (model.json source_format "fla") exports back to fla with
    a plain export; without a source it would be Qwen3.5, whose refusal of a config with plain
    norms names --export_format=fla."""
    cfg = _cfg("gdn", n_layers=2)
    params = jax.tree.map(np.asarray, init_params(cfg, jax.random.PRNGKey(0)))
    checkpoint.save_model(str(tmp_path / "model"), cfg, params, source_format="fla")
    loaded = checkpoint.load_model(str(tmp_path / "model"))
    assert loaded.source_format == "fla"
    export_hf(str(tmp_path / "fla"), loaded.cfg, loaded.params, source=loaded.source_format)
    written = json.loads((tmp_path / "fla" / "config.json").read_text())
    assert written["model_type"] == "gated_deltanet"
    with pytest.raises(ValueError, match=r"a Qwen3\.5 export needs .*--export_format=fla"):
        export_hf(str(tmp_path / "hf"), loaded.cfg, loaded.params)
