"""launch/convert.py end to end: HF directory -> model directory (-> HF directory again).

Tiny random HF models with a tiny word-level tokenizer.json are built here; nothing is
downloaded. The CLI runs in a subprocess, as a user runs it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import our_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from orthros_jax import checkpoint  # noqa: E402
from orthros_jax.convert import SafetensorsCheckpoint  # noqa: E402

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
CHARS = [chr(i) for i in range(32, 127)] + ["\n", "\t"]
PROMPT = "def main("


def write_tokenizer(path: str) -> None:
    """A character-level tokenizer.json (BPE without merges): <|endoftext|>, <unk>, ASCII."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<|endoftext|>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()  # concatenates the characters back
    tok.save(path)


def make_hf_dir(path: str, kind: str) -> tuple[str, np.ndarray, np.ndarray]:
    """Saves a tiny HF model + tokenizer.json; returns (dir, tokens [2, T], fp32 logits)."""
    torch.manual_seed(0)
    if kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(
            transformers.Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=True)
        )
    else:
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(**TINY, max_position_embeddings=512)
        )
    model.eval().save_pretrained(path)
    write_tokenizer(os.path.join(path, "tokenizer.json"))
    tokens = np.random.default_rng(1).integers(0, VOCAB, (2, T))
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


@pytest.mark.slow
def test_import_to_orthros_model_dir(qwen3, orthros_dir):
    hf_dir, tokens, ref = qwen3
    loaded = checkpoint.load_model(orthros_dir)
    cfg = loaded.cfg
    assert (cfg.architecture, cfg.window, cfg.qk_norm, cfg.tie_embeddings) == (
        "orthros",
        T,
        True,
        True,
    )
    assert loaded.tokenizer_file == os.path.join(orthros_dir, "tokenizer.json")
    with open(loaded.tokenizer_file) as a, open(os.path.join(hf_dir, "tokenizer.json")) as b:
        assert a.read() == b.read()
    logits = our_logits(cfg, loaded.params, tokens)
    np.testing.assert_allclose(logits, ref, atol=ATOL, rtol=0)


