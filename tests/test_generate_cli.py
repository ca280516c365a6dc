"""launch/generate.py end to end on a model directory written in the test."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest
from helpers import tiny_config

from orthros_jax import checkpoint, inference
from orthros_jax.data.tokenizers import ByteTokenizer
from orthros_jax.model import init_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "launch", "generate.py")
PROMPT = "def main("


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cfg = tiny_config(window=4, prefill_chunk=8, init_std=0.2)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    directory = str(tmp_path_factory.mktemp("model"))
    checkpoint.save_model(directory, cfg, params)
    return directory, cfg, params


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, SCRIPT, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )


@pytest.mark.slow
@pytest.mark.parametrize("speculative_k", [0, 2])
def test_generate_cli_prints_greedy_text_and_reports(model_dir, speculative_k):
    """Plain: tokens streamed, TTFT and decode rate reported. --speculative_k: one
    generate(speculative=...) call, the same greedy text, its acceptance reported (the draft
    window defaulting to the model's window)."""
    directory, cfg, params = model_dir
    n = 7
    result = _run(
        f"--model={directory}",
        f"--prompt={PROMPT}",
        f"--max_new_tokens={n}",
        "--temperature=0",
        f"--speculative_k={speculative_k}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ids = ByteTokenizer().encode(PROMPT)
    want = inference.generate(params, [ids], cfg, max_new_tokens=n)
    text = ByteTokenizer().decode(want.tokens[0].tolist())
    assert result.stdout.startswith(PROMPT + text), (result.stdout, text)
    assert f"prompt {len(ids)} tokens, generated {n} (stopped: max_new_tokens)" in result.stdout
    if speculative_k:
        assert f"speculative k=2, draft window {cfg.window}: " in result.stdout, result.stdout
    else:
        assert "TTFT " in result.stdout and "tokens/s" in result.stdout


def test_generate_cli_rejects_an_empty_prompt(model_dir):
    result = _run(f"--model={model_dir[0]}", "--prompt=")
    assert result.returncode != 0
    assert "non-empty prompt" in result.stderr
