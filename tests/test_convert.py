"""HF Llama/Qwen3 import, Transformer -> Orthros conversion and export, against transformers.

Tiny random models (hidden 64, 2 layers, 4 heads, 2 kv heads, vocab 128) are built and saved
in the test; nothing is downloaded. References run in torch fp32 with eager attention.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from helpers import our_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


from orthros_jax.config import ModelConfig  # noqa: E402
from orthros_jax.convert import (  # noqa: E402
    SafetensorsCheckpoint,
    config_from_hf,
    export_hf,
    from_transformer,
    hf_config_from,
    hf_from_params,
    load_hf,
)

REF: dict[str, np.ndarray] = {}  # variant -> HF fp32 logits of `tokens`, filled by hf_dirs
T = 24  # tokens per row; windows >= T make Orthros equal the Transformer
ATOL = 1e-4
TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    initializer_range=0.1,  # logits of order 1, so an agreement at 1e-4 means something
    rms_norm_eps=1e-5,
)
VARIANTS = {
    "llama_untied": ("llama", dict(tie_word_embeddings=False), {}),
    "llama_tied": ("llama", dict(tie_word_embeddings=True), {}),
    # head_dim 24 != hidden/heads: Qwen3's explicit head_dim must be honoured.
    "qwen3_untied": ("qwen3", dict(tie_word_embeddings=False, head_dim=24), {}),
    "qwen3_tied": ("qwen3", dict(tie_word_embeddings=True, head_dim=16), {}),
    "llama_bf16": ("llama", dict(tie_word_embeddings=False), dict(bf16=True)),
    "qwen3_sharded": ("qwen3", dict(head_dim=16), dict(max_shard_size="40KB")),
    "llama3_rope": (
        "llama",
        dict(
            rope_theta=500.0,
            max_position_embeddings=64,
            rope_scaling=dict(
                rope_type="llama3",
                factor=4.0,
                low_freq_factor=1.0,
                high_freq_factor=2.0,
                original_max_position_embeddings=16,
            ),
        ),
        {},
    ),
}


def _hf_model(kind: str, extra: dict, seed: int):
    torch.manual_seed(seed)
    if kind == "llama":
        conf = transformers.LlamaConfig(**TINY, **extra)
        model = transformers.LlamaForCausalLM(conf)
    else:
        conf = transformers.Qwen3Config(**TINY, **extra)
        model = transformers.Qwen3ForCausalLM(conf)
    with torch.no_grad():  # norms start at 1; perturb them so a misplaced norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def _hf_logits(hf_dir: str, tokens: np.ndarray) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).logits.numpy()


def _logits(cfg: ModelConfig, params, tokens: np.ndarray) -> np.ndarray:
    return our_logits(cfg, params, tokens)


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(0, TINY["vocab_size"], (2, T)).astype(np.int64)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory, tokens) -> dict[str, str]:
    """{variant: HF directory written by save_pretrained}; reference logits in REF."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for i, (name, (kind, extra, save)) in enumerate(VARIANTS.items()):
        model = _hf_model(kind, extra, seed=i)
        if save.get("bf16"):
            model = model.to(torch.bfloat16)
        kwargs = {"max_shard_size": save["max_shard_size"]} if "max_shard_size" in save else {}
        model.save_pretrained(str(root / name), **kwargs)
        out[name] = str(root / name)
        if save.get("bf16"):  # .to(bf16) also rounded the RoPE buffer: load fp32 from disk
            REF[name] = _hf_logits(out[name], tokens)
        else:
            with torch.no_grad():
                REF[name] = model(torch.from_numpy(tokens)).logits.numpy()
    return out


def test_sharded_and_bf16_layouts_are_what_they_claim(hf_dirs):
    assert os.path.isfile(os.path.join(hf_dirs["qwen3_sharded"], "model.safetensors.index.json"))
    assert not os.path.exists(os.path.join(hf_dirs["qwen3_sharded"], "model.safetensors"))
    ckpt = SafetensorsCheckpoint(hf_dirs["llama_bf16"])
    assert {ckpt.dtype(n) for n in ckpt} == {"BF16"}
    assert ckpt["model.norm.weight"].dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_import_matches_transformers(hf_dirs, tokens, variant):
    cfg, params = load_hf(hf_dirs[variant])
    assert cfg.architecture == "transformer"
    assert cfg.qk_norm == variant.startswith("qwen3")
    assert cfg.tie_embeddings == ("lm_head" not in params)
    if variant == "llama3_rope":
        assert (cfg.rope_type, cfg.rope_factor, cfg.rope_original_max_position) == ("llama3", 4, 16)
    ours = _logits(cfg, params, tokens)
    ref = REF[variant]
    assert np.abs(ref).max() > 0.5  # a real signal, not near-zero logits
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)


def test_bf16_import_keeps_bf16_values_exactly(hf_dirs):
    cfg, params = load_hf(hf_dirs["llama_bf16"], param_dtype="bfloat16")
    assert params["layers"]["wq"].dtype == ml_dtypes.bfloat16
    ckpt = SafetensorsCheckpoint(hf_dirs["llama_bf16"])
    back = hf_from_params(params, cfg)
    for name in ckpt:
        np.testing.assert_array_equal(back[name].view(np.uint16), ckpt[name].view(np.uint16))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["llama_untied", "qwen3_tied"])
