"""Hugging Face Llama/Qwen3/Qwen3.5 directory <-> orthros-jax model directory.

Import (HF -> model dir that launch/generate.py serves and a training config's `init_from`
continues from; tokenizer.json is carried along):

    python launch/convert.py --hf_dir=path/to/Qwen3-8B --out=runs/qwen3_orthros \
        --architecture=orthros --window=128

--architecture=orthros converts to the two-stream arm of the checkpoint's kind: Orthros for
Llama/Qwen3, Orthros-H for a Qwen3.5 hybrid; --architecture=transformer keeps the checkpoint's
own arm (transformer, or hybrid / gdn for Qwen3.5). orthros_h and hybrid are accepted by name.

Export (any model dir or workdir -> HF dir that transformers loads): transformer as Llama /
Qwen3, gdn / hybrid as Qwen3.5, orthros / swa / orthros_h (or any arm with --remote) as
trust_remote_code (config.json's auto_map names modeling_orthros.py, copied alongside):

    python launch/convert.py --export --model=runs/llama_cpt --out=path/to/hf_dir
    # AutoModelForCausalLM.from_pretrained("path/to/hf_dir", trust_remote_code=True)

A trust_remote_code directory imports back with --hf_dir (its own arm).

flash-linear-attention checkpoints (model_type gla / retnet / gated_deltanet) import as their
own arm (gla / retnet / gdn) and export back to fla's format: a plain --export writes a model in
the format it was imported from (model.json's source_format), else its arm's (--export_format
picks another; a layer kind without a form in it is refused, naming the formats it has):

    python launch/convert.py --hf_dir=path/to/fla-gla-1.3B --out=runs/gla --architecture=own
    python launch/convert.py --export --model=runs/gla --out=path/to/fla_dir
"""

from __future__ import annotations

import os

from absl import app, flags, logging

from orthros_jax import checkpoint
from orthros_jax.config import cli
from orthros_jax.config.architectures import TWO_STREAM_FORM
from orthros_jax.convert import (
    export_hf,
    from_transformer,
    hf_tokenizer_file,
    load_hf,
    read_hf_config,
)
from orthros_jax.convert.fla_config import is_fla
from orthros_jax.convert.peft import import_peft
from orthros_jax.convert.remote import is_remote, load_remote
from orthros_jax.layers.kind import FLA, FORMATS, HF, REMOTE
from orthros_jax.layers.registry import kinds_of
from orthros_jax.model import num_params

FLAGS = flags.FLAGS
flags.DEFINE_string("hf_dir", None, "Hugging Face model directory to import.")
flags.DEFINE_string("out", None, "Output: a model directory (import) or a HF directory (export).")
TWO_STREAM = tuple(dict.fromkeys(TWO_STREAM_FORM.values()))  # orthros, orthros_h
flags.DEFINE_enum(
    "architecture",
    TWO_STREAM[0],
    [*TWO_STREAM, *TWO_STREAM_FORM, "own"],
    f"{' / '.join(TWO_STREAM)}: the two-stream conversion; "
    f"{' / '.join(TWO_STREAM_FORM)} / own: the checkpoint's own arm.",
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
flags.DEFINE_enum(
    "export_format",
    None,
    list(FORMATS),
    "Export format (default: the one the model was imported from, else the arm's).",
)
flags.DEFINE_integer("max_shard_mb", 5 * 1024, "Shard exported safetensors above this many MiB.")
flags.DEFINE_bool(
    "remote", False, "Export as trust_remote_code even where transformers has the class."
)
flags.DEFINE_bool(
    "peft_adapter",
    False,
    "Export: a LoRA model's base weights plus its adapters in peft's format (default: merged).",
)
flags.DEFINE_string(
    "peft_dir", None, "Import: a peft LoRA adapter directory to load onto the imported model."
)


def import_hf(hf_dir: str, out: str) -> None:
    """HF directory -> model directory (its own arm, or converted to Orthros / Orthros-H)."""
    hf = read_hf_config(hf_dir)
    if is_remote(hf):  # an exported orthros-jax model comes back as its own arm
        cfg, params = load_remote(hf_dir, param_dtype=FLAGS.param_dtype, dtype=FLAGS.dtype)
        checkpoint.save_model(
            out, cfg, params, hf_tokenizer_file(hf_dir), hf.get("max_position_embeddings"), REMOTE
        )
        print(
            f"wrote {cfg.architecture} model ({num_params(cfg):,} params) to {os.path.abspath(out)}"
        )
        return
    cfg, params = load_hf(hf_dir, param_dtype=FLAGS.param_dtype, dtype=FLAGS.dtype)
    logging.info("imported %s: %.1fM params", hf_dir, num_params(cfg) / 1e6)
    if FLAGS.peft_dir:  # the adapters on the plain model, before any Orthros conversion
        cfg, params = import_peft(FLAGS.peft_dir, cfg, params)
    source = FLA if is_fla(hf) else HF  # the checkpoint's own arm exports back to it
    if FLAGS.architecture in TWO_STREAM:
        if all(k.recurrent for k in kinds_of(cfg)):  # from_transformer adds the output stream
            raise ValueError(  # to attention layers
                f"a pure recurrent checkpoint ({cfg.architecture} arm, layer_types "
                f"{cfg.layer_types}) has no Orthros form; import it with --architecture=own"
            )
        source = None
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
    # The source's context: generate.py warns beyond it and --export writes it back.
    checkpoint.save_model(
        out,
        cfg,
        params,
        tokenizer_file=tokenizer,
        max_context=hf.get("max_position_embeddings"),
        source_format=source,
    )
    print(f"wrote {cfg.architecture} model ({num_params(cfg):,} params) to {os.path.abspath(out)}")


def export(model_dir: str, out: str) -> None:
    """Model directory or workdir (any arm) -> HF directory."""
    loaded = checkpoint.load_model(model_dir, merge_lora=not FLAGS.peft_adapter)
    files = export_hf(
        out,
        loaded.cfg,
        loaded.params,
        tokenizer_file=loaded.tokenizer_file,
        dtype=FLAGS.export_dtype,
        max_shard_bytes=FLAGS.max_shard_mb * 2**20,
        max_position=loaded.max_context,
        remote=True if FLAGS.remote else None,
        fmt=FLAGS.export_format,
        source=loaded.source_format,
        peft_adapter=FLAGS.peft_adapter,
    )
    print(f"wrote Hugging Face directory {os.path.abspath(out)}: {', '.join(files)}")


def main(argv: list[str]) -> None:
    try:
        run(argv)
    except ValueError as e:  # user errors (bad checkpoint/config): the message, no traceback
        raise SystemExit(f"convert.py: {e}") from None


def run(argv: list[str]) -> None:
    if not FLAGS["verbosity"].present:
        # Orbax logs every file it writes at INFO; default to warnings (--verbosity=0: all).
        logging.set_verbosity(logging.WARNING)
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
    cli.run(main, "convert.py")
