"""flash-linear-attention checkpoints (convert/fla.py): models made and saved by fla itself
(tests/fla_reference.py: fla's classes, naive torch ops for Triton) import with equal logits
(<= 1e-4), export back to a directory fla's from_pretrained loads with the same logits, and
options we do not compute are refused by name."""

from __future__ import annotations

import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("fla") is None:  # found, not imported (see fla_reference)
    pytest.skip(
        "flash-linear-attention is not installed (the convert extra)", allow_module_level=True
    )
import fla_reference  # noqa: E402

from orthros_jax.convert import export_hf, load_hf  # noqa: E402
from orthros_jax.convert.fla import fla_tensor_shapes  # noqa: E402
from orthros_jax.convert.fla_config import config_from_fla, d_ff_of  # noqa: E402
from orthros_jax.convert.hf_weights import SafetensorsCheckpoint  # noqa: E402
from orthros_jax.model import OrthrosLM  # noqa: E402
from orthros_jax.model import num_params as model_num_params  # noqa: E402

ATOL = 1e-4
V, T = 61, 19
MODELS = {
    # GQA (2 kv heads), short conv 3, clamp_min, unfused norm (fla names it g_norm)
    "gla": (
        "gla",
        dict(
            num_heads=4,
            num_kv_heads=2,
            expand_k=1.0,
            expand_v=0.75,
            use_short_conv=True,
            conv_size=3,
            clamp_min=-0.2,
            fuse_norm=False,
        ),
    ),
    # fla's defaults (4 heads, expand_k 0.5, expand_v 1, output gate, no conv), tied head
    "gla_default": ("gla", dict(tie_word_embeddings=True)),
    "gla_relu_nogate": (
        "gla",
        dict(num_heads=2, feature_map="relu", use_output_gate=False, elementwise_affine=False),
    ),
    # GQA, expand_v 2 (value heads twice the key heads' dim), RetNet's hidden_ratio 2
    "retnet": ("retnet", dict(num_heads=4, num_kv_heads=2, hidden_ratio=2)),
    "retnet_swish": ("retnet", dict(num_heads=2, feature_map="swish", expand_v=1.0)),
    # GVA (4 value heads over 2 q/k heads), dv = 2 dk, conv 3, hidden_ratio 2
    "gdn": (
        "gated_deltanet",
        dict(num_heads=2, num_v_heads=4, head_dim=8, expand_v=2.0, conv_size=3, hidden_ratio=2),
    ),
    "gdn_tied": (
        "gated_deltanet",
        dict(num_heads=2, head_dim=8, expand_v=1.0, tie_word_embeddings=True, intermediate_size=40),
    ),
}
COMMON = dict(hidden_size=32, num_hidden_layers=2, vocab_size=V)


def our_logits(cfg, params, tokens):
    fn = jax.jit(lambda p, t: OrthrosLM(cfg).apply({"params": p}, t))
    return np.asarray(fn(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens)))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fla_checkpoint_logits_and_export(name, tmp_path):
    model_type, options = MODELS[name]
    model = fla_reference.build(model_type, **COMMON, **options)
    model.save_pretrained(tmp_path / "fla")
    tokens = np.random.default_rng(1).integers(0, V, (2, T))
    want = fla_reference.logits(model, tokens)

    cfg, params = load_hf(str(tmp_path / "fla"))
    assert cfg.architecture == {"gated_deltanet": "gdn"}.get(model_type, model_type)
    np.testing.assert_allclose(our_logits(cfg, params, tokens), want, atol=ATOL, rtol=0)

    export_hf(str(tmp_path / "out"), cfg, params, fmt="fla")
    hf = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config_from_fla(hf) == cfg
    back = SafetensorsCheckpoint(str(tmp_path / "out"))
    assert {n: tuple(back.shape(n)) for n in back} == fla_tensor_shapes(cfg)
    reloaded = type(model).from_pretrained(str(tmp_path / "out")).float().eval()
    np.testing.assert_allclose(fla_reference.logits(reloaded, tokens), want, atol=1e-6, rtol=0)


