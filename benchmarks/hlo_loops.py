"""Collective bytes of a compiled XLA program per executed step, loops counted by trip count.

benchmarks.hlo_stats.collective_bytes counts each instruction once as written, so a collective
in a scanned layer body counts once. Here each computation is weighted by how often it runs:
the product of the trip counts of the while loops that (transitively) call it: XLA's
`known_trip_count` where the backend writes it (GPU), else the bound of the loop condition's
single `compare(counter, constant(N)), direction=LT` (a lax.scan / fori_loop counter from 0, as
the TPU compiler leaves it); 1 when neither is there.
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
_COND = re.compile(r"condition=%?(?P<name>[\w.\-]+)")
_CONST = re.compile(r"%?(?P<name>[\w.\-]+)\s*=\s*[su]32\[\]\S*\s+constant\((?P<n>\d+)\)")
_LT = re.compile(r"compare\((?P<args>[^)]*)\),\s*direction=LT")
_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<op>" + "|".join(re.escape(k) for k in COLLECTIVE_KINDS) + r")(?:-done)?\("
)


def computations(text: str) -> dict[str, list[str]]:
    """{computation name: its instruction lines} of an HLO module text."""
    comps: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m and not line.startswith(" "):
                current = m["name"]
                comps[current] = []
            continue
        # A computation ends at a line that is "}" alone: an instruction's backend_config may
        # span lines, one of them starting with "}}" (the TPU splash kernel's xprof_metadata).
        if line.rstrip() == "}":
            current = None
            continue
        comps[current].append(line)
    return comps


def callees(line: str) -> list[tuple[str, str]]:
    """(attribute, computation) of every computation an instruction line calls: a loop's
    body / condition, a fusion's calls, a reduction's to_apply, a conditional's branches."""
    out = [(m["attr"], m["name"]) for m in _CALLEE.finditer(line)]
    b = _BRANCHES.search(line)
    out += [("branch", c.strip().lstrip("%")) for c in (b["names"].split(",") if b else ())]
    return out


def _condition_bound(lines: list[str]) -> int | None:
    """N of a loop condition `counter < N` (one LT compare against one int constant)."""
    consts = {m["name"]: int(m["n"]) for line in lines if (m := _CONST.search(line))}
    bounds = [
        consts[a.strip().lstrip("%")]
        for line in lines
        if (m := _LT.search(line))
        for a in m["args"].split(",")
        if a.strip().lstrip("%") in consts
    ]
    return bounds[0] if len(bounds) == 1 else None


def loop_weighted_collective_bytes(text: str) -> dict[str, int]:
    """{kind: bytes} per device for one execution of the program's entry: every collective's
    result bytes times the trip counts of the loops around it (1 where XLA knows no count)."""
    if "HloModule" not in text:
        raise ValueError("loop_weighted_collective_bytes: not an XLA HLO module text")
    comps = computations(text)
    parent: dict[str, tuple[str, int]] = {}
    for name, lines in comps.items():
        for line in lines:
            trip = _TRIP.search(line)
            count = int(trip["n"]) if trip else None
            cond = _COND.search(line) if " while(" in line else None
            if count is None and cond and cond["name"] in comps:
                count = _condition_bound(comps[cond["name"]])
            for attr, callee in callees(line):
                n = count or 1 if attr in ("body", "condition") else 1
                parent.setdefault(callee, (name, n))

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
