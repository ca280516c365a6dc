"""ModelConfig validation and the paper-size shapes."""

from __future__ import annotations

import jax
import pytest

from orthros_jax.config import ARCHITECTURES, TWO_STREAM_ARCHITECTURES, ModelConfig
from orthros_jax.model import init_params, num_params

BAD = [
    ({"n_heads": 6, "n_kv_heads": 4}, "n_kv_heads"),
    ({"head_dim": 15}, "head_dim"),
    ({"window": 0}, "window"),
    ({"architecture": "mamba"}, "architecture"),
    ({"architecture": "transformer", "scale_offset": True}, "scale_offset"),
    ({"n_layers": 3, "layer_types": ("attention", "attention")}, "layer_types"),
    ({"layer_types": ("mamba",)}, "layer_types"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ({"head_dim": 10, "partial_rotary_factor": 0.05}, "partial_rotary_factor"),  # int(0.5) = 0
    ({"attention_impl": "flash"}, "attention_impl"),
    ({"remat": "some"}, "remat"),
    ({"dtype": "float8"}, "dtype"),
    ({"rope_type": "yarn"}, "rope_type"),
    ({"d_model": -4}, "d_model"),
    ({"norm_eps": 0.0}, "norm_eps"),
    ({"kinds": {"gdn": {"chunk": 0}}}, r"kinds\.gdn\.chunk must be a positive int"),
    ({"kinds": {"gdn": {"num_k_heads": 2, "num_v_heads": 3}}}, r"kinds\.gdn\.num_v_heads=3"),
    ({"kinds": {"gla": {"feature_map": "elu"}}}, r"kinds\.gla\.feature_map='elu' is unknown"),
    ({"kinds": {"gla": {"chunk": True}}}, r"kinds\.gla\.chunk must be a positive int"),
    (
        {"kinds": {"gdn": {"chunks": 8}}},
        r"ModelConfig\.kinds\.gdn.*'chunks' \(did you mean 'chunk'",
    ),
    ({"kinds": {"mamba": {}}}, r"layer kind\(s\) in ModelConfig\.kinds 'mamba'"),
]


@pytest.mark.parametrize("changes,field", BAD)
def test_bad_config_names_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**changes)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_defaults_are_valid_for_every_arm(arch):
    cfg = ModelConfig(architecture=arch)
    assert cfg.scale_offset == (arch in TWO_STREAM_ARCHITECTURES)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="d_modle"):
        ModelConfig.from_dict({"d_modle": 3})
    assert ModelConfig.from_dict({"d_model": 64}).d_model == 64


# 1.3B (Table 1/5 scale) and Llama3.1-8B-shaped Orthros: shapes only, nothing allocated.
PAPER_SIZES = {
    "1.3B": ModelConfig(
        vocab_size=50_304,
        d_model=2048,
        n_layers=24,
        n_heads=16,
        n_kv_heads=16,
        head_dim=128,
        d_ff=5504,
        window=128,
        dtype="bfloat16",
    ),
    "llama3.1-8B": ModelConfig(
        vocab_size=128_256,
        d_model=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        head_dim=128,
        d_ff=14_336,
        window=128,
        rope_theta=500_000.0,
        rope_type="llama3",
        rope_factor=8.0,
        dtype="bfloat16",
    ),
}


@pytest.mark.parametrize("name", list(PAPER_SIZES))
def test_paper_size_shapes(name):
    cfg = PAPER_SIZES[name]
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    total = sum(x.size for x in jax.tree.leaves(shapes))
    assert total == num_params(cfg)
    assert shapes["layers"]["wq"].shape == (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.head_dim)
    if name == "llama3.1-8B":
        # 8.03B for Llama-3.1-8B plus the four SO vectors per layer.
        so = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim
        assert total - so == 8_030_261_248


def test_layer_slots_number_each_kinds_layers_in_order():
    cfg = ModelConfig(architecture="hybrid", n_layers=6, layer_types=("gdn", "attention", "gdn"))
    assert cfg.layer_slots() == (
        ("gdn", 0),
        ("attention", 0),
        ("gdn", 1),
        ("gdn", 2),
        ("attention", 1),
        ("gdn", 3),
    )
    assert all(
        cfg.layer_index(c, j) == cfg.layer_slots()[3 * c + j][1] for c in (0, 1) for j in (0, 1, 2)
    )


