"""Collective bytes of a compiled XLA program per executed step, loops counted by trip count.

benchmarks.hlo_stats.collective_bytes counts each instruction once as written, so a collective
in a scanned layer body counts once. Here each computation is weighted by how often it runs:
the product of the `known_trip_count` of the while loops that (transitively) call it.
"""

from __future__ import annotations

import re

from benchmarks.hlo_stats import COLLECTIVE_KINDS, shape_bytes

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_CALLEE = re.compile(
    r"\b(?P<attr>body|condition|to_apply|calls|true_computation|false_computation)=%?"
    r"(?P<name>[\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{(?P<names>[^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(?P<n>\d+)"\}')
_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<op>" + "|".join(re.escape(k) for k in COLLECTIVE_KINDS) + r")(?:-done)?\("
)


def _computations(text: str) -> dict[str, list[str]]:
    comps: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m and not line.startswith(" "):
                current = m["name"]
                comps[current] = []
            continue
        if line.startswith("}"):
            current = None
            continue
        comps[current].append(line)
    return comps


def loop_weighted_collective_bytes(text: str) -> dict[str, int]:
    """{kind: bytes} per device for one execution of the program's entry: every collective's
    result bytes times the trip counts of the loops around it (1 where XLA knows no count)."""
    if "HloModule" not in text:
        raise ValueError("loop_weighted_collective_bytes: not an XLA HLO module text")
    comps = _computations(text)
    parent: dict[str, tuple[str, int]] = {}
    for name, lines in comps.items():
        for line in lines:
            trip = _TRIP.search(line)
            for m in _CALLEE.finditer(line):
                n = int(trip["n"]) if trip and m["attr"] in ("body", "condition") else 1
                parent.setdefault(m["name"], (name, n))
            b = _BRANCHES.search(line)
            for callee in b["names"].split(",") if b else ():
                parent.setdefault(callee.strip().lstrip("%"), (name, 1))

    def weight(name: str, depth: int = 0) -> int:
        if name not in parent or depth > 64:
            return 1
        up, n = parent[name]
        return n * weight(up, depth + 1)

    out = dict.fromkeys(COLLECTIVE_KINDS, 0)
    for name, lines in comps.items():
        w = None
        for line in lines:
            m = _COLLECTIVE.match(line)
            if m:
                w = weight(name) if w is None else w
                out[m["op"]] += w * shape_bytes(m["shape"])
    return out
