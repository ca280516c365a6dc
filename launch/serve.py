r"""Serve a model over an OpenAI-compatible HTTP API (continuous batching, orthros_jax/serving).

    python launch/serve.py --model=runs/tiny --port=8000 --max_batch=8 --max_len=4096
    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
        -d '{"model": "tiny", "prompt": "def main(", "max_tokens": 32, "temperature": 0}'

--model is anything `orthros_jax.checkpoint.load_model` reads; the tokenizer is the model's
tokenizer.json (raw bytes when it has none) or --tokenizer; /v1/chat/completions is served when
the tokenizer_config.json beside it (or --chat_template) has a chat template. The model is
served under --served_model_name (default: the directory's name). Binds 127.0.0.1 unless
--host says otherwise. Every shape is compiled before the port opens (--warmup). SIGTERM or
Ctrl-C: stop accepting, finish the running requests, exit 0.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import jax
from absl import app, flags

from orthros_jax.checkpoint import load_model
from orthros_jax.data.tokenizers import load_tokenizer
from orthros_jax.inference import Speculative
from orthros_jax.parallel.mesh import sequence_mesh
from orthros_jax.serving.api import create_app
from orthros_jax.serving.chat import load_chat_template
from orthros_jax.serving.engine import Engine

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Model directory or training workdir (load_model).")
flags.DEFINE_string("host", "127.0.0.1", "Address to bind (default: localhost only).")
flags.DEFINE_integer("port", 8000, "Port to listen on.")
flags.DEFINE_integer("max_batch", 4, "Slots: requests decoded together (rows of the cache).")
flags.DEFINE_integer("max_len", 2048, "Cache positions per slot: prompt + generated tokens.")
flags.DEFINE_integer(
    "chunk_budget", None, "Prompt tokens prefilled per engine step (default: prefill_chunk)."
)
flags.DEFINE_integer("max_queue", 64, "Waiting requests before new ones get HTTP 429.")
flags.DEFINE_integer(
    "decode_steps",
    1,
    "Decode steps per device call (> 1: tokens stream in bursts of it, "
    "one host round trip per burst).",
)
flags.DEFINE_float(
    "batch_wait_ms",
    0.0,
    "How long an idle engine lets a burst of requests gather before its first step "
    "(so they prefill in one call); at most 1000.",
)
flags.DEFINE_list(
    "prefill_lengths", None, "Prefill token buckets (default: powers of two 8..chunk_budget)."
)
flags.DEFINE_string(
    "served_model_name", None, "The model name clients send (default: the directory name)."
)
flags.DEFINE_string("tokenizer", None, "tokenizer.json overriding the model's (default: bytes).")
flags.DEFINE_string(
    "chat_template", None, "A .jinja file or tokenizer_config.json with the chat template."
)
flags.DEFINE_integer(
    "sequence",
    1,
    "> 1: split every slot's cache positions over this many devices (sequence parallelism, "
    "parallel.mesh.sequence_mesh; --max_len a multiple of it); 1: one device.",
)
flags.DEFINE_string(
    "kv_cache_dtype",
    None,
    "int8 / fp8: keep the cache's K/V quantized (default: the model's dtype).",
)
flags.DEFINE_bool(
    "prefix_caching",
    True,
    "Admit a request into the cache row holding its longest prompt prefix and prefill only the "
    "rest (one device; off with --sequence > 1).",
)
flags.DEFINE_integer(
    "speculative_k",
    0,
    "> 0: decode in self-speculative rounds of this many drafts (docs/speculative.md); each "
    "--decode_steps step is one round of up to k + 1 tokens; prefix caching is off with it.",
)
flags.DEFINE_integer(
    "draft_window",
    None,
    "Cache slots a draft's global attention reads (with --speculative_k; default: the window).",
)
flags.DEFINE_bool("warmup", True, "Compile every shape before serving.")
flags.DEFINE_bool(
    "unmerged_lora",
    False,
    "Serve a LoRA model with its adapters applied in every call (default: merged at load).",
)
flags.DEFINE_string("log_level", "warning", "uvicorn log level.")
flags.mark_flags_as_required(["model"])


def main(argv: list[str]) -> None:
    del argv
    import uvicorn

    logging.basicConfig(level=logging.WARNING)
    try:
        loaded = load_model(FLAGS.model, merge_lora=not FLAGS.unmerged_lora)
        tokenizer = load_tokenizer(FLAGS.tokenizer or loaded.tokenizer_file)
        template = load_chat_template(FLAGS.tokenizer or loaded.tokenizer_file, FLAGS.chat_template)
        lengths = tuple(int(x) for x in FLAGS.prefill_lengths) if FLAGS.prefill_lengths else None
        mesh = None
        if FLAGS.sequence != 1:  # a bad value: a ValueError (sequence_mesh's or the engine's)
            if FLAGS.sequence > jax.device_count():
                raise ValueError(f"--sequence={FLAGS.sequence}: only {jax.device_count()} devices")
            mesh = sequence_mesh(FLAGS.sequence, devices=jax.devices()[: max(FLAGS.sequence, 0)])
        spec = None  # k < 0: Speculative's ValueError
        if FLAGS.speculative_k != 0:
            window = loaded.cfg.window if FLAGS.draft_window is None else FLAGS.draft_window
            spec = Speculative(FLAGS.speculative_k, window)
        engine = Engine(
            loaded.params,
            loaded.cfg,
            max_batch=FLAGS.max_batch,
            max_len=FLAGS.max_len,
            chunk_budget=FLAGS.chunk_budget,
            max_queue=FLAGS.max_queue,
            decode_text=tokenizer.decode,
            eos_id=tokenizer.eos_id,
            prefill_lengths=lengths,
            decode_steps=FLAGS.decode_steps,
            batch_wait_s=FLAGS.batch_wait_ms / 1000,
            mesh=mesh,
            kv_cache_dtype=FLAGS.kv_cache_dtype,
            prefix_caching=FLAGS.prefix_caching and mesh is None and spec is None,
            speculative=spec,
        )
    except ValueError as e:
        sys.exit(f"serve.py: {e}")
    name = FLAGS.served_model_name or os.path.basename(os.path.normpath(FLAGS.model))
    if FLAGS.warmup:
        t = time.perf_counter()
        engine.warmup()
        print(f"serve.py: compiled in {time.perf_counter() - t:.1f} s", flush=True)
    server_app = create_app(engine, tokenizer, name, template)
    print(
        f"serve.py: serving {name!r} ({loaded.cfg.architecture}) on http://{FLAGS.host}:{FLAGS.port}",
        flush=True,
    )
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the handler it found:
    # this one makes that a clean exit (status 0) rather than death by signal.
    signal.signal(signal.SIGTERM, _drained)
    uvicorn.run(server_app, host=FLAGS.host, port=FLAGS.port, log_level=FLAGS.log_level)
    _drained()


def _drained(*_: object) -> None:
    print("serve.py: drained, bye", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    app.run(main)
