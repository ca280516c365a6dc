"""launch/benchmark.py's suite "speculative": self-speculative decoding against plain decoding
through generate's on-device loops, both arms (Orthros; the Transformer's MagicDec-style
rounds), at each context in c.spec_contexts (benchmarks/device_check.sh runs it on the GPU).

No prefill: each arm decodes on one cache holding `context` random K/V entries per row, timed
by benchmarks/spec_timing.time_loops (the harness of benchmarks/speculative.py's suite "speed"
too: plain and speculative calls interleaved over the same cache). Random weights accept almost no
drafts, so the measured ratio is a round's cost with nothing gained; "round / step" is a
round's time in plain decode steps, and the projection c.spec_acceptance / (round / step) uses
the acceptance measured on a trained model (docs/speculative.md: 4.33 tokens per verify at
k = 4, draft window = w): a projection, not a measurement.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from benchmarks import common as bench
from benchmarks import spec_timing
from orthros_jax.config import ModelConfig
from orthros_jax.inference import Speculative


def speculative_suite(c: Any, cfgs: dict[str, ModelConfig], params: dict, results: dict) -> None:
    """Per context and arm of c.spec_arms: plain and speculative decode tokens/s (k = c.spec_k,
    draft window = the model's window, c.spec_new_tokens tokens per row), tokens per verify, a
    round's time in plain steps, the measured ratio (median of per-round ratios) and the
    projection at c.spec_acceptance."""
    bsz, new = c.batch_size, c.spec_new_tokens
    rows = []
    for context in c.spec_contexts:
        row: dict[str, Any] = {"context": context, "k": c.spec_k, "new_tokens": new}
        for name in c.spec_arms:
            cfg = cfgs[name]
            spec = Speculative(c.spec_k, cfg.window)
            room = spec_timing.cache_slots(context, new, spec) - context
            t = spec_timing.time_loops(  # one arm's cache at a time: freed when it returns
                params[name],
                bench.filled_cache(cfg, bsz, context, room),
                jnp.zeros((bsz, cfg.vocab_size), jnp.float32),
                cfg,
                spec,
                new_tokens=new,
                repeats=c.repeats,
            )
            row[name] = {
                "draft_window": spec.draft_window,
                "plain_tok_s": t.plain_tok_s,
                "spec_tok_s": t.spec_tok_s,
                "tokens_per_verify": t.stats.tokens_per_verify(),
                "round_over_step": t.round_over_step,
                "measured_ratio": t.measured_ratio,
                "acceptance": c.spec_acceptance,
                "projected_ratio": c.spec_acceptance / t.round_over_step,
                "timing": {"plain": t.plain, "speculative": t.speculative},
            }
        rows.append(row)
        brief = {
            k: {m: x for m, x in v.items() if m != "timing"} if isinstance(v, dict) else v
            for k, v in row.items()
        }
        print(f"speculative ctx={context}: {brief}", flush=True)
    results["speculative"] = rows
