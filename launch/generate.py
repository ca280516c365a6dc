r"""Generate text from a model directory, streaming tokens to stdout.

    python launch/generate.py --model=runs/tiny --prompt="def main(" --max_new_tokens=200
    python launch/generate.py --model=DIR --prompt=... --temperature=0   # greedy
    python launch/generate.py --model=DIR --prompt=... --speculative_k=4  # self-speculative

--model is anything `orthros_jax.checkpoint.load_model` reads (an exported model directory or
a training workdir). The tokenizer is the model's tokenizer.json, raw bytes when it has none,
or --tokenizer. The prompt is prefilled in one jitted call; then one `decode_step` per token,
each printed as soon as it is sampled. At the end it prints the time to first token (TTFT:
tokenize + prefill + first sample, compilation excluded when --warmup) and the decode rate.
With --speculative_k > 0 the continuation is one on-device `generate(speculative=...)` loop
(docs/speculative.md), printed when it ends, with its acceptance: greedy text is the plain
greedy text; sampled text has the model's distribution, not plain decoding's draws.
Writes nothing but stdout (and errors to stderr).
"""

from __future__ import annotations

import logging
import sys
import time

import jax
from absl import flags
from absl import logging as absl_logging

from orthros_jax.checkpoint import load_model
from orthros_jax.config import cli
from orthros_jax.data.tokenizers import load_tokenizer
from orthros_jax.inference import Speculative, decode_step, generate, init_cache, prefill
from orthros_jax.inference.sampling import Sampler, sample

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Model directory or training workdir (load_model).")
flags.DEFINE_string("prompt", None, "Prompt text.")
flags.DEFINE_integer("max_new_tokens", 128, "Most tokens to generate.")
flags.DEFINE_float("temperature", 0.8, "Sampling temperature; 0 = greedy.")
flags.DEFINE_integer("top_k", 0, "Keep the k most likely tokens (0 = off).")
flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1.0 = off).")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.DEFINE_string("tokenizer", None, "tokenizer.json overriding the model's (default: bytes).")
flags.DEFINE_integer("max_len", None, "KV cache slots (default: prompt + max_new_tokens).")
flags.DEFINE_bool("warmup", True, "Compile on a scratch cache first so TTFT excludes compiling.")
flags.DEFINE_bool("stop_at_eos", True, "Stop at the tokenizer's end-of-text token, if it has one.")
flags.DEFINE_integer(
    "speculative_k", 0, "> 0: self-speculative decoding with this many drafts per round."
)
flags.DEFINE_integer(
    "draft_window", None, "Cache slots a draft reads (with --speculative_k; default: the window)."
)
flags.mark_flags_as_required(["model", "prompt"])