def test_d_ff_rule():
    """fla's GatedMLP: 256 * ceil(int(D * ratio * 2/3) / 256), unless intermediate_size."""
    assert d_ff_of({"hidden_size": 2048, "hidden_ratio": 4}) == 5632
    assert d_ff_of({"hidden_size": 2048}) == 5632
    assert d_ff_of({"hidden_size": 1024, "hidden_ratio": 2}) == 1536
    assert d_ff_of({"hidden_size": 1024, "intermediate_size": 100}) == 100


BASE = {"model_type": "gla", "hidden_size": 64, "num_heads": 4, "vocab_size": 10}


@pytest.mark.parametrize(
    "change,match",
    [
        ({"model_type": "rwkv7"}, "model_type 'rwkv7' is unsupported"),
        ({"fancy_option": 1}, r"option\(s\) \['fancy_option'\]"),
        ({"attn": {"layers": [1], "num_heads": 4}}, "option attn="),
        ({"attnres_block_size": 4}, "attnres_block_size=4"),
        ({"hidden_act": "powlu"}, "hidden_act='powlu'"),
        ({"use_l2warp": True}, "use_l2warp=True"),
        ({"expand_k": 0.3}, "expand_k"),
        ({"feature_map": "hedgehog"}, "kinds.gla.feature_map='hedgehog'"),
        ({"model_type": "gated_deltanet", "use_gate": False}, "use_gate=False"),
        ({"model_type": "gated_deltanet", "allow_neg_eigval": True}, "allow_neg_eigval=True"),
        ({"model_type": "gated_deltanet", "use_short_conv": False}, "use_short_conv=False"),
        ({"model_type": "gated_deltanet", "output_gate_activation": "sigmoid"}, "sigmoid"),
        ({"model_type": "retnet", "use_gk": True}, r"option\(s\) \['use_gk'\]"),
    ],
)
def test_unsupported_options_are_refused_by_name(change, match):
    hf = dict(BASE)
    if change.get("model_type") == "gated_deltanet":
        hf = {"model_type": "gated_deltanet", "hidden_size": 64, "num_heads": 2, "head_dim": 16}
    hf.update(change)
    with pytest.raises(ValueError, match=match):
        config_from_fla(hf)


@pytest.mark.parametrize("arm", ["gla", "retnet", "gdn"])
def test_1p3b_configs_are_flas_1p3b_models(arm):
    """configs/pt_1p3b_{arm}.py: fla's own 1.3B model (its config defaults, built on the meta
    device) has exactly our parameter count; the recipe is pt_1p3b.py's."""
    import os

    import torch

    from orthros_jax.config import ModelConfig, cli

    configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
    c = cli.load_config_file(os.path.join(configs, f"pt_1p3b_{arm}.py:100b"))
    ref = cli.load_config_file(os.path.join(configs, "pt_1p3b.py:100b"))
    cfg = ModelConfig.from_dict(c.model)
    models = fla_reference.fla_models()
    cls, cfg_cls = {
        "gla": (models.GLAForCausalLM, models.GLAConfig),
        "retnet": (models.RetNetForCausalLM, models.RetNetConfig),
        "gdn": (models.GatedDeltaNetForCausalLM, models.GatedDeltaNetConfig),
    }[arm]
    with torch.device("meta"):
        fla_count = sum(p.numel() for p in cls(cfg_cls()).parameters())
    assert cfg.architecture == arm and model_num_params(cfg) == fla_count
    tokens = c.data.batch_size * c.data.seq_len * c.optimizer.grad_accum_steps  # per update
    assert (c.train.steps, tokens) == (47_683, 2_097_152)
    for name in ("data", "optimizer", "train", "mesh"):
        assert cli.to_plain(c[name]) == cli.to_plain(ref[name]), name


