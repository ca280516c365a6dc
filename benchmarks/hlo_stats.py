"""Bytes moved by the collectives of a compiled XLA program, read from its HLO text, and XLA's
cost analysis of a compiled program (cost_analysis).

Used to check communication claims from the program itself (e.g. a halo exchange moves the
same bytes at any sequence length while an all-gather grows with it), not from a timer.
"""

from __future__ import annotations

import re
from typing import Any

import jax

COLLECTIVE_KINDS = (
    "all-gather",
    "collective-permute",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
)

# Bytes per element of XLA's primitive types (the sub-byte ones rounded up to one byte).
_DTYPE_BYTES = {
    "pred": 1,
    "s2": 1,
    "u2": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}

# `%name = <result shape> <opcode>(`; an async collective counts at its `-done` (the result),
# never at its `-start` (whose tuple also holds the operands).
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<op>" + "|".join(re.escape(k) for k in COLLECTIVE_KINDS) + r")(?:-done)?\("
)
_ARRAY = re.compile(r"\b(?P<dtype>[a-z]+[0-9]*(?:e[0-9]+m[0-9]+\w*)?)\[(?P<dims>[0-9,]*)\]")


def _element_bytes(dtype: str) -> int:
    if dtype in _DTYPE_BYTES:
        return _DTYPE_BYTES[dtype]
    if dtype.startswith("f8") or dtype.startswith("f4") or dtype.startswith("f6"):
        return 1
    raise ValueError(f"collective_bytes: unknown HLO element type {dtype!r}")


def shape_bytes(shape_text: str) -> int:
    """Bytes of an HLO result shape, e.g. 'f32[2,8]{1,0}' or a tuple '(f32[2], bf16[4,4])'."""
    total = 0
    for m in _ARRAY.finditer(shape_text):
        count = 1
        for d in filter(None, m["dims"].split(",")):
            count *= int(d)
        total += count * _element_bytes(m["dtype"])
    return total


def collective_bytes(compiled_or_hlo_text: Any) -> dict[str, int]:
    """Bytes of the results of each kind of collective in a compiled program, per device.

    compiled_or_hlo_text: `jitted.lower(...).compile()` (anything with `as_text()`) or its HLO
    text. Returns {kind: bytes} for every kind of COLLECTIVE_KINDS (0 when absent): the sum of
    result shape x element size over that kind's instructions. Each instruction counts once as
    written, so a collective inside a loop body counts once, not once per trip.
    """
    text = compiled_or_hlo_text
    if not isinstance(text, str):
        if not hasattr(text, "as_text"):
            raise ValueError(
                "collective_bytes: expected HLO text or a compiled program "
                f"(jitted.lower(...).compile()), got {type(text).__name__}"
            )
        text = text.as_text()
    if "HloModule" not in text:
        raise ValueError(
            "collective_bytes: the text is not an XLA HLO module (no 'HloModule'); pass "
            "jitted.lower(...).compile() or its as_text(), not the lowered StableHLO"
        )
    out = dict.fromkeys(COLLECTIVE_KINDS, 0)
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            out[m["op"]] += shape_bytes(m["shape"])
    return out


def cost_analysis(compiled: Any) -> dict[str, float]:
    """{"flops", "bytes accessed"} of a compiled per-device program by XLA's HloCostAnalysis
    (a scanned loop body counted once). The GPU compiler's AOT executable reports none: its
    optimized module is then costed by the CPU client's HloCostAnalysis, the same generic
    per-instruction count of operand and output bytes."""
    cost = compiled.cost_analysis()
    if not cost:
        from jax._src.lib import xla_client

        module = compiled.runtime_executable().hlo_modules()[0]
        cpu = jax.local_devices(backend="cpu")[0].client
        cost = xla_client._xla.hlo_module_cost_analysis(cpu, module)
    cost = cost[0] if isinstance(cost, list) else cost
    return {k: float(cost.get(k, 0.0)) for k in ("flops", "bytes accessed")}
