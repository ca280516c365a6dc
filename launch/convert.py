"""Hugging Face Llama/Qwen3/Qwen3.5 directory <-> orthros-jax model directory.

Import (HF -> model dir that launch/generate.py serves and a training config's `init_from`
continues from; tokenizer.json is carried along):

    python launch/convert.py --hf_dir=path/to/Qwen3-8B --out=runs/qwen3_orthros \
        --architecture=orthros --window=128

--architecture=orthros converts to the two-stream arm of the checkpoint's kind: Orthros for
Llama/Qwen3, Orthros-H for a Qwen3.5 hybrid; --architecture=transformer keeps the checkpoint's
own arm (transformer, or hybrid / gdn for Qwen3.5). orthros_h and hybrid are accepted by name.

Export (single-stream model dir -> HF dir that transformers loads; gdn / hybrid as Qwen3.5):

    python launch/convert.py --export --model=runs/llama_cpt --out=path/to/hf_dir
"""

from __future__ import annotations

import os

from absl import app, flags, logging

from orthros_jax import checkpoint
from orthros_jax.convert import export_hf, from_transformer, hf_tokenizer_file, load_hf
from orthros_jax.model import num_params

FLAGS = flags.FLAGS
flags.DEFINE_string("hf_dir", None, "Hugging Face model directory to import.")
flags.DEFINE_string("out", None, "Output: a model directory (import) or a HF directory (export).")
flags.DEFINE_enum(
    "architecture",
    "orthros",
    ["orthros", "transformer", "orthros_h", "hybrid"],
    "orthros(_h): the two-stream conversion; transformer / hybrid: the checkpoint's own arm.",
)
flags.DEFINE_integer("window", 128, "Base-stream sliding window of the Orthros model.")
flags.DEFINE_bool("scale_offset", True, "Add identity query scale-offsets (False: w/o-SO).")
flags.DEFINE_enum(
    "param_dtype", "float32", ["float32", "bfloat16", "float16"], "Imported parameter dtype."
)
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"], "Activation dtype.")
flags.DEFINE_bool("export", False, "Export --model (a model dir) to a HF directory at --out.")
flags.DEFINE_string("model", None, "Model directory to export (with --export).")
flags.DEFINE_enum(
    "export_dtype", None, ["float32", "bfloat16", "float16"], "Exported dtype (default: params')."
)
flags.DEFINE_integer("max_shard_mb", 5 * 1024, "Shard exported safetensors above this many MiB.")


def import_hf(hf_dir: str, out: str) -> None:
    """HF directory -> model directory (its own arm, or converted to Orthros / Orthros-H)."""
    cfg, params = load_hf(hf_dir, param_dtype=FLAGS.param_dtype, dtype=FLAGS.dtype)
    logging.info("imported %s: %.1fM params", hf_dir, num_params(cfg) / 1e6)
    if FLAGS.architecture in ("orthros", "orthros_h"):
        if cfg.architecture == "gdn":
            raise ValueError("an all-linear-attention Qwen3.5 (gdn arm) has no Orthros form")
        cfg, params = from_transformer(
            params, cfg, window=FLAGS.window, scale_offset=FLAGS.scale_offset
        )
    else:
        cfg = cfg.replace(window=FLAGS.window)
    tokenizer = hf_tokenizer_file(hf_dir)
    if tokenizer is None:
        # Without it the model dir would fall back to byte tokens, which is wrong for any
        # HF vocabulary; say so rather than fail, since training from ids still works.
        logging.warning("%s has no tokenizer.json; the model directory will have none", hf_dir)
    checkpoint.save_model(out, cfg, params, tokenizer_file=tokenizer)
    print(f"wrote {cfg.architecture} model ({num_params(cfg):,} params) to {os.path.abspath(out)}")


def export(model_dir: str, out: str) -> None:
    """Model directory (transformer arm) -> HF directory."""
    loaded = checkpoint.load_model(model_dir)
    files = export_hf(
        out,
        loaded.cfg,
        loaded.params,
        tokenizer_file=loaded.tokenizer_file,
        dtype=FLAGS.export_dtype,
        max_shard_bytes=FLAGS.max_shard_mb * 2**20,
    )
    print(f"wrote Hugging Face directory {os.path.abspath(out)}: {', '.join(files)}")


def main(argv: list[str]) -> None:
    try:
        run(argv)
    except ValueError as e:  # user errors (bad checkpoint/config): the message, no traceback
        raise SystemExit(f"convert.py: {e}") from None


def run(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if not FLAGS.out:
        raise app.UsageError("--out is required")
    if FLAGS.export:
        if not FLAGS.model or FLAGS.hf_dir:
            raise app.UsageError("--export takes --model=<model dir> (and not --hf_dir)")
        export(FLAGS.model, FLAGS.out)
    else:
        if not FLAGS.hf_dir or FLAGS.model:
            raise app.UsageError("import takes --hf_dir=<HF dir> (use --export for --model)")
        import_hf(FLAGS.hf_dir, FLAGS.out)


if __name__ == "__main__":
    app.run(main)