@pytest.mark.slow
def test_convert_cli_fla_round_trip(tmp_path):
    """launch/convert.py --hf_dir on fla's RetNet checkpoint (its own arm), then --export back
    to fla's format: fla loads the export with the same logits; an Orthros conversion of a pure
    linear-attention checkpoint is refused with the flag to use."""
    import os
    import subprocess
    import sys

    from orthros_jax import checkpoint

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    model = fla_reference.build("retnet", **COMMON, num_heads=2)
    model.save_pretrained(tmp_path / "fla")
    run = lambda *args: subprocess.run(
        [sys.executable, os.path.join(root, "launch", "convert.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    proc = run(f"--hf_dir={tmp_path / 'fla'}", f"--out={tmp_path / 'model'}", "--architecture=own")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert checkpoint.load_model(str(tmp_path / "model")).cfg.architecture == "retnet"
    proc = run("--export", f"--model={tmp_path / 'model'}", f"--out={tmp_path / 'back'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tokens = np.random.default_rng(2).integers(0, V, (1, T))
    reloaded = type(model).from_pretrained(str(tmp_path / "back")).float().eval()
    np.testing.assert_allclose(
        fla_reference.logits(reloaded, tokens), fla_reference.logits(model, tokens), atol=1e-6
    )
    proc = run(f"--hf_dir={tmp_path / 'fla'}", f"--out={tmp_path / 'o'}", "--architecture=orthros")
    assert proc.returncode != 0 and "--architecture=own" in proc.stderr


@pytest.mark.parametrize(
    "model_type,options",
    [
        ("gla", dict(num_heads=4, num_kv_heads=2, use_short_conv=True, clamp_min=-0.05)),
        ("gla", dict(num_heads=2, feature_map="relu", fuse_norm=False)),
        ("retnet", dict(num_heads=4, num_kv_heads=2)),
    ],
)
def test_the_float64_oracle_is_flas_layer(model_type, options):
    """oracle_linear's mixers (the equations our kinds are tested against) give fla's own layer
    outputs (its module, naive ops for Triton) to float32 rounding."""
    import torch
    from oracle_linear import gla_mixer, retention_mixer

    model = fla_reference.build(model_type, **COMMON, **options)
    a = model.model.layers[0].attn
    d, n, k, h, e = 32, a.num_heads, a.num_kv_heads, a.head_k_dim, a.head_v_dim
    w = lambda lin, *shape: lin.weight.detach().double().numpy().T.reshape(*shape)
    pre = "gla" if model_type == "gla" else "retention"
    p = {
        f"{pre}_wq": w(a.q_proj, d, n, h),
        f"{pre}_wk": w(a.k_proj, d, k, h),
        f"{pre}_wv": w(a.v_proj, d, k, e),
        f"{pre}_wg": w(a.g_proj, d, n, e),
        f"{pre}_out": w(a.o_proj, n, e, d),
    }
    norm = a.g_norm_swish_gate if a.fuse_norm_and_gate else a.g_norm
    p[f"{pre}_norm"] = norm.weight.detach().double().numpy()
    if model_type == "gla":
        p["gla_wgk1"] = w(a.gk_proj[0], d, -1)
        p["gla_wgk2"] = w(a.gk_proj[1], -1, k, h)
        p["gla_bgk"] = a.gk_proj[1].bias.detach().double().numpy().reshape(k, h)
        if a.use_short_conv:
            for x, conv, heads, dim in (
                ("q", a.q_conv1d, n, h),
                ("k", a.k_conv1d, k, h),
                ("v", a.v_conv1d, k, e),
            ):
                p[f"gla_conv_{x}"] = (
                    conv.weight.detach().double().numpy()[:, 0].T.reshape(-1, heads, dim)
                )
    x = np.random.default_rng(5).normal(size=(1, 11, d))
    with torch.no_grad():
        got = a(torch.from_numpy(x).float())[0].double().numpy()[0]
    if model_type == "gla":
        want = gla_mixer(
            p,
            x[0],
            1e-6,
            feature_map=options.get("feature_map"),
            clamp_min=options.get("clamp_min"),
        )
    else:
        want = retention_mixer(p, x[0], 1e-6)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-4)