def test_converted_orthros_equals_transformer_iff_window_covers(hf_dirs, tokens, variant):
    cfg, params = load_hf(hf_dirs[variant])
    ref = REF[variant]
    ocfg, oparams = from_transformer(params, cfg, window=T)
    assert ocfg.architecture == "orthros" and ocfg.scale_offset and ocfg.window == T
    so = oparams["layers"]["so_out_scale"]
    assert so.shape == (cfg.n_layers, cfg.n_heads, cfg.head_dim) and np.all(so == 1)
    assert np.all(oparams["layers"]["so_base_offset"] == 0)
    assert "so_base_scale" not in params["layers"]  # the input is not modified
    np.testing.assert_allclose(_logits(ocfg, oparams, tokens), ref, atol=ATOL, rtol=0)
    small_cfg, small = from_transformer(params, cfg, window=4)
    diff = np.abs(_logits(small_cfg, small, tokens) - ref)
    np.testing.assert_allclose(diff[:, :4], 0, atol=ATOL)  # the first w tokens see everything
    assert diff[:, 8:].max() > 1e-2
    wo_cfg, wo = from_transformer(params, cfg, window=T, scale_offset=False)
    assert not wo_cfg.scale_offset and wo["layers"].keys() == params["layers"].keys()


@pytest.mark.parametrize("variant", ["llama_tied", "qwen3_untied", "llama3_rope"])
def test_export_loads_in_transformers_and_round_trips(hf_dirs, tokens, tmp_path, variant):
    cfg, params = load_hf(hf_dirs[variant])
    out = str(tmp_path / "export")
    export_hf(out, cfg, params)
    np.testing.assert_allclose(_hf_logits(out, tokens), REF[variant], atol=ATOL, rtol=0)
    original, exported = SafetensorsCheckpoint(hf_dirs[variant]), SafetensorsCheckpoint(out)
    assert set(exported) == set(original)
    for name in original:  # export∘import is the identity on the HF tensors
        np.testing.assert_array_equal(exported[name], original[name], err_msg=name)
    cfg2, params2 = load_hf(out)  # import∘export is the identity on our tensors
    assert cfg2 == cfg
    flat = lambda p: {**{k: v for k, v in p.items() if k != "layers"}, **p["layers"]}
    assert flat(params2).keys() == flat(params).keys()
    for key, value in flat(params).items():
        np.testing.assert_array_equal(flat(params2)[key], value, err_msg=key)


def test_export_sharded_bf16(hf_dirs, tokens, tmp_path):
    cfg, params = load_hf(hf_dirs["llama_bf16"])
    out = str(tmp_path / "export")
    files = export_hf(out, cfg, params, dtype="bfloat16", max_shard_bytes=30_000)
    assert "model.safetensors.index.json" in files and len(files) > 3
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["torch_dtype"] == "bfloat16"
    original, exported = SafetensorsCheckpoint(hf_dirs["llama_bf16"]), SafetensorsCheckpoint(out)
    for name in original:
        np.testing.assert_array_equal(
            exported[name].view(np.uint16), original[name].view(np.uint16)
        )
    np.testing.assert_allclose(_hf_logits(out, tokens), REF["llama_bf16"], atol=ATOL, rtol=0)


def test_config_round_trip_both_rope_layouts():
    cfg = ModelConfig(
        architecture="transformer",
        scale_offset=False,
        qk_norm=True,
        tie_embeddings=True,
        rope_type="llama3",
        rope_factor=8.0,
        rope_theta=5e5,
        rope_original_max_position=8192,
        norm_eps=1e-5,
        head_dim=48,
    )
    legacy = hf_config_from(cfg)
    assert legacy["architectures"] == ["Qwen3ForCausalLM"] and "rope_parameters" not in legacy
    assert config_from_hf(legacy, window=cfg.window) == cfg
    # transformers 5 layout: everything under rope_parameters, no top-level rope_theta.
    new = {k: v for k, v in legacy.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {**legacy["rope_scaling"], "rope_theta": 5e5}
    assert config_from_hf(new, window=cfg.window) == cfg
    orthros = config_from_hf(legacy, architecture="orthros", window=64)
    assert orthros == cfg.replace(architecture="orthros", scale_offset=True, window=64)


def test_reading_needs_no_torch(hf_dirs):
    """The import path works with torch and transformers unimportable."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from orthros_jax.convert import load_hf\n"
        f"cfg, p = load_hf({hf_dirs['qwen3_sharded']!r})\n"
        f"cfg, p = load_hf({hf_dirs['llama_bf16']!r})\n"
        "print(p['layers']['wq'].dtype)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "float32"


@pytest.mark.slow
def test_converted_orthros_prefill_decode_match_its_forward(hf_dirs, tokens):
    variant = "qwen3_tied"  # q/k norm and a tied head: the most that differs from the core tests
    from orthros_jax import inference

    cfg, params = load_hf(hf_dirs[variant])
    # window 5 < prompt lengths and prefill chunks of 8, so the cache's window reads matter.
    ocfg, oparams = from_transformer(params, cfg, window=5)
    ocfg = ocfg.replace(prefill_chunk=8)
    want = _logits(ocfg, oparams, tokens)  # [B, T, V]
    lengths, rows, n_decode = np.array([7, 13]), np.arange(2), 6
    cache = inference.init_cache(ocfg, 2, T)
    logits, cache = inference.prefill(oparams, cache, tokens[:, :13], lengths, ocfg)
    np.testing.assert_allclose(np.asarray(logits), want[rows, lengths - 1], atol=1e-5, rtol=0)
    for i in range(n_decode):
        logits, cache = inference.decode_step(oparams, cache, tokens[rows, lengths + i], ocfg)
        np.testing.assert_allclose(np.asarray(logits), want[rows, lengths + i], atol=1e-5, rtol=0)
