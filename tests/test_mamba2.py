"""The mamba2 kind (layers/mamba2.py, mamba2_mixer.py) against what defines it: the float64
oracle (tests/oracle_mamba2.py) in sequence mode over packed documents, single- and two-stream;
transformers' Mamba2ForCausalLM (its CPU torch path) both ways, import and export, on tiny
random configs with options off their defaults; and the config checks. The behaviours every
kind shares (prefill + decode = forward, SFT, generate, the engine) are the conformance
suite's."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import oracle_mamba2
import pytest

from orthros_jax.config import ModelConfig
from orthros_jax.convert import export_hf, load_hf
from orthros_jax.convert.mamba2_hf import config_from_mamba2
from orthros_jax.layers import kind as kind_lib
from orthros_jax.layers import mamba2
from orthros_jax.layers.mamba2_mixer import Mamba2Options
from orthros_jax.model import OrthrosLM, init_params

OPTIONS = Mamba2Options(
    heads=4, head_dim=6, state=5, groups=2, conv_kernel=3, chunk=4, use_bias=True
)


def _cfg(
    architecture: str, layer_types: tuple[str, ...], o: Mamba2Options = OPTIONS
) -> ModelConfig:
    return ModelConfig(
        vocab_size=37,
        d_model=16,
        n_layers=len(layer_types),
        n_heads=2,
        n_kv_heads=1,
        head_dim=8,
        d_ff=24,
        window=4,
        architecture=architecture,
        layer_types=layer_types,
        kinds={"mamba2": o},
        init_std=0.2,
        attention_block_q=8,
        attention_block_k=8,
    )


def _layer_params(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """One layer's parameters, every one random (norms and SO off their identity)."""
    rng = np.random.default_rng(seed)
    p = {}
    for name, decl in mamba2.params(cfg).items():
        shape = decl.shape
        p[name] = rng.normal(size=shape) * (0.1 if name.endswith(("norm", "_scale")) else 0.3)
        if name.endswith(("norm", "_scale", "mamba2_d")):
            p[name] += 1.0
    p["mamba2_a_log"] = np.log(rng.uniform(1.0, 8.0, size=p["mamba2_a_log"].shape))
    return p


@pytest.mark.parametrize("two_streams", [pytest.param(False, marks=pytest.mark.slow), True])
def test_kind_equals_float64_oracle_over_packed_documents(two_streams):
    """KIND.step in sequence mode on two rows of packed documents (a reset mid kernel chunk
    and mid conv window; padding last) against the oracle, row by row, <= 1e-5 in float32.
    Two streams: orthros_h, each output copy with its own hidden state and SO."""
    cfg = _cfg("orthros_h" if two_streams else "hybrid", ("mamba2", "attention"))
    p = _layer_params(cfg, seed=1)
    rng = np.random.default_rng(2)
    t = 15
    x, xc = rng.normal(size=(2, t, 16)), rng.normal(size=(2, t, 16))
    seg = np.array([[1] * 6 + [2] * 9, [1] * 2 + [2] * 10 + [0] * 3], np.int32)
    pos = np.array([list(range(6)) + list(range(9)), [0, 1] + list(range(10)) + [0] * 3])
    base = kind_lib.Stream(jnp.asarray(x, jnp.float32), jnp.asarray(pos), jnp.asarray(seg))
    out = base.replace(x=jnp.asarray(xc, jnp.float32)) if two_streams else None
    ctx = kind_lib.StepContext(mode=kind_lib.SEQUENCE, reset=kind_lib.document_starts(base))
    pj = {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}
    step = jax.jit(lambda pj, base, out: mamba2.KIND.step(pj, cfg, base, out, None, 0, ctx))
    got, got_out, _ = step(pj, base, out)
    reset = np.asarray(ctx.reset)
    for r in range(2):
        want, want_out = oracle_mamba2.layer(
            p, x[r], reset[r], groups=2, eps=cfg.norm_eps, cross_x=xc[r] if two_streams else None
        )
        np.testing.assert_allclose(np.asarray(got.x[r]), want, atol=1e-5, rtol=0)
        if two_streams:
            np.testing.assert_allclose(np.asarray(got_out.x[r]), want_out, atol=1e-5, rtol=0)


