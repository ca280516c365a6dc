"""launch/convert.py end to end: HF directory -> model directory (-> HF directory again).

Tiny random HF models with a tiny word-level tokenizer.json are built here; nothing is
downloaded. The CLI runs in a subprocess, as a user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from orthros_jax import checkpoint  # noqa: E402
from orthros_jax.convert import SafetensorsCheckpoint  # noqa: E402
from orthros_jax.model import OrthrosLM  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 128
T = 20
ATOL = 1e-4
TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    initializer_range=0.1,
)
WORDS = ["<|endoftext|>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 2)]


def write_tokenizer(path: str) -> None:
    """A word-level tokenizer.json over WORDS (ids 0..VOCAB-1), split on whitespace."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()  # joins tokens with spaces
    tok.save(path)


def make_hf_dir(path: str, kind: str) -> tuple[str, np.ndarray, np.ndarray]:
    """Saves a tiny HF model + tokenizer.json; returns (dir, tokens [2, T], fp32 logits)."""
    torch.manual_seed(0)
    if kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(
            transformers.Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=True)
        )
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    model.eval().save_pretrained(path)
    write_tokenizer(os.path.join(path, "tokenizer.json"))
    tokens = np.random.default_rng(1).integers(2, VOCAB, (2, T))
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens)).logits.numpy()
    return path, tokens, logits


def run_cli(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    if check:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return make_hf_dir(str(tmp_path_factory.mktemp("hf") / "qwen3"), "qwen3")


@pytest.fixture(scope="module")
def orthros_dir(qwen3, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("models") / "qwen3_orthros")
    run_cli("convert.py", f"--hf_dir={qwen3[0]}", f"--out={out}", f"--window={T}")
    return out


def test_import_to_orthros_model_dir(qwen3, orthros_dir):
    hf_dir, tokens, ref = qwen3
    loaded = checkpoint.load_model(orthros_dir)
    cfg = loaded.cfg
    assert (cfg.architecture, cfg.window, cfg.qk_norm, cfg.tie_embeddings) == (
        "orthros", T, True, True,
    )  # fmt: skip
    assert loaded.tokenizer_file == os.path.join(orthros_dir, "tokenizer.json")
    with open(loaded.tokenizer_file) as a, open(os.path.join(hf_dir, "tokenizer.json")) as b:
        assert a.read() == b.read()
    logits = OrthrosLM(cfg).apply({"params": loaded.params}, jnp.asarray(tokens))
    np.testing.assert_allclose(np.asarray(logits), ref, atol=ATOL, rtol=0)


def test_import_transformer_then_export(tmp_path):
    hf_dir, tokens, ref = make_hf_dir(str(tmp_path / "llama"), "llama")
    model_dir, out = str(tmp_path / "model"), str(tmp_path / "exported")
    run_cli("convert.py", f"--hf_dir={hf_dir}", f"--out={model_dir}", "--architecture=transformer")
    assert checkpoint.load_model(model_dir).cfg.architecture == "transformer"
    run_cli("convert.py", "--export", f"--model={model_dir}", f"--out={out}")
    assert os.path.isfile(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["architectures"] == ["LlamaForCausalLM"]
    original, exported = SafetensorsCheckpoint(hf_dir), SafetensorsCheckpoint(out)
    assert set(original) == set(exported)
    for name in original:
        np.testing.assert_array_equal(exported[name], original[name], err_msg=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    with torch.no_grad():
        logits = model.eval()(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(logits, ref, atol=ATOL, rtol=0)


def test_cli_errors_are_messages_not_tracebacks(orthros_dir, tmp_path):
    done = run_cli(
        "convert.py", "--export", f"--model={orthros_dir}", f"--out={tmp_path}/x", check=False
    )
    assert done.returncode != 0
    assert "only architecture='transformer' exports" in done.stderr
    assert "Traceback" not in done.stderr
    (tmp_path / "moe").mkdir()
    moe = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 8}
    (tmp_path / "moe" / "config.json").write_text(json.dumps(moe))
    done = run_cli("convert.py", f"--hf_dir={tmp_path}/moe", f"--out={tmp_path}/y", check=False)
    assert done.returncode != 0 and "Qwen3MoeForCausalLM" in done.stderr
