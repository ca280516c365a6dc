"""An lm-evaluation-harness model for every arm: `--model orthros_jax`.

    python -m orthros_jax.evaluation.harness --model orthros_jax --model_args model=runs/x \
        --batch_size 16 --tasks arc_easy,piqa

    import lm_eval
    from orthros_jax.evaluation.harness import OrthrosHarnessLM
    lm = OrthrosHarnessLM(model="runs/x")          # or OrthrosHarnessLM(loaded=load_model(...))
    results = lm_eval.simple_evaluate(model=lm, tasks=["arc_easy"])

lm-eval 0.4 resolves `--model` names only through its own registry (no entry-point plugins),
so the `lm_eval` command does not know this model: `python -m orthros_jax.evaluation.harness`
registers it and then runs lm-eval's own command line, with every lm-eval option (give the
batch size as --batch_size, lm-eval's flag, whose default is 1; not in --model_args).

* loglikelihood: one SFT-mode forward per batch, output copies only at the continuation's
  positions (scoring.py); contexts left-truncated to max_length as lm-eval's `hf` model does.
* loglikelihood_rolling: lm-eval's disjoint windows of max_length, every token scored once.
* generate_until: `inference.generate` (greedy unless the task samples), stop strings applied
  to the decoded text; single-token stop strings and EOS also stop the decode loop early.

Tokens: the model directory's tokenizer.json (special tokens added as Hugging Face adds them,
BOS read off the tokenizer's post-processor) or UTF-8 bytes. A byte model has no end-of-text
token; "\\n" (id 10) stands in as the prefix of an empty context.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

EXTRA_HINT = "needs lm-evaluation-harness: pip install -e '.[eval]'"
try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import (
        handle_stop_sequences,
        normalize_gen_kwargs,
        postprocess_generated_text,
    )
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ModuleNotFoundError as e:
    if e.name != "lm_eval" and not str(e.name).startswith("lm_eval."):
        raise
    if __name__ == "__main__":
        raise SystemExit(f"python -m orthros_jax.evaluation.harness {EXTRA_HINT}") from None
    raise ModuleNotFoundError(f"orthros_jax.evaluation.harness {EXTRA_HINT}", name=e.name) from e

from orthros_jax.checkpoint import LoadedModel, load_model  # noqa: E402
from orthros_jax.evaluation.scoring import bucket, score_row, score_rows  # noqa: E402
from orthros_jax.evaluation.text import HarnessTokenizer  # noqa: E402
from orthros_jax.inference.sampling import Sampler  # noqa: E402
from orthros_jax.model import num_params  # noqa: E402

MODEL_NAME = "orthros_jax"
DATASET_HINT = (
    "Download it where the Hugging Face Hub is reachable (running the same task there once "
    "fills ~/.cache/huggingface/datasets), copy that cache to this machine (or point "
    "HF_DATASETS_CACHE at it) and rerun with HF_DATASETS_OFFLINE=1"
)

DEFAULT_MAX_LENGTH = 2048  # lm-eval's `hf` default when a model states no length
GEN_KEYS = ("until", "max_gen_toks", "do_sample", "temperature", "top_p", "top_k")
log = logging.getLogger(__name__)


def _int_arg(name: str, value: Any, minimum: int = 1) -> int:
    """A positive int from a model_args value (ints arrive as ints or digit strings)."""
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{MODEL_NAME}: {name} must be an int, got {value!r}") from None
    if out < minimum or isinstance(value, bool) or (isinstance(value, float) and value != out):
        raise ValueError(f"{MODEL_NAME}: {name} must be an int >= {minimum}, got {value!r}")
    return out


@register_model(MODEL_NAME, "orthros-jax")
class OrthrosHarnessLM(TemplateLM):
    """Any checkpoint or converted model of any arm as an lm-eval model.

    model: a model directory or training workdir (checkpoint.load_model), or `loaded`: an
    already loaded model. batch_size: rows per forward ("auto" = 16; rows are padded so the
    compiled shapes stay few). max_length: tokens of context + continuation per forward.
    max_gen_toks: default generation budget. add_bos_token: None = as the tokenizer.json's
    post-processor does. eos_token / prefix_token_id: override what is read off the tokenizer.
    device, max_batch_size: accepted for lm-eval's sake and ignored (JAX picks the device).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        loaded: LoadedModel | None = None,
        batch_size: int | str | None = 16,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        add_bos_token: bool | None = None,
        eos_token: str | None = None,
        prefix_token_id: int | None = None,
        seed: int = 0,
        device: str | None = None,
        max_batch_size: int | None = None,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            raise ValueError(
                f"{MODEL_NAME}: unknown model_args {sorted(unknown)}; valid: model, batch_size, "
                "max_length, max_gen_toks, add_bos_token, eos_token, prefix_token_id, seed"
            )
        if (model is None) == (loaded is None):
            raise ValueError(f"{MODEL_NAME}: give exactly one of model=<dir> or loaded=<model>")
        if loaded is None:
            loaded = load_model(str(model))
        self.cfg, self.params = loaded.cfg, jax.device_put(loaded.params)
        self.model_path = str(model) if model is not None else None
        if batch_size in (None, "auto") or str(batch_size).startswith("auto"):
            batch_size = 16
        self.batch_size = _int_arg("batch_size", batch_size)
        # As lm-eval's `hf` model reads max_position_embeddings: the model's own context first.
        self._max_length = _int_arg(
            "max_length", max_length or loaded.max_context or DEFAULT_MAX_LENGTH
        )
        if note := loaded.beyond_context(self._max_length):
            log.warning("%s: max_length=%d: %s", MODEL_NAME, self._max_length, note)
        self.max_gen_toks = _int_arg("max_gen_toks", max_gen_toks)
        self.seed = _int_arg("seed", seed, minimum=0)
        self.tok = HarnessTokenizer(loaded.tokenizer_file, eos_token=eos_token)
        if self.tok.vocab_size > self.cfg.vocab_size:
            raise ValueError(
                f"{MODEL_NAME}: the tokenizer has {self.tok.vocab_size} ids but the model's "
                f"vocab_size is {self.cfg.vocab_size}"
            )
        self.add_bos_token = add_bos_token
        self.custom_prefix_token_id = prefix_token_id
        # lm-eval's torch device names mean nothing to JAX; its own default ('cuda:0', which
        # the user never set) is not worth a warning.
        if device not in (None, "cpu", "cuda", "cuda:0"):
            log.warning("%s: device=%r is ignored; JAX uses %s", MODEL_NAME, device, jax.devices())

    # ------------------------------------------------------------ tokens
    @property
    def eot_token_id(self) -> int:
        return self.tok.eot_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return int(self.custom_prefix_token_id)
        return self.tok.bos_id if self.tok.bos_id is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return self.tok.name

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        """Token ids of a string; special tokens as the `hf` model adds them: by default the
        tokenizer's (BOS for Llama), none when the string already starts with the prefix."""
        if add_special_tokens is None:
            add_special_tokens = True if self.add_bos_token is None else bool(self.add_bos_token)
            prefix = self.tok.decode([self.prefix_token_id])
            if prefix and string.startswith(prefix):
                add_special_tokens = False
        return self.tok.encode(string, add_special_tokens=add_special_tokens)

    def tok_decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ids; special tokens dropped by default (as the `hf` model decodes outputs)."""
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt=True):
        raise ValueError(
            f"{MODEL_NAME}: chat templates are not supported (the model directory holds only a "
            "tokenizer.json); run without --apply_chat_template"
        )

    def get_model_info(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "model_path": self.model_path,
            "architecture": c.architecture,
            "window": c.window,
            "model_num_parameters": num_params(c),
            "model_dtype": c.dtype,
            "max_length": self.max_length,
        }

    # ------------------------------------------------------------ scoring
    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        """(log p(continuation | context), greedy?) per (key, context ids, continuation ids)."""
        rows = []
        for key, context, continuation in requests:
            try:
                rows.append(score_row(context, continuation, self.max_length))
            except ValueError as e:
                raise ValueError(f"{MODEL_NAME}: request {key!r}: {e}") from None
        with tqdm(
            total=len(rows), disable=disable_tqdm, desc="Running loglikelihood requests"
        ) as bar:
            out = score_rows(
                self.cfg, self.params, rows, self.batch_size, self.max_length, bar.update
            )
        for (key, _, _), answer in zip(requests, out, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole strings: disjoint windows of max_length tokens, the first
        conditioned on the prefix token, each later one on the tokens before it."""
        windows, owner = [], []
        for i, (string,) in enumerate(req.args for req in requests):
            tokens = self.tok_encode(string)
            for ctx, cont in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=tokens,
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                windows.append((None, ctx, cont))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for i, (logp, _) in zip(owner, scores, strict=True):
            totals[i] += logp
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ------------------------------------------------------------ generation
    def _gen_settings(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], int, Sampler]:
        kwargs = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
        unsupported = sorted(set(kwargs) - set(GEN_KEYS))
        if unsupported:
            raise ValueError(
                f"{MODEL_NAME}: generation option(s) {unsupported} are not supported; "
                f"supported: {', '.join(GEN_KEYS)}"
            )
        eos = self.tok.decode([self.tok.eos_id]) if self.tok.eos_id is not None else None
        until = handle_stop_sequences(kwargs["until"], eos=eos)
        sampler = Sampler()
        if kwargs["do_sample"]:
            sampler = Sampler(
                temperature=float(kwargs.get("temperature", 1.0)),
                top_k=int(kwargs.get("top_k", 0) or 0),
                top_p=float(kwargs.get("top_p", 1.0) or 1.0),
            )
        return until, int(kwargs["max_gen_toks"]), sampler

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy (or the task's sampling) continuations, cut at the first stop string."""
        from orthros_jax.inference import generate

        args = [req.args for req in requests]
        groups: dict[str, list[int]] = {}
        for i, (_, gen_kwargs) in enumerate(args):
            groups.setdefault(json.dumps(gen_kwargs, sort_keys=True, default=str), []).append(i)
        out = [""] * len(args)
        bar = tqdm(total=len(args), disable=disable_tqdm, desc="Running generate_until requests")
        for n_group, idx in enumerate(groups.values()):
            until, max_gen, sampler = self._gen_settings(args[idx[0]][1])
            room = self.max_length - max_gen
            if room < 1:
                raise ValueError(
                    f"{MODEL_NAME}: max_gen_toks={max_gen} leaves no room for a prompt in "
                    f"max_length={self.max_length}; raise max_length"
                )
            stops = [self.tok.eos_id] if self.tok.eos_id is not None else []
            for s in until:
                ids = self.tok.encode(s, add_special_tokens=False)
                if len(ids) == 1:  # multi-token stops are cut from the text afterwards
                    stops.append(ids[0])
            prompts = {
                i: (self.tok_encode(args[i][0]) or [self.prefix_token_id])[-room:] for i in idx
            }
            order = sorted(idx, key=lambda i: -len(prompts[i]))
            for b, start in enumerate(range(0, len(order), self.batch_size)):
                chunk = order[start : start + self.batch_size]
                batch = [prompts[i] for i in chunk]
                batch += [batch[0]] * (self.batch_size - len(batch))  # fixed shapes: few compiles
                rng = jax.random.fold_in(jax.random.PRNGKey(self.seed), n_group * 100_003 + b)
                gen = generate(
                    self.params,
                    batch,
                    self.cfg,
                    max_new_tokens=max_gen,
                    sampler=sampler,
                    rng=rng,
                    stop_tokens=sorted(set(stops)),
                    cache_size=bucket(len(batch[0]) + max_gen, 128),
                )
                for r, i in enumerate(chunk):
                    ids = np.asarray(gen.tokens[r, : int(gen.lengths[r])])
                    text = postprocess_generated_text(self.tok_decode(ids), until, None)
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", args[i], text)
                bar.update(len(chunk))
        bar.close()
        return out


def main(argv: Sequence[str] | None = None) -> None:
    """lm-eval's command line with `--model orthros_jax` registered (see the module doc)."""
    import datasets
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        cli_evaluate()
    except ValueError as e:  # our model's errors (a bad model dir, model_args)
        raise SystemExit(f"python -m orthros_jax.evaluation.harness: {e}") from None
    except (OSError, datasets.exceptions.DatasetsError) as e:  # e.g. an unreachable Hub
        raise SystemExit(
            f"python -m orthros_jax.evaluation.harness: a task's dataset cannot be loaded here "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). {DATASET_HINT}"
        ) from None


if __name__ == "__main__":
    main()
