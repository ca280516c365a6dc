"""The lm-evaluation-harness model, offline: batching by hand, parity with lm-eval's own `hf`
model on a tiny random Llama, SFT-mode scores against a full forward, and its errors.

The local tasks in tests/harness_tasks/ (multiple choice, generation, rolling perplexity) use a
25-word vocabulary; the tokenizer built here is word-level with a BOS post-processor, saved as
a Hugging Face tokenizer so both models read the same tokenizer.json.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before `datasets` is imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402

from orthros_jax import checkpoint  # noqa: E402
from orthros_jax.convert import from_transformer, hf_tokenizer_file, load_hf  # noqa: E402
from orthros_jax.evaluation.harness import OrthrosHarnessLM  # noqa: E402
from orthros_jax.evaluation.harness_run import load_tasks  # noqa: E402
from orthros_jax.evaluation.scoring import batches, bucket, score_row  # noqa: E402
from orthros_jax.evaluation.text import HarnessTokenizer  # noqa: E402
from orthros_jax.model import OrthrosLM, init_params  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK_DIR = os.path.join(REPO, "tests", "harness_tasks")
TASKS = ["orthros_tiny_mc", "orthros_tiny_gen", "orthros_tiny_ppl"]
MAX_LEN = 16  # shorter than some requests: left truncation and several rolling windows
WORDS = (
    "the cat sat on mat dog sky is blue green grass red big small a what color ? . yes no it and"
).split()

SPECIALS = ["<unk>", "<s>", "</s>"]


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(SPECIALS + WORDS)}, "<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    return tok


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    """A tiny random LlamaForCausalLM and its tokenizer, saved as Hugging Face saves them."""
    path = str(tmp_path_factory.mktemp("hf"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_tokenizer(),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
    )
    fast.save_pretrained(path)
    torch.manual_seed(0)
    conf = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=32,
        initializer_range=0.1,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    transformers.LlamaForCausalLM(conf).eval().save_pretrained(path)
    return path


@pytest.fixture
def tasks_here(monkeypatch) -> TaskManager:
    """The local tasks only (their data_files are relative to the repository root)."""
    monkeypatch.chdir(REPO)
    return TaskManager(include_path=TASK_DIR, include_defaults=False)


def _save(tmp_path, cfg, params, hf_dir: str) -> str:
    path = str(tmp_path / cfg.architecture)
    checkpoint.save_model(path, cfg, params, hf_tokenizer_file(hf_dir))
    return path


# ---------------------------------------------------------------- batching by hand


def test_score_row_truncates_the_context_from_the_left():
    row = score_row(list(range(1, 11)), [11, 12], max_length=8)
    np.testing.assert_array_equal(row.tokens, [4, 5, 6, 7, 8, 9, 10, 11])  # (ctx+cont)[-9:][:-1]
    np.testing.assert_array_equal(row.targets, [11, 12])
    np.testing.assert_array_equal(row.output_index, [6, 7])  # token 10 predicts 11, 11 -> 12
    full = score_row([5], [6, 7], max_length=8)
    np.testing.assert_array_equal(full.tokens, [5, 6])
    np.testing.assert_array_equal(full.output_index, [0, 1])
    with pytest.raises(ValueError, match="does not fit max_length=2"):
        score_row([1], [2, 3, 4], max_length=2)
    with pytest.raises(ValueError, match="empty continuation"):
        score_row([1], [], max_length=8)


def test_batches_are_longest_first_with_power_of_two_shapes():
    rows = [score_row([1, 2], [3], 64), score_row(list(range(30)), [7, 8, 9, 4, 5], 64)]
    rows.append(score_row([1, 2, 3, 4], [5, 6], 64))
    assert [bucket(n, 32, 64) for n in (1, 32, 33, 60)] == [32, 32, 64, 64]
    assert bucket(40, 32, 36) == 40  # never below n
    (i0, b0), (i1, b1) = list(batches(rows, batch_size=2, max_length=64))
    assert i0 == [1, 2] and i1 == [0]
    assert b0["tokens"].shape == (2, 64) and b0["targets"].shape == (2, 8)  # 34 -> 64, 5 -> 8
    assert b1["tokens"].shape == (2, 32) and b1["targets"].shape == (2, 4)
    np.testing.assert_array_equal(b0["output_positions"][0, :5], np.arange(29, 34))
    np.testing.assert_array_equal(b0["targets"][0, :6], [7, 8, 9, 4, 5, 0])
    np.testing.assert_array_equal(b0["mask"][1], [True, True] + [False] * 6)
    np.testing.assert_array_equal(b0["segment_ids"][1, :6], [1, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(b0["positions"][1], np.arange(64))  # rises through padding
    np.testing.assert_array_equal(b1["tokens"][1], b1["tokens"][0])  # filler row = first row


# ---------------------------------------------------------------- against lm-eval's hf model


def _samples(results, task):
    return sorted(results["samples"][task], key=lambda s: s["doc_id"])


@pytest.mark.slow
def test_matches_lm_eval_hf_model_on_a_converted_llama(hf_dir, tasks_here, tmp_path):
    from lm_eval.models.huggingface import HFLM

    cfg, params = load_hf(hf_dir)
    ours_dir = _save(tmp_path, cfg, params, hf_dir)
    hf = HFLM(pretrained=hf_dir, device="cpu", batch_size=4, max_length=MAX_LEN, dtype="float32")
    run = dict(tasks=TASKS, task_manager=tasks_here, log_samples=True, bootstrap_iters=0)
    want = lm_eval.simple_evaluate(model=hf, **run)
    got = lm_eval.simple_evaluate(  # by registered name: the path of `--model orthros_jax`
        model="orthros_jax", model_args=f"model={ours_dir},batch_size=4,max_length={MAX_LEN}", **run
    )
    lengths = []
    for task in TASKS:
        for w, g in zip(_samples(want, task), _samples(got, task), strict=True):
            assert w["arguments"] == g["arguments"]
            for rw, rg in zip(w["resps"], g["resps"], strict=True):
                if task == "orthros_tiny_gen":
                    assert rg == rw  # the same greedy text, cut at the same stop string
                    continue
                lw, lg = (rw[0][0], rg[0][0]) if task == "orthros_tiny_mc" else (rw[0], rg[0])
                np.testing.assert_allclose(lg, lw, atol=1e-4, rtol=0)
                if task == "orthros_tiny_mc":
                    assert rg[0][1] == rw[0][1]  # is_greedy
            lengths.append(len(" ".join(str(a) for a in w["arguments"][0]).split()))
        for metric, value in want["results"][task].items():
            if isinstance(value, float):
                np.testing.assert_allclose(got["results"][task][metric], value, rtol=1e-5)
            else:
                assert got["results"][task][metric] == value, metric
    assert max(lengths) > MAX_LEN + 1  # some requests were truncated / rolled over windows
    assert want["results"]["orthros_tiny_mc"]["acc,none"] > 0  # the random model is not all wrong


# ---------------------------------------------------------------- SFT mode == full forward


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["orthros", "swa", "gla", "retnet"])
def test_scores_equal_the_full_forward_at_the_same_positions(arch, hf_dir, tmp_path):
    """Orthros's output copies only at the continuation (SFT mode) score exactly what a PT
    forward over the same window gives there; window 4 < the inputs, non-identity SO."""
    cfg, params = load_hf(hf_dir)
    if arch == "orthros":
        cfg, params = from_transformer(params, cfg, window=4)
        rng = np.random.default_rng(0)
        layers = dict(params["layers"])
        for name in [n for n in layers if n.startswith("so_")]:
            layers[name] = layers[name] + rng.normal(0, 0.3, np.shape(layers[name]))
        params = {**params, "layers": jax.tree.map(np.float32, layers)}
    elif arch == "swa":
        cfg = cfg.replace(architecture="swa", window=4)
    else:  # fla's linear baselines: the same block, random mixers (prefill runs them whole)
        cfg = cfg.replace(
            architecture=arch,
            layer_types=(),
            init_std=0.1,
            kinds=dict(gla=dict(chunk=4), retention=dict(chunk=4)),
        )
        params = jax.tree.map(np.asarray, init_params(cfg, jax.random.PRNGKey(3)))
    lm = OrthrosHarnessLM(
        model=_save(tmp_path, cfg, params, hf_dir), batch_size=3, max_length=MAX_LEN
    )
    pairs = [
        ("the cat sat on the", " mat"),
        ("the sky is", " blue and green"),
        (" ".join(["the big dog sat on a red mat ."] * 3), " the cat"),  # > MAX_LEN: truncated
        ("", "a dog is a dog"),  # empty context: the BOS prefix
    ]
    reqs = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    got = lm.loglikelihood(reqs, disable_tqdm=True)
    tok, windows, conts = _tokenizer(), np.zeros((len(pairs), MAX_LEN), np.int32), []
    for r, (context, cont) in enumerate(pairs):
        if context:
            ctx = tok.encode(context).ids  # BOS + words
            conts.append(tok.encode(context + cont).ids[len(ctx) :])
        else:
            ctx = [1]
            conts.append(tok.encode(cont, add_special_tokens=False).ids)
        window = (ctx + conts[-1])[-(MAX_LEN + 1) :][:-1]
        windows[r, : len(window)] = window  # right padding: causally invisible
        conts[-1] = (len(window), conts[-1])
    # PT mode: the output stream at every position, no output_positions.
    logits = jax.jit(lambda p, x: OrthrosLM(cfg).apply({"params": p}, x))(params, windows)
    logp_all = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    for r, (logp, greedy) in enumerate(got):
        n, ids = conts[r]
        at = np.arange(n - len(ids), n)
        np.testing.assert_allclose(logp, logp_all[r, at, ids].sum(), atol=1e-5, rtol=0)
        assert greedy == bool((logp_all[r, at].argmax(-1) == ids).all())
    assert len(tok.encode(pairs[2][0]).ids) > MAX_LEN


# ---------------------------------------------------------------- errors


def test_errors_name_what_is_wrong(hf_dir, tasks_here, tmp_path):
    cfg, params = load_hf(hf_dir)
    path = _save(tmp_path, cfg, params, hf_dir)
    with pytest.raises(ValueError, match="unknown model_args \\['pretrained'\\]"):
        OrthrosHarnessLM(model=path, pretrained="x")
    with pytest.raises(ValueError, match="exactly one of model"):
        OrthrosHarnessLM()
    lm = OrthrosHarnessLM(model=path, batch_size=2, max_length=4)
    with pytest.raises(ValueError, match="does not fit max_length=4"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("the", " cat sat on the mat"), 0)])
    gen = Instance("generate_until", {}, ("the", {"until": ["."], "num_beams": 4}), 0)
    with pytest.raises(ValueError, match="\\['num_beams'\\] are not supported"):
        lm.generate_until([gen])
    with pytest.raises(ValueError, match="chat templates are not supported"):
        lm.apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="orthros_tiny_missing.*never-downloaded"):
        load_tasks(("orthros_tiny_missing",), tasks_here)
    with pytest.raises(ValueError, match="'no_such_task' is unknown"):
        load_tasks(("no_such_task",), tasks_here)


def test_unknown_eos_token_is_a_value_error(hf_dir):
    """An eos_token the tokenizer lacks fails, though the tokenizer has a common EOS (</s>)
    that a name lookup would fall back to."""
    path = hf_tokenizer_file(hf_dir)
    tok = HarnessTokenizer(path, eos_token="</s>")
    assert (tok.bos_id, tok.eos_id, tok.eot_id) == (1, 2, 2)
    assert tok.encode("the cat", add_special_tokens=True) == [1, 3, 4]
    with pytest.raises(ValueError, match="eos_token='<eot>' is not a token of"):
        HarnessTokenizer(path, eos_token="<eot>")