class _Streamer:
    """Prints the decoded text as tokens arrive; holds back a trailing partial UTF-8 char."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.shown = tokenizer, [], 0

    def add(self, token: int, final: bool = False) -> None:
        self.ids.append(token)
        self.flush(final)

    def flush(self, final: bool = True) -> None:
        text = self.tokenizer.decode(self.ids)
        if not final:
            text = text.rstrip("\ufffd")  # may be half of a multi-byte character
        if len(text) > self.shown:
            sys.stdout.write(text[self.shown :])
            sys.stdout.flush()
            self.shown = len(text)


def main(argv: list[str]) -> None:
    del argv
    # Keep the checkpoint library's and JAX's INFO logs off the terminal: stdout is the text.
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
    try:
        sampler = Sampler(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p)
        if FLAGS.max_new_tokens < 1:
            raise ValueError(f"--max_new_tokens must be >= 1, got {FLAGS.max_new_tokens}")
        if FLAGS.speculative_k < 0:
            raise ValueError(f"--speculative_k must be >= 0, got {FLAGS.speculative_k}")
        if FLAGS.draft_window is not None and FLAGS.draft_window < 1:
            raise ValueError(f"--draft_window must be >= 1, got {FLAGS.draft_window}")
        loaded = load_model(FLAGS.model)
        tokenizer = load_tokenizer(FLAGS.tokenizer or loaded.tokenizer_file)
    except ValueError as e:
        sys.exit(f"generate.py: {e}")
    cfg = loaded.cfg
    params = jax.device_put(loaded.params)
    ids = tokenizer.encode(FLAGS.prompt)
    if not ids:
        sys.exit("generate.py: --prompt encodes to no tokens; give a non-empty prompt")
    max_len = FLAGS.max_len or len(ids) + FLAGS.max_new_tokens
    if note := loaded.beyond_context(len(ids) + FLAGS.max_new_tokens):
        print(f"generate.py: warning: prompt + --max_new_tokens: {note}", file=sys.stderr)
    if FLAGS.speculative_k:
        window = cfg.window if FLAGS.draft_window is None else FLAGS.draft_window
        spec = Speculative(FLAGS.speculative_k, window)
        _speculative(params, cfg, tokenizer, sampler, spec, ids, max_len)
        return
    # sample is jitted; token `step` draws what generate(..., rng=rng) draws for it.
    sample_fn = lambda logits, rng, step: sample(logits, rng, sampler, step)
    rng = jax.random.PRNGKey(FLAGS.seed)
    try:
        compile_s = 0.0
        if FLAGS.warmup:  # the same shapes as the real call, so it reuses these compilations
            t = time.perf_counter()
            logits, scratch = prefill(params, init_cache(cfg, 1, max_len), [ids], [len(ids)], cfg)
            if len(ids) < max_len:
                logits, scratch = decode_step(params, scratch, [ids[-1]], cfg)
            jax.block_until_ready(sample_fn(logits, rng, 0))
            del scratch
            compile_s = time.perf_counter() - t
        t0 = time.perf_counter()
        ids = tokenizer.encode(FLAGS.prompt)
        logits, cache = prefill(params, init_cache(cfg, 1, max_len), [ids], [len(ids)], cfg)
    except ValueError as e:
        sys.exit(f"generate.py: {e}")
    token = int(sample_fn(logits, rng, 0)[0])
    ttft = time.perf_counter() - t0

    sys.stdout.write(FLAGS.prompt)
    stream = _Streamer(tokenizer)
    eos = tokenizer.eos_id if FLAGS.stop_at_eos else None
    if token != eos:  # the end-of-text token itself is not printed
        stream.add(token)
    n_new, held, why = 1, len(ids), "max_new_tokens"
    t1 = time.perf_counter()
    while n_new < FLAGS.max_new_tokens:
        if token == eos:
            why = "end of text"
            break
        if held >= max_len:
            why = f"cache full (--max_len={max_len})"
            break
        logits, cache = decode_step(params, cache, [token], cfg)
        held += 1
        token = int(sample_fn(logits, rng, n_new)[0])
        n_new += 1
        if token != eos:
            stream.add(token)
    decode_s = time.perf_counter() - t1
    stream.flush()
    rate = (n_new - 1) / decode_s if n_new > 1 and decode_s > 0 else float("nan")
    print(
        f"\n\n[{cfg.architecture}] prompt {len(ids)} tokens, generated {n_new} (stopped: {why})\n"
        f"TTFT {ttft * 1e3:.1f} ms | decode {rate:.1f} tokens/s | "
        f"compile+warmup {compile_s:.1f} s"
    )


def _speculative(
    params, cfg, tokenizer, sampler: Sampler, spec: Speculative, ids: list[int], max_len: int
) -> None:
    """--speculative_k: the whole continuation of the prompt `ids` in one
    generate(speculative=spec) call on a cache of max_len slots (the same call first with
    --warmup, so the timing excludes compiling), then its text, why it stopped and the rounds'
    acceptance."""
    eos = tokenizer.eos_id if FLAGS.stop_at_eos else None
    run = lambda: generate(
        params,
        [ids],
        cfg,
        max_new_tokens=FLAGS.max_new_tokens,
        sampler=sampler,
        rng=jax.random.PRNGKey(FLAGS.seed),
        stop_tokens=() if eos is None else (eos,),
        cache_size=max_len,
        speculative=spec,
    )
    try:
        compile_s = 0.0
        if FLAGS.warmup:
            t = time.perf_counter()
            run()
            compile_s = time.perf_counter() - t
        t0 = time.perf_counter()
        out = run()
    except ValueError as e:
        sys.exit(f"generate.py: {e}")
    total_s = time.perf_counter() - t0
    n_new = int(out.lengths[0])
    new = out.tokens[0, :n_new].tolist()
    why = "max_new_tokens"
    if eos is not None and new and new[-1] == eos:
        new, why = new[:-1], "end of text"
    elif bool(out.hit_capacity[0]):
        why = f"cache full (--max_len={max_len})"
    sys.stdout.write(FLAGS.prompt + tokenizer.decode(new))
    stats = out.speculation
    rounds, drafted, accepted = (int(a[0]) for a in (stats.rounds, stats.drafted, stats.accepted))
    print(
        f"\n\n[{cfg.architecture}] prompt {len(ids)} tokens, generated {n_new} (stopped: {why})\n"
        f"speculative k={spec.k}, draft window {spec.draft_window}: {rounds} rounds, "
        f"{stats.tokens_per_verify():.2f} tokens per verify, {accepted}/{drafted} drafts accepted\n"
        f"prefill + decode {total_s * 1e3:.1f} ms ({n_new / total_s:.1f} tokens/s) | "
        f"compile+warmup {compile_s:.1f} s"
    )


if __name__ == "__main__":
    cli.run(main, "generate.py")
