"""launch/benchmark.py's suite "speculative": self-speculative decoding against plain decoding
through generate's on-device loops, both arms (Orthros; the Transformer's MagicDec-style
rounds), at each context in c.spec_contexts (benchmarks/device_check.sh runs it on the GPU).

No prefill: each arm decodes on one cache holding `context` random K/V entries per row, its
length put back to `context` after every call (the slots past it are stale, as after a
rollback), so plain and speculative calls read the same cache. Random weights accept almost no
drafts, so the measured ratio is a round's cost with nothing gained; "round / step" is a
round's time in plain decode steps, and the projection c.spec_acceptance / (round / step) uses
the acceptance measured on a trained model (docs/speculative.md: 4.33 tokens per verify at
k = 4, draft window = w): a projection, not a measurement.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common as bench
from orthros_jax.config import ModelConfig
from orthros_jax.inference import Speculative
from orthros_jax.inference import api as inference_api
from orthros_jax.inference import speculative as spec_lib
from orthros_jax.inference.sampling import Sampler
from orthros_jax.model import Params


def _loop_calls(
    cfg: ModelConfig, params: Params, context: int, c: Any, spec: Speculative
) -> tuple[dict[str, Any], dict[str, Any]]:
    """No-argument calls of the plain and the speculative greedy loop (c.spec_new_tokens
    tokens per row), sharing one cache; the second dict holds the speculative call's last
    SpecStats under "stats"."""
    bsz, new = c.batch_size, c.spec_new_tokens
    state = {"cache": bench.filled_cache(cfg, bsz, context, new + spec.k + 2)}
    logits = jnp.zeros((bsz, cfg.vocab_size), jnp.float32)
    stops = jnp.full((bsz, 1), -1, jnp.int32)
    common = dict(cfg=cfg, sampler=Sampler(), max_new_tokens=new)
    out: dict[str, Any] = {}

    def call(loop: Any, **kw: Any) -> Any:
        def run() -> jax.Array:
            res = loop(params, state["cache"], logits, jax.random.PRNGKey(0), stops, **kw)
            # The context again (a new array: the cache's leaves are donated to the next call).
            state["cache"] = res[4].replace(lengths=jnp.full((bsz,), context, jnp.int32))
            if len(res) > 5:
                out["stats"] = res[5]
            return res[0]

        return run

    calls = {
        "plain": call(inference_api._generate_jit, **common, mesh=None),
        "speculative": call(spec_lib.generate_jit, **common, spec=spec),
    }
    return calls, out


def speculative_suite(c: Any, cfgs: dict[str, ModelConfig], params: dict, results: dict) -> None:
    """Per context and arm of c.spec_arms: plain and speculative tokens/s (k = c.spec_k, draft
    window = the model's window), tokens per verify, a round's time in plain steps, the
    measured ratio (median of per-round ratios) and the projection at c.spec_acceptance."""
    bsz, new = c.batch_size, c.spec_new_tokens
    rows = []
    for context in c.spec_contexts:
        row: dict[str, Any] = {"context": context, "k": c.spec_k, "new_tokens": new}
        for name in c.spec_arms:
            cfg = cfgs[name]
            spec = Speculative(c.spec_k, cfg.window)
            calls, out = _loop_calls(cfg, params[name], context, c, spec)
            timing = bench.time_interleaved(calls, c.repeats)  # one arm's cache at a time
            plain, sp = timing["plain"], timing["speculative"]
            stats = jax.tree.map(np.asarray, out["stats"])
            rounds = max(1, int(stats.rounds.max()))
            round_over_step = (sp["median_s"] / rounds) / (plain["median_s"] / max(1, new - 1))
            row[name] = {
                "draft_window": spec.draft_window,
                "plain_tok_s": bsz * new / plain["median_s"],
                "spec_tok_s": bsz * new / sp["median_s"],
                "tokens_per_verify": float(
                    (stats.accepted.sum() + stats.rounds.sum()) / max(1, stats.rounds.sum())
                ),
                "round_over_step": round_over_step,
                "measured_ratio": bench.ratio(plain, sp),
                "acceptance": c.spec_acceptance,
                "projected_ratio": c.spec_acceptance / round_over_step,
                "timing": timing,
            }
            del calls, out  # this arm's cache goes before the next one's is made
        rows.append(row)
        brief = {
            k: {m: x for m, x in v.items() if m != "timing"} if isinstance(v, dict) else v
            for k, v in row.items()
        }
        print(f"speculative ctx={context}: {brief}", flush=True)
    results["speculative"] = rows
