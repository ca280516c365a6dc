"""ModelConfig validation (on construction, and layers/registry.validate where a model is
built), importing the config package changes nothing, and the paper-size shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest

from orthros_jax.config import ARCHITECTURES, TWO_STREAM_ARCHITECTURES, ModelConfig
from orthros_jax.layers import registry
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


# What only the registry knows: the kinds, their fit to the architecture, the implementations.
BAD_FOR_THE_REGISTRY = [
    ({"layer_types": ("mamba",)}, r"ModelConfig\.layer_types=\('mamba',\)"),
    ({"layer_types": ("gdn",)}, r"does not fit architecture 'orthros'"),
    ({"attention_impl": "flash"}, r"ModelConfig\.attention_impl='flash' is unknown"),
    (
        {"architecture": "mamba2", "kinds": {"mamba2": {"ffn": False}}, "moe": {}},
        r"ModelConfig\.moe with layer_types=\('mamba2',\)",
    ),
    ({"moe": {"ffn_cycle": ("dense",)}}, r"ModelConfig\.moe\.ffn_cycle=\('dense',\) has no routed"),
    ({"moe": {"ffn_cycle": ("moe", "sparse")}}, r"ModelConfig\.moe\.ffn_cycle=.*a non-empty cycle"),
]


@pytest.mark.parametrize("changes,field", BAD + BAD_FOR_THE_REGISTRY)
def test_bad_config_names_the_field(changes, field):
    with pytest.raises(ValueError, match=field) as e:
        registry.validate(ModelConfig(**changes))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("changes,field", BAD_FOR_THE_REGISTRY)
def test_the_registry_checks_what_the_config_cannot(changes, field):
    cfg = ModelConfig(**changes)  # a value: construction does not read the registry
    with pytest.raises(ValueError, match=field):
        init_params(cfg, jax.random.PRNGKey(0))  # building the model validates it


def test_importing_the_config_changes_nothing():
    """import orthros_jax.config imports no layers/ (nothing registers into the config), and
    importing the model and the registry afterwards changes none of the config's tables."""
    code = (
        "import sys, types\n"
        "import orthros_jax.config as c\n"
        "from orthros_jax.config import architectures, arms, kinds, moe, model\n"
        "mods = (c, architectures, arms, kinds, moe, model)\n"
        "values = lambda: [(m.__name__, k, v) for m in mods for k, v in sorted(vars(m).items())"
        " if not k.startswith('__') and not callable(v) and not isinstance(v, types.ModuleType)]\n"
        "data = lambda: [(m, k, repr(v)) for m, k, v in values()]\n"
        "before = data()\n"
        "assert not [m for m in sys.modules if m.startswith('orthros_jax.layers')], 'layers'\n"
        "import orthros_jax.model, orthros_jax.layers.registry\n"
        "assert data() == before\n"
        "tables = [(m, k) for m, k, v in values() if isinstance(v, dict | list | set)]\n"
        "assert not tables, tables  # the tables are read-only (MappingProxyType, tuples)\n"
        "print(c.ModelConfig(architecture='hybrid').layer_types)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "('gdn', 'gdn', 'gdn', 'attention')"


def test_every_kinds_options_section_is_declared_once():
    assert registry.options_disagree() == []


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


# A model.json written before the kinds had options sections (their flat, prefixed fields, read
# by a shim until the config package): refused in one line that names the nested key.
OLD_MODEL_JSON = {"architecture": "hybrid", "d_model": 32, "gdn_chunk": 16, "gla_gate_rank": 4}


def test_old_flat_model_json_is_refused_naming_the_section(tmp_path):
    from orthros_jax import checkpoint

    path = tmp_path / checkpoint.MODEL_JSON
    path.write_text(json.dumps({"model": OLD_MODEL_JSON, "tokenizer": None}))
    with pytest.raises(ValueError) as e:
        checkpoint.read_model_json(str(tmp_path))
    message = str(e.value)
    assert "\n" not in message
    assert "'gdn_chunk' (did you mean 'kinds.gdn.chunk'?)" in message
    assert "'gla_gate_rank' (did you mean 'kinds.gla.gate_rank'?)" in message


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
    from orthros_jax.config.cli import section, to_plain

    c = section(ModelConfig(architecture="hybrid"))
    c.kinds.gdn.chunk = 32
    c.kinds.gla.clamp_min = -1.0
    cfg = ModelConfig.from_dict(to_plain(c))
    assert cfg.kinds.gdn.chunk == 32 and cfg.kinds.gla.clamp_min == -1.0


def test_unknown_field_suggests_the_closest():
    with pytest.raises(ValueError, match="did you mean 'window'"):
        ModelConfig.from_dict({"windw": 3})
