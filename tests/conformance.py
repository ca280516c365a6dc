"""The conformance suite's cases and shared models, read from the registries.

Every registered layer kind (layers/registry.KINDS) runs in up to three layouts, each built
from an architecture of arms.py: "pure" (a single-stream arm made of the kind alone),
"hybrid" (a recurrent kind in the single-stream arm that mixes it with attention) and
"two_stream" (the kind in a two-stream arm: the orthros_h cycle for a recurrent kind, Orthros
itself for attention). What the tests cannot read from the kinds' declarations (tiny option
values, option sets that change the parameter tree, what an export format needs) comes from
`profile`, the one per-kind function.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config

from orthros_jax.config import ModelConfig
from orthros_jax.config.architectures import ARCHITECTURES
from orthros_jax.layers.registry import KINDS
from orthros_jax.model import OrthrosLM, init_params

LAYOUTS = ("pure", "hybrid", "two_stream")
# vocab 61, window 5, prefill chunk 6 (kernel chunks are 4: boundaries misaligned everywhere);
# init_std 0.1 so that logits are far from greedy ties.
BASE = dict(
    vocab_size=61,
    window=5,
    prefill_chunk=6,
    init_std=0.1,
    n_layers=2,
    attention_block_q=8,
    attention_block_k=8,
    attention_block_cache_kib=1,
)
# The bench model's head shape (8 heads of 64, 8 layers), where XLA:CPU's copy decisions are
# those of a real model: the compiled-decode check runs there.
BENCH = dict(n_layers=8, d_model=128, n_heads=8, n_kv_heads=8, head_dim=16, d_ff=256)


@dataclasses.dataclass(frozen=True)
class Profile:
    """What the suite needs of a kind beyond its declarations (layers/kind.py).

    options: its section of ModelConfig.kinds for a tiny model (kernel chunk 4, GQA where it
      has it). bench: the section at the bench head shape (the compiled-decode check).
    variants: ModelConfig changes that alter its parameter tree (num_params is checked on each).
    export_needs: format -> ModelConfig changes without which that export is refused (a
      format's own conventions, e.g. Qwen3.5's attention options).
    """

    options: dict[str, Any]
    bench: dict[str, Any]
    variants: tuple[dict[str, Any], ...] = ()
    export_needs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


def profile(kind: str) -> Profile:
    """The per-kind adapter: the one place where the suite names a kind (registering a kind is
    enough to run it through the suite; an entry here makes its model tinier)."""
    heads64 = dict(heads=8, kv_heads=8, k_head_dim=64, v_head_dim=64)
    qwen35 = dict(qk_norm=True, attn_output_gate=True, norm_zero_centered=True)
    table: dict[str, Profile] = {
        "attention": Profile(
            options={}, bench={}, variants=({"attn_output_gate": True, "qk_norm": True},)
        ),
        "gdn": Profile(
            options=dict(
                num_k_heads=2, num_v_heads=4, k_head_dim=8, v_head_dim=6, conv_kernel=3, chunk=4
            ),
            bench=dict(num_k_heads=4, num_v_heads=8, k_head_dim=64, v_head_dim=64),
            export_needs={"hf": qwen35},
        ),
        "gla": Profile(
            options=dict(
                heads=4,
                kv_heads=2,
                k_head_dim=8,
                v_head_dim=6,
                short_conv=True,
                conv_kernel=3,
                chunk=4,
            ),
            bench=heads64 | dict(short_conv=False),
            variants=({"kinds": {"gla": {"output_gate": False, "short_conv": False}}},),
        ),
        "retention": Profile(
            options=dict(heads=4, kv_heads=2, k_head_dim=8, v_head_dim=6, chunk=4),
            bench=heads64,
            variants=({"kinds": {"retention": {"norm_affine": False}}},),
        ),
        # transformers' Mamba2ForCausalLM blocks have no FFN.
        "mamba2": Profile(
            options={}, bench={}, export_needs={"hf": {"kinds": {"mamba2": {"ffn": False}}}}
        ),
    }
    # A kind without an entry runs at its own default options.
    return table.get(kind, Profile(options={}, bench={}))


def recurrent(kind: str) -> bool:
    return KINDS[kind].recurrent


def _arm_for(kind: str, layout: str) -> tuple[str, tuple[str, ...]] | None:
    """(architecture, layer_types) of the kind in a layout, from config.ARMS; None when no arm
    makes that layout of this kind."""
    arms = ARCHITECTURES
    if layout == "pure" or (layout == "two_stream" and not recurrent(kind)):
        two = layout == "two_stream"
        for name, arm in arms.items():
            if arm.kinds == {kind} and arm.two_streams == two:
                return name, (kind,)
        return None
    if not recurrent(kind):
        return None  # "hybrid with attention" of a non-recurrent kind: its pure stack
    for name, arm in arms.items():
        if arm.any_recurrent and arm.two_streams == (layout == "two_stream"):
            partners = [k for k in arm.layer_types if not recurrent(k)]
            return name, (kind, *dict.fromkeys(partners))
    return None


# The FFN seam (layers/ffn.py) under the suite: a case (kind, layout, "moe") is its
# (kind, layout) case with ModelConfig.moe, the kind's layer a MoE FFN and the next a dense one
# (with a shared expert). The two-stream layout of the first attention-like kind (its own
# stack: paired routing) and of the first recurrent kind (the orthros_h cycle: independent
# routing, a recurrent layer cannot read its last prompt token alone) run so.
MOE = dict(n_experts=4, top_k=2, d_expert=16, shared_expert=8, ffn_cycle=("moe", "dense"))
MOE_LAYOUT = "two_stream"


def _moe_kinds() -> list[str]:
    first = lambda rec: next(k for k in KINDS if recurrent(k) == rec)  # noqa: E731
    return [first(False), first(True)]


def cases() -> list[tuple[str, ...]]:
    """Every (kind, layout) that the registries make, in registry order, then the MoE cases
    (kind, layout, "moe")."""
    plain = [(k, lay) for k in KINDS for lay in LAYOUTS if _arm_for(k, lay) is not None]
    moe = [(k, MOE_LAYOUT, "moe") for k in _moe_kinds() if _arm_for(k, MOE_LAYOUT) is not None]
    return plain + moe


def case_id(case: tuple[str, ...]) -> str:
    return "-".join(case)


# The fast tier (-m "not slow") runs every kind in its two-stream layout, the one that drives
# every path (two streams, and for a recurrent kind attention beside it); the full suite runs
# every layout.
FAST_LAYOUT = "two_stream"


def case_params(tier: bool = True, layouts: tuple[str, ...] = LAYOUTS) -> list[Any]:
    """cases() in `layouts` as pytest params with ids; tier=True marks the layouts other than
    FAST_LAYOUT slow."""
    slow = lambda c: tier and c[1] != FAST_LAYOUT  # noqa: E731
    return [
        pytest.param(c, id=case_id(c), marks=[pytest.mark.slow] if slow(c) else [])
        for c in cases()
        if c[1] in layouts
    ]


def config(case: tuple[str, ...], bench: bool = False, **changes: Any) -> ModelConfig:
    """The tiny ModelConfig of a case (the bench head shape with bench=True), one cycle per
    two layers' worth of kinds (a MoE case: with MOE, routing paired where every kind reads its
    last token alone, else independent)."""
    kind, layout, *ffn = case
    arch = _arm_for(kind, layout)
    assert arch is not None, case
    architecture, cycle = arch
    sections = {k: profile(k).options | (profile(k).bench if bench else {}) for k in cycle}
    base = BASE | (BENCH if bench else {})
    base["n_layers"] = max(base["n_layers"], len(cycle))
    fields = base | {"architecture": architecture, "layer_types": cycle}
    if ffn:
        paired = all(KINDS[k].reads_last_token for k in cycle)
        fields["moe"] = MOE | {"routing": "paired" if paired else "independent"}
    cfg = tiny_config(**fields, kinds={k: v for k, v in sections.items() if v})
    return cfg.replace(**changes) if changes else cfg


def _off_init(params: dict[str, Any]) -> dict[str, Any]:
    """Scale-offset vectors and norm gains moved off their init (0.3 N(0, 1)), so that the two
    streams differ and the norms matter."""
    out = {}
    for key, stack in params.items():
        if isinstance(stack, dict):
            stack = {
                n: a + 0.3 * jax.random.normal(jax.random.PRNGKey(len(n) + i), a.shape)
                if ("so_" in n or n.endswith("norm"))
                else a
                for i, (n, a) in enumerate(sorted(stack.items()))
            }
        out[key] = stack
    return out


ROWS, LEN = 4, 21  # every forward of a case runs at [ROWS, LEN]: two compiles per case


@functools.cache
def model(case: tuple[str, ...]) -> tuple[ModelConfig, Any, Callable[..., np.ndarray]]:
    """(cfg, params, forward) of a case, built once per test process. forward(tokens [b, t],
    positions=, segment_ids=, output_positions=) -> float64 logits [b, t or T_out, V]: rows
    and tokens padded to [ROWS, LEN] (positions arange, one segment by default), so that every
    call with or without output positions shares one compiled program."""
    cfg = config(case)
    # One program for init and the offsets (eager, the offsets compiled an op per leaf shape).
    params = jax.jit(lambda key: _off_init(init_params(cfg, key)))(jax.random.PRNGKey(1))
    apply = jax.jit(
        lambda p, t, pos, seg, **a: OrthrosLM(cfg).apply(
            {"params": p}, t, positions=pos, segment_ids=seg, **a
        )
    )

    def forward(toks, positions=None, segment_ids=None, output_positions=None) -> np.ndarray:
        b, t = toks.shape
        tok = np.zeros((ROWS, LEN), np.int32)
        pos = np.broadcast_to(np.arange(LEN, dtype=np.int32), (ROWS, LEN)).copy()
        seg = np.zeros((ROWS, LEN), np.int32)  # padding: segment 0, after every real token
        tok[:b, :t] = toks
        pos[:b, :t] = np.arange(t) if positions is None else positions
        seg[:b, :t] = 1 if segment_ids is None else segment_ids
        kw = {}
        if output_positions is not None:
            idx = np.zeros((ROWS, output_positions.shape[1]), np.int32)
            idx[:b] = output_positions
            kw["output_positions"] = jnp.asarray(idx)
        out = np.asarray(apply(params, tok, pos, seg, **kw), np.float64)
        return out[:b] if output_positions is not None else out[:b, :t]

    return cfg, params, forward


def tokens(cfg: ModelConfig, batch: int, length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (batch, length))