def _hf_model(config: dict, seed: int):
    """A random transformers Mamba2ForCausalLM, every parameter moved off its init."""
    torch = pytest.importorskip("torch")
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(seed)
    model = Mamba2ForCausalLM(Mamba2Config(**config)).eval()
    with torch.no_grad():
        for name, value in model.named_parameters():
            if "A_log" not in name:
                value.add_(0.2 * torch.randn_like(value))
    return model


def _hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


# Options off transformers' defaults in every direction: groups > 1, head_dim, state and conv
# kernel other than 64 / 128 / 4, in/out biases, no conv bias, a dt limit that binds, tied head.
HF_CONFIGS = {
    "groups3_bias_tied": dict(
        vocab_size=53,
        hidden_size=24,
        num_heads=6,
        head_dim=8,
        state_size=5,
        n_groups=3,
        conv_kernel=3,
        num_hidden_layers=2,
        use_bias=True,
        use_conv_bias=False,
        chunk_size=8,
        tie_word_embeddings=True,
        time_step_limit=(0.05, 1.5),
    ),
    "groups2_conv5_untied": dict(
        vocab_size=41,
        hidden_size=16,
        num_heads=4,
        head_dim=12,
        state_size=7,
        n_groups=2,
        conv_kernel=5,
        num_hidden_layers=3,
        expand=3,
        use_bias=False,
        use_conv_bias=True,
        layer_norm_epsilon=1e-6,
        tie_word_embeddings=False,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_transformers_mamba2_import_and_export(name, tmp_path):
    """transformers' checkpoint imports with its logits (<= 1e-4); a model of ours (its own
    random weights) exports to a directory transformers loads with our logits (<= 1e-4); the
    export's config.json reads back as the same ModelConfig."""
    model = _hf_model(HF_CONFIGS[name], seed=0)
    model.save_pretrained(tmp_path / "hf")
    cfg, params = load_hf(str(tmp_path / "hf"))
    assert cfg.layer_types == ("mamba2",) and not mamba2.options(cfg).ffn
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 19))
    forward = jax.jit(lambda p, t: OrthrosLM(cfg).apply({"params": p}, t))
    got = np.asarray(forward(params, jnp.asarray(tokens)))
    np.testing.assert_allclose(got, _hf_logits(model, tokens), atol=1e-4, rtol=0)

    from transformers import Mamba2ForCausalLM

    ours = init_params(cfg, jax.random.PRNGKey(4))
    noisy = jax.tree.map(
        lambda a: a + 0.1 * jax.random.normal(jax.random.PRNGKey(5), a.shape), ours
    )
    export_hf(str(tmp_path / "out"), cfg, noisy)
    with open(tmp_path / "out" / "config.json") as f:
        assert config_from_mamba2(json.load(f)) == cfg
    reloaded = Mamba2ForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    want = np.asarray(forward(noisy, jnp.asarray(tokens)))
    np.testing.assert_allclose(_hf_logits(reloaded, tokens), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(expand=3), "hidden_size \\* expand"),
        (dict(use_mambapy=True), "keys we do not know"),
    ],
)
def test_unsupported_mamba2_configs_are_refused_by_name(change, match):
    hf = dict(model_type="mamba2", hidden_size=16, num_heads=4, head_dim=8, expand=2, n_groups=2)
    with pytest.raises(ValueError, match=match):
        config_from_mamba2(hf | change)


def test_only_a_pure_stack_without_ffn_exports_as_mamba2(tmp_path):
    """Refused before any parameter is read (so no params are needed)."""
    for cfg in (
        _cfg("hybrid", ("mamba2", "attention")),
        _cfg("mamba2", ("mamba2",)),  # with the FFN
    ):
        with pytest.raises(ValueError, match="Mamba2ForCausalLM export needs a pure mamba2"):
            export_hf(str(tmp_path), cfg, {})


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(groups=3), "heads=4 must be a multiple of groups=3"),
        (dict(state=0), "state must be a positive int"),
        (dict(dt_limit=(0.5, 0.1)), "dt_limit"),
    ],
)
def test_option_checks_name_the_field(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(OPTIONS, **change)
    with pytest.raises(ValueError, match=match):  # through the config, as model.json gives it
        ModelConfig(architecture="mamba2", kinds={"mamba2": OPTIONS.to_dict() | change})


def test_no_ffn_block_has_only_its_pre_norm():
    cfg = _cfg("mamba2", ("mamba2",), dataclasses.replace(OPTIONS, ffn=False))
    names = set(mamba2.params(cfg))
    assert "attn_norm" in names and not names & {"mlp_norm", "w_gate", "w_up", "w_down"}
