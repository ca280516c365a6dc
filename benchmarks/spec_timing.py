"""The one timing harness of plain against speculative decode loops: benchmarks/speculative.py's
suite "speed" and launch/benchmark.py's suite "speculative" (benchmarks/spec_suite.py) both
call `time_loops`, so their figures mean the same thing.

`time_loops` times generate's two on-device loops, `inference.api._generate_jit` (plain decode)
and `inference.speculative.generate_jit` (rounds of k drafts and one verify), from the same
cache and the same first-token logits, interleaved by `common.time_interleaved` (one warm-up
call each, then rounds that call plain and speculative in turn) and compared by `common.ratio`
(the median of the per-round ratios: a shared machine's drift hits both loops alike).

It also holds what the speed benchmarks (speculative.py's "speed", spec_engine.py) share:
held-out prompts, trained models to load, a markdown table of rows.

Shapes: B rows, V vocab, M = new_tokens tokens per row, S cache slots per row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common as bench
from orthros_jax.config import ModelConfig
from orthros_jax.inference import api as inference_api
from orthros_jax.inference import speculative as spec_lib
from orthros_jax.inference.cache import KVCache
from orthros_jax.inference.sampling import Sampler
from orthros_jax.inference.speculative import SpecStats, Speculative
from orthros_jax.model import Params

SLOT_UNIT = 128  # cache sizes round up to this, as generate's default cache_size does


def cache_room(new_tokens: int, spec: Speculative) -> int:
    """Free slots a row needs past its length in `time_loops`: new_tokens tokens plus a last
    round's k drafts and bonus token, so no round drafts fewer for want of a slot."""
    return new_tokens + spec.k + 2


