"""Every arm exported as a `transformers` trust_remote_code model (convert/remote.py and
convert/hf_remote/modeling_orthros.py): logits equal ours, greedy `generate` with the KV cache
equals ours, save -> load -> save keeps every tensor, and lm-eval's own `hf` model scores an
exported Orthros like our harness model.

Each arm uses tiny shapes, a window shorter than the prompts (so the base stream's window and
the output stream's global read differ) and random, non-identity scale-offsets; the MoE arms
(ModelConfig.moe: paired and independent routing, a shared expert, dense layers between) a
router scaled up so that routing is decisive.
"""

from __future__ import annotations

import functools
import json
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import our_logits  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from orthros_jax import checkpoint  # noqa: E402
from orthros_jax.config import ModelConfig  # noqa: E402
from orthros_jax.convert import export_hf  # noqa: E402
from orthros_jax.convert.remote import load_remote  # noqa: E402
from orthros_jax.model import init_params  # noqa: E402

SMALL = dict(vocab_size=32, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, window=3)
GDN = dict(kinds=dict(gdn=dict(num_k_heads=2, num_v_heads=4, k_head_dim=8, v_head_dim=8)))
MOE = dict(n_experts=4, top_k=2, d_expert=16)
ARMS = {
    "orthros": ModelConfig(**SMALL, n_layers=2, architecture="orthros"),
    "orthros_no_so": ModelConfig(**SMALL, n_layers=2, architecture="orthros", scale_offset=False),
    "orthros_qwen": ModelConfig(
        **SMALL,
        n_layers=2,
        architecture="orthros",
        qk_norm=True,
        attn_output_gate=True,
        norm_zero_centered=True,
        partial_rotary_factor=0.5,
        tie_embeddings=True,
    ),
    "swa": ModelConfig(**SMALL, n_layers=2, architecture="swa"),
    "orthros_h": ModelConfig(**SMALL, **GDN, n_layers=4, architecture="orthros_h"),
    "transformer_moe": ModelConfig(
        **SMALL,
        n_layers=2,
        architecture="transformer",
        moe=dict(**MOE, shared_expert=24, norm_topk_prob=False, ffn_cycle=("dense", "moe")),
    ),
    "orthros_moe_paired": ModelConfig(
        **SMALL, n_layers=2, architecture="orthros", moe=dict(**MOE, shared_expert=16)
    ),
    "orthros_moe_independent": ModelConfig(
        **SMALL,
        n_layers=2,
        architecture="orthros",
        moe=dict(**MOE, routing="independent", ffn_cycle=("dense", "moe")),
    ),
}


@functools.cache
def _params(cfg: ModelConfig, seed: int = 0):
    """Random params; scale-offsets and norms moved away from the identity, MoE routers and
    experts scaled up (peaked routing, no two experts near a tie, and the choice matters).
    Built once per (config, seed) in a process; the init is jitted (one program, not the
    eager init's op-by-op forward)."""
    rng = np.random.default_rng(seed)

    def perturb(path, a):
        name = jax.tree_util.keystr(path)
        if "so_" in name or "norm" in name:
            return a + 0.3 * rng.standard_normal(a.shape).astype(a.dtype)
        if "router" in name:
            return 25 * a
        if "['moe']" in name:  # the experts' share of the residual stream, beyond the init's
            return 3 * a
        return a

    init = jax.jit(functools.partial(init_params, cfg))(jax.random.PRNGKey(seed))
    return jax.tree_util.tree_map_with_path(perturb, init)


@pytest.fixture(scope="module", params=sorted(ARMS))
def exported(request, tmp_path_factory):
    """(cfg, params, export dir, the loaded transformers model) of one arm."""
    cfg = ARMS[request.param]
    params = _params(cfg)
    path = str(tmp_path_factory.mktemp(request.param))
    export_hf(path, cfg, params, max_position=64, fmt="remote")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, trust_remote_code=True, dtype=torch.float32
    ).eval()
    return cfg, params, path, model