def test_partial_rotary_follows_transformers_rule():
    """rope_dim = int(head_dim * factor) (odd allowed); two rotated dims per frequency."""
    cfg = ModelConfig(head_dim=12, partial_rotary_factor=0.25)
    assert (cfg.rope_dim, cfg.rotary_dim) == (3, 4)
    assert (ModelConfig(head_dim=10, partial_rotary_factor=0.3).rotary_dim) == 4  # int(3.0) = 3
    assert ModelConfig(head_dim=32).rotary_dim == 32


# A model.json written before the kinds had options sections: their flat, prefixed fields.
OLD_MODEL_JSON = {
    "architecture": "orthros_h",
    "layer_types": ["gla", "attention"],
    "d_model": 32,
    "gdn_num_k_heads": 1,
    "gdn_num_v_heads": 3,
    "gdn_k_head_dim": 8,
    "gdn_v_head_dim": 6,
    "gdn_conv_kernel": 3,
    "gdn_chunk": 16,
    "gla_heads": 2,
    "gla_kv_heads": 1,
    "gla_k_head_dim": 8,
    "gla_v_head_dim": 4,
    "gla_gate_rank": 4,
    "gla_gate_normalizer": 8.0,
    "gla_clamp_min": -0.5,
    "gla_short_conv": True,
    "gla_conv_kernel": 2,
    "gla_feature_map": "relu",
    "gla_output_gate": False,
    "gla_norm_affine": False,
    "gla_chunk": 8,
    "retention_heads": 2,
    "retention_kv_heads": 2,
    "retention_k_head_dim": 4,
    "retention_v_head_dim": 4,
    "retention_feature_map": None,
    "retention_output_gate": True,
    "retention_norm_affine": True,
    "retention_chunk": 32,
}


def test_old_flat_model_json_loads_into_the_kinds_sections(tmp_path):
    import json

    from orthros_jax import checkpoint

    path = tmp_path / checkpoint.MODEL_JSON
    path.write_text(json.dumps({"model": OLD_MODEL_JSON, "tokenizer": None}))
    cfg, _ = checkpoint.read_model_json(str(tmp_path))
    for key, value in OLD_MODEL_JSON.items():
        kind, _, name = key.partition("_")
        if kind in ("gdn", "gla", "retention"):
            assert getattr(cfg.kinds[kind], name) == value, key
    assert cfg.layer_types == ("gla", "attention") and cfg.d_model == 32
    # Written back, the sections are nested, and read again they are the same config.
    nested = cfg.to_dict()
    assert nested["kinds"]["gla"]["gate_rank"] == 4 and "gla_gate_rank" not in nested
    assert ModelConfig.from_dict(json.loads(json.dumps(nested))) == cfg


def test_kinds_sections_replace_merges_and_hash():
    cfg = ModelConfig(architecture="gdn", kinds={"gdn": {"chunk": 8, "k_head_dim": 16}})
    assert (cfg.kinds.gdn.chunk, cfg.kinds.gdn.k_head_dim, cfg.kinds.gdn.v_head_dim) == (8, 16, 32)
    changed = cfg.replace(kinds={"gdn": {"chunk": 32}})
    assert (changed.kinds.gdn.chunk, changed.kinds.gdn.k_head_dim) == (32, 16)
    assert changed != cfg and hash(cfg.replace(kinds={"gdn": {"chunk": 8}})) == hash(cfg)
    assert (
        "kinds.gdn.chunk" in cfg.runtime_keys() and "kinds.gdn.k_head_dim" not in cfg.runtime_keys()
    )
    assert cfg.flat()["kinds.gdn.k_head_dim"] == 16


def test_kinds_options_override_from_the_command_line():
    """A config section built from a ModelConfig has every kind's options, so the CLI's
    --config.model.kinds.gdn.chunk=32 style overrides reach them."""
    from orthros_jax.configlib import section, to_plain

    c = section(ModelConfig(architecture="hybrid"))
    c.kinds.gdn.chunk = 32
    c.kinds.gla.clamp_min = -1.0
    cfg = ModelConfig.from_dict(to_plain(c))
    assert cfg.kinds.gdn.chunk == 32 and cfg.kinds.gla.clamp_min == -1.0


def test_unknown_field_suggests_the_closest():
    with pytest.raises(ValueError, match="did you mean 'window'"):
        ModelConfig.from_dict({"windw": 3})