@pytest.mark.slow
def test_import_transformer_then_export(tmp_path):
    hf_dir, tokens, ref = make_hf_dir(str(tmp_path / "llama"), "llama")
    model_dir, out = str(tmp_path / "model"), str(tmp_path / "exported")
    run_cli("convert.py", f"--hf_dir={hf_dir}", f"--out={model_dir}", "--architecture=transformer")
    assert checkpoint.load_model(model_dir).cfg.architecture == "transformer"
    done = run_cli("convert.py", "--export", f"--model={model_dir}", f"--out={out}")
    absl_info = [ln for ln in done.stderr.splitlines() if re.match(r"I\d{4} ", ln)]
    assert not absl_info and "orbax" not in done.stderr, done.stderr  # no orbax INFO logs
    assert os.path.isfile(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "config.json")) as f:
        hf = json.load(f)
    # The source's context length survives the round trip (not transformers' 32768 default).
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["max_position_embeddings"] == 512
    original, exported = SafetensorsCheckpoint(hf_dir), SafetensorsCheckpoint(out)
    assert set(original) == set(exported)
    for name in original:
        np.testing.assert_array_equal(exported[name], original[name], err_msg=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    with torch.no_grad():
        logits = model.eval()(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(logits, ref, atol=ATOL, rtol=0)


@pytest.mark.slow
def test_orthros_exports_as_remote_code_and_imports_back(qwen3, orthros_dir, tmp_path):
    """docs/conversion.md's flow: import, convert to Orthros, export; transformers loads it with
    trust_remote_code and gives our logits; --hf_dir reads the export back unchanged."""
    hf_dir, tokens, _ = qwen3
    out, back = str(tmp_path / "hf"), str(tmp_path / "back")
    run_cli("convert.py", "--export", f"--model={orthros_dir}", f"--out={out}")
    loaded = checkpoint.load_model(orthros_dir)
    ours = our_logits(loaded.cfg, loaded.params, tokens)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    with torch.no_grad():
        logits = model.eval()(torch.from_numpy(tokens), use_cache=False).logits.numpy()
    np.testing.assert_allclose(logits, np.asarray(ours), atol=1e-4, rtol=0)
    run_cli("convert.py", f"--hf_dir={out}", f"--out={back}")
    again = checkpoint.load_model(back)
    assert again.cfg == loaded.cfg
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(loaded.params), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_cli_errors_are_messages_not_tracebacks(tmp_path):
    done = run_cli(
        "convert.py", "--export", f"--model={tmp_path}/none", f"--out={tmp_path}/x", check=False
    )
    assert done.returncode != 0
    assert "has no model.json" in done.stderr
    assert "Traceback" not in done.stderr
    (tmp_path / "moe").mkdir()
    moe = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 8}
    (tmp_path / "moe" / "config.json").write_text(json.dumps(moe))
    done = run_cli("convert.py", f"--hf_dir={tmp_path}/moe", f"--out={tmp_path}/y", check=False)
    assert done.returncode != 0 and "Qwen3MoeForCausalLM" in done.stderr


@pytest.mark.slow
def test_generate_serves_converted_model_like_transformers_greedy(qwen3, orthros_dir):
    """convert.py -> generate.py: with w >= prompt + new tokens, greedy text == HF's."""
    from tokenizers import Tokenizer

    hf_dir, n_new = qwen3[0], 8
    tok = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    ids = tok.encode(PROMPT).ids
    assert len(ids) + n_new <= T  # the window covers everything: Orthros == the Transformer
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    with torch.no_grad():
        out = model.eval().generate(
            torch.tensor([ids]), max_new_tokens=n_new, do_sample=False, pad_token_id=0
        )
    want = tok.decode(out[0, len(ids) :].tolist())
    done = run_cli(
        "generate.py",
        f"--model={orthros_dir}",
        f"--prompt={PROMPT}",
        f"--max_new_tokens={n_new}",
        "--temperature=0",
        "--stop_at_eos=false",
    )
    assert done.stdout.startswith(PROMPT + want), (done.stdout, want)
    assert f"[orthros] prompt {len(ids)} tokens, generated {n_new}" in done.stdout


@pytest.mark.slow
def test_continue_training_converted_model_then_generate(orthros_dir, tmp_path):
    """configs/convert_tiny.py continues the converted model (init_from) for a few steps; the
    workdir serves: its params load (generate.py's loader) with the converted tokenizer."""
    workdir = str(tmp_path / "cpt")
    run_cli(
        "train.py",
        f"--config=configs/convert_tiny.py:{orthros_dir}",
        f"--workdir={workdir}",
        "--config.train.steps=2",
        "--config.data.seq_len=48",
        "--config.data.batch_size=2",
        "--config.train.eval_every=0",
        "--config.train.eval_batches=1",
        "--config.train.checkpoint_every=0",
        "--config.train.progress_bar=false",
        # Some of the package's own sources: a small corpus, quick to tokenize (the default, the
        # embedded stdlib, takes half a minute through a Python tokenizer).
        f"--config.data.corpus={ROOT}/orthros_jax/convert",
        "--config.data.validation_fraction=0.3",
    )
    converted, trained = checkpoint.load_model(orthros_dir), checkpoint.load_model(workdir)
    assert trained.cfg == converted.cfg.replace(remat="full")
    assert trained.tokenizer_file is not None
    diffs = [
        float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max())
        for a, b in zip(
            jax.tree.leaves(trained.params), jax.tree.leaves(converted.params), strict=True
        )
    ]
    # Started from the converted weights (lr 3e-5 in warmup moves each by ~1e-5), and moved.
    assert 0 < max(diffs) < 1e-3, diffs
    # What generate.py serves from the workdir: load_model (above, generate.py's own loader)
    # and the workdir's tokenizer, which encodes the prompt as the converted model's does.
    # generate.py itself on a converted model: test_generate_serves_converted_model_...
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(trained.tokenizer_file).encode(PROMPT).ids
    assert ids == Tokenizer.from_file(converted.tokenizer_file).encode(PROMPT).ids
    assert len(ids) == 9