def _ours(cfg, params, tokens):
    return our_logits(cfg, params, tokens)


@pytest.mark.slow
def test_logits_equal_ours_at_every_position(exported):
    cfg, params, _, model = exported
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 11))
    with torch.no_grad():
        theirs = model(torch.tensor(tokens), use_cache=False).logits.numpy()
        last = model(torch.tensor(tokens), use_cache=False, logits_to_keep=1).logits.numpy()
    ours = _ours(cfg, params, tokens)
    assert np.abs(ours).max() > 0.1  # not a vacuous comparison
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
    # One output copy at the last token (generate's prefill) gives that token's logits.
    np.testing.assert_allclose(last[:, 0], ours[:, -1], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_gdn_layers_chunk_like_ours_past_one_chunk(exported):
    """70 tokens: the PyTorch chunked delta rule (chunks of 64) carries its state into the
    second chunk as ours does (gdn_chunk 64)."""
    cfg, params, _, model = exported
    if "gdn" not in cfg.layer_types:
        pytest.skip("no GDN layers")
    tokens = np.random.default_rng(6).integers(0, cfg.vocab_size, (1, 70))
    with torch.no_grad():
        theirs = model(torch.tensor(tokens), use_cache=False).logits.numpy()
    np.testing.assert_allclose(theirs, _ours(cfg, params, tokens), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_cached_decode_equals_the_full_forward(exported):
    """Prefill 5 tokens, then one token per step through the DynamicCache: each step's logits
    equal the full forward's at that position (window over the cache, global output read)."""
    cfg, params, _, model = exported
    tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, (2, 11))  # one compile
    ours = _ours(cfg, params, tokens)
    ids = torch.tensor(tokens)
    with torch.no_grad():
        out = model(ids[:, :5], use_cache=True, logits_to_keep=1)
        cache, steps = out.cache if hasattr(out, "cache") else out.past_key_values, [out.logits]
        for t in range(5, 11):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
    got = torch.cat(steps, 1).numpy()
    np.testing.assert_allclose(got, ours[:, 4:], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_generate_greedy_equals_ours(exported):
    """transformers' greedy `generate` (prefill, then cached decode past the window) picks at
    every step our argmax given the same prefix: the very tokens our greedy decoding gives.
    Ours is read off one forward of the generated sequence ([2, 11], the shape the logits
    test compiled; our generate equals our forward: test_kind_conformance)."""
    cfg, params, _, model = exported
    prompts = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 5))  # longer than w=3
    with torch.no_grad():
        got = model.generate(
            torch.tensor(prompts),
            attention_mask=torch.ones(prompts.shape, dtype=torch.long),
            max_new_tokens=6,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        ).numpy()
    assert got.shape == (2, 11)
    np.testing.assert_array_equal(got[:, :5], prompts)
    want = _ours(cfg, params, got).argmax(-1)[:, 4:10]  # the prediction of tokens 5..10
    np.testing.assert_array_equal(got[:, 5:], want)


@pytest.mark.slow
def test_save_load_save_round_trip(exported, tmp_path):
    """transformers' save_pretrained of the loaded model reads back (load_remote) into the
    very params that were exported, and loads again in transformers with the same logits."""
    cfg, params, path, model = exported
    model.save_pretrained(str(tmp_path))
    back_cfg, back = load_remote(str(tmp_path))
    assert back_cfg == cfg
    flat = jax.tree_util.tree_leaves_with_path(params)
    got = dict(jax.tree_util.tree_leaves_with_path(back))
    assert sorted(map(str, got)) == sorted(str(p) for p, _ in flat)
    for p, a in flat:
        np.testing.assert_array_equal(got[p], np.asarray(a), err_msg=jax.tree_util.keystr(p))
    again = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), trust_remote_code=True, dtype=torch.float32
    )
    tokens = torch.tensor(np.random.default_rng(4).integers(0, cfg.vocab_size, (1, 9)))
    with torch.no_grad():
        np.testing.assert_array_equal(again(tokens).logits.numpy(), model(tokens).logits.numpy())
    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    assert hf["auto_map"]["AutoModelForCausalLM"] == "modeling_orthros.OrthrosForCausalLM"
    assert hf["max_position_embeddings"] == 64
    assert os.path.isfile(os.path.join(path, "modeling_orthros.py"))