def cache_slots(context: int, new_tokens: int, spec: Speculative) -> int:
    """Slots per row for `time_loops` of rows filled to `context`: context + cache_room,
    rounded up to SLOT_UNIT as generate's default cache is."""
    return -(-(context + cache_room(new_tokens, spec)) // SLOT_UNIT) * SLOT_UNIT


@dataclasses.dataclass(frozen=True)
class LoopTiming:
    """What `time_loops` measured. plain / speculative: `common.time_interleaved`'s entries
    (median_s, min_s, repeats, times_s: one per round); measured_ratio: speculative speed over
    plain, `common.ratio(plain, speculative)`; stats: the last speculative call's SpecStats
    (host arrays [B]); plain_tokens / spec_tokens: the last calls' tokens [B, M] (-1 past a
    row's end), for the greedy-identical check; greedy: whether the sampler was greedy."""

    plain: dict[str, Any]
    speculative: dict[str, Any]
    measured_ratio: float
    stats: SpecStats
    plain_tokens: np.ndarray
    spec_tokens: np.ndarray
    greedy: bool

    @property
    def decode_tokens(self) -> int:
        """Tokens a call's decode produces, B x (M - 1): the first token of each row is drawn
        from the given logits (the prefill's), not decoded."""
        bsz, new = self.plain_tokens.shape
        return bsz * (new - 1)

    @property
    def plain_tok_s(self) -> float:
        return self.decode_tokens / self.plain["median_s"]

    @property
    def spec_tok_s(self) -> float:
        return self.decode_tokens / self.speculative["median_s"]

    @property
    def round_over_step(self) -> float:
        """A speculative round's time in plain decode steps (medians; rounds: the most any row
        ran): what a round costs whatever it accepts."""
        rounds = max(1, int(self.stats.rounds.max()))
        steps = max(1, self.plain_tokens.shape[1] - 1)
        return (self.speculative["median_s"] / rounds) / (self.plain["median_s"] / steps)

    @property
    def slowest_row_rounds(self) -> float:
        """The most rounds any row ran over the rows' mean: the loop runs until its slowest row
        is done, so at batch > 1 its speed is a / round_over_step divided by this (1: every row
        took as many rounds)."""
        rounds = self.stats.rounds
        return float(rounds.max() / max(rounds.mean(), 1e-9))

    @property
    def identical(self) -> bool | None:
        """Greedy: whether speculative decode emitted plain decode's tokens; sampled: None
        (the two loops make different draws)."""
        if not self.greedy:
            return None
        return bool((self.plain_tokens == self.spec_tokens).all())


def time_loops(
    params: Params,
    cache: KVCache,
    logits: jax.Array,
    cfg: ModelConfig,
    spec: Speculative,
    *,
    new_tokens: int,
    repeats: int,
    sampler: Sampler | None = None,
) -> LoopTiming:
    """Times plain and speculative decode of new_tokens tokens per row (no stop ids, row seeds
    from PRNGKey(0)), `repeats` interleaved rounds after a warm-up call each, every call
    starting from `cache` (rows filled to its lengths, cache_room free slots past them) and
    logits [B, V] (the prefill's: the first token's). sampler: default greedy.

    The cache is donated (do not reuse it) and handed from call to call with its lengths put
    back, rather than rebuilt untimed before each call: a call writes only slots at or past a
    row's length (slot s holds position s; the kinds that speculate keep no other per-row
    state), so putting the lengths back restores the state every call starts from, exactly as
    a rejected draft's rollback does; and only one cache is ever held (a rebuilt copy would
    double the device memory of a long-context cache, and re-copy it every call)."""
    lengths = np.asarray(cache.lengths)
    need = int(lengths.max()) + cache_room(new_tokens, spec)
    if cache.max_len < need:
        raise ValueError(
            f"time_loops: cache of {cache.max_len} slots; rows of {int(lengths.max())} tokens "
            f"with new_tokens={new_tokens} at k={spec.k} need {need} (cache_slots)"
        )
    spec_lib.check(spec, cfg, cache.max_len, sequence_split=False)
    sampler = sampler or Sampler()
    stops = jnp.full((lengths.shape[0], 1), -1, jnp.int32)  # no stop ids: every row runs M
    state: dict[str, Any] = {"cache": cache}
    last: dict[str, tuple] = {}
    loops: dict[str, tuple[Any, dict[str, Any]]] = {
        "plain": (inference_api._generate_jit, dict(mesh=None)),
        "speculative": (spec_lib.generate_jit, dict(spec=spec)),
    }

    def call_of(name: str) -> Any:
        loop, how = loops[name]

        def call() -> jax.Array:
            res = loop(
                params,
                state["cache"],
                logits,
                jax.random.PRNGKey(0),
                stops,
                cfg=cfg,
                sampler=sampler,
                max_new_tokens=new_tokens,
                **how,
            )
            # A new lengths array: the returned cache's leaves are donated to the next call.
            state["cache"] = res[4].replace(lengths=jnp.asarray(lengths))
            last[name] = (res[0], *res[5:])  # tokens, and speculation's SpecStats
            return res[0]

        return call

    timing = bench.time_interleaved({name: call_of(name) for name in loops}, repeats)
    plain, speculative = timing["plain"], timing["speculative"]
    return LoopTiming(
        plain=plain,
        speculative=speculative,
        measured_ratio=bench.ratio(plain, speculative),
        stats=jax.tree.map(np.asarray, last["speculative"][1]),
        plain_tokens=np.asarray(last["plain"][0]),
        spec_tokens=np.asarray(last["speculative"][0]),
        greedy=sampler.is_greedy,
    )


def held_out_prompts(context: int, batch: int) -> np.ndarray:
    """[batch, context] byte ids: slices at random offsets of distinct held-out documents of the
    embedded corpus (the training split's complement at the default validation fraction)."""
    from orthros_jax.data import DataConfig
    from orthros_jax.data.corpus import embedded_documents, is_validation

    frac = DataConfig().validation_fraction
    docs = [d.text.encode() for d in embedded_documents() if is_validation(d.id, frac)]
    long = [d for d in docs if len(d) >= context]
    if not long:
        raise ValueError(f"--contexts: no held-out document has {context} bytes")
    rs = np.random.RandomState(context)
    rows = []
    for i in rs.choice(len(long), batch, replace=len(long) < batch):
        start = rs.randint(0, len(long[i]) - context + 1)
        rows.append(np.frombuffer(long[i][start : start + context], np.uint8))
    return np.stack(rows).astype(np.int32)


def trained_models(items: list[str]) -> list[tuple[str, ModelConfig, Any]]:
    """(arm, cfg, device params) of each --speed_models item, arm=directory (load_model)."""
    from orthros_jax.checkpoint import load_model

    out = []
    for item in items:
        arm, _, directory = item.partition("=")
        if not directory:
            raise ValueError(f"--speed_models: {item!r} is not arm=directory")
        loaded = load_model(directory)
        out.append((arm, loaded.cfg, jax.device_put(loaded.params)))
    return out


def table(rows: list[dict], skip: tuple[str, ...] = ()) -> str:
    """Markdown table of rows (dicts with the first row's keys, less `skip`)."""
    if not rows:
        return ""
    keys = [k for k in rows[0] if k not in skip]
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)