@pytest.mark.slow
def test_left_padded_batch_equals_each_row_alone(exported):
    """A batch with a left-padded short row: its logits equal the row run alone."""
    cfg, _, _, model = exported
    rng = np.random.default_rng(5)
    long, short = rng.integers(0, cfg.vocab_size, 9), rng.integers(0, cfg.vocab_size, 6)
    batch = torch.tensor(np.stack([long, np.concatenate([[0, 0, 0], short])]))
    mask = torch.tensor([[1] * 9, [0] * 3 + [1] * 6])
    with torch.no_grad():
        both = model(batch, attention_mask=mask, use_cache=False).logits
        alone = model(torch.tensor(short[None]), use_cache=False).logits
    np.testing.assert_allclose(both[1, 3:].numpy(), alone[0].numpy(), atol=1e-5, rtol=0)


def test_llama_export_keeps_the_context_length(tmp_path):
    cfg = ModelConfig(**SMALL, n_layers=2, architecture="transformer")
    export_hf(str(tmp_path), cfg, _params(cfg), max_position=512)
    with open(tmp_path / "config.json") as f:
        hf = json.load(f)
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["max_position_embeddings"] == 512


@pytest.mark.slow
def test_lm_eval_hf_model_scores_an_exported_orthros_like_our_harness(tmp_path, monkeypatch):
    """lm-eval's `hf` model on the exported directory (trust_remote_code) and our harness
    model on the model directory give the same log-likelihoods and greedy text."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from test_harness import MAX_LEN, REPO, TASK_DIR, TASKS, _samples, _tokenizer

    tok_dir = str(tmp_path / "tok")
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=_tokenizer(),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
    ).save_pretrained(tok_dir)
    cfg = ARMS["orthros"].replace(window=4)
    params = jax.tree.map(lambda a: 4 * a, _params(cfg))  # peaked enough to be decisive
    ours_dir, hf_dir = str(tmp_path / "ours"), str(tmp_path / "hf")
    checkpoint.save_model(ours_dir, cfg, params, os.path.join(tok_dir, "tokenizer.json"))
    export_hf(hf_dir, cfg, params, tokenizer_file=os.path.join(tok_dir, "tokenizer.json"))
    monkeypatch.chdir(REPO)
    run = dict(
        tasks=TASKS,
        log_samples=True,
        bootstrap_iters=0,
        task_manager=TaskManager(include_path=TASK_DIR, include_defaults=False),
    )
    # The export's own tokenizer files (tokenizer.json + the tokenizer_config.json it writes).
    hf = HFLM(
        pretrained=hf_dir,
        trust_remote_code=True,
        device="cpu",
        batch_size=4,
        max_length=MAX_LEN,
        dtype="float32",
    )
    want = lm_eval.simple_evaluate(model=hf, **run)
    got = lm_eval.simple_evaluate(
        model="orthros_jax", model_args=f"model={ours_dir},batch_size=4,max_length={MAX_LEN}", **run
    )
    for task in TASKS:
        for w, g in zip(_samples(want, task), _samples(got, task), strict=True):
            assert w["arguments"] == g["arguments"]
            for rw, rg in zip(w["resps"], g["resps"], strict=True):
                if task == "orthros_tiny_gen":
                    assert rg == rw
                    continue
                lw, lg = (rw[0][0], rg[0][0]) if task == "orthros_tiny_mc" else (rw[0], rg[0])
                np.testing.assert_allclose(lg, lw, atol=1e-4, rtol=0)
