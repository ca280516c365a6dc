"""Where a compiled program's time goes: the thunk durations of one profiled XLA:CPU execution
(`jax.profiler.trace`), each attributed to the instruction of the compiled HLO it ran, and
that instruction sorted into a part of a cached decode (benchmarks/decode_profile.py).

The parts, from the optimized HLO itself rather than from fusion names:
  kv_copy        a top-level instruction whose result is one layer of a stacked cache leaf
                 ([layers, ...] -> one layer's elements) and whose computation holds a
                 dynamic-slice (or a static slice) of that leaf: the layer's K or V copied
                 out of the stack.
  kv_block       the same for a part of one layer's slots (a block of a blocked read, a
                 window): a copy of that part only.
  weight_copy    kv_copy for a stacked layer weight (params[kind.params_key]).
  attention_dot  a dot (or a fusion holding one) with a slot axis (the cache's S, the slots
                 of a kv_block cut) in an operand or its result, or reading a kv_copy /
                 kv_block: the attention over the cache.
  slots_other    any other instruction with a slot axis in its result: masks, softmax, the
                 cache writes.
  rest           everything else (the weights' matmuls, norms, sampling, loop bookkeeping).
Control-flow thunks (while, conditional, call) are left out of every sum: XLA:CPU may time a
loop's thunk across its body's, which are counted themselves.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import glob
import gzip
import json
import math
import os
import re
from typing import Any

from benchmarks.hlo_loops import callees, computations


class Part(enum.Enum):
    """What a top-level instruction of a cached decode program does (module docstring)."""

    KV_COPY = "kv_copy"
    KV_BLOCK = "kv_block"
    WEIGHT_COPY = "weight_copy"
    ATTENTION_DOT = "attention_dot"
    SLOTS_OTHER = "slots_other"
    REST = "rest"


CONTROL_FLOW = ("while", "conditional", "call")

_DEFINITION = re.compile(
    r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+(?P<op>[a-z][\w\-]*)\((?P<rest>.*)$"
)
_ARRAY = re.compile(r"^[a-z]+[0-9]*\w*\[(?P<dims>[0-9,]*)\]")
_OPERAND = re.compile(r"%(?P<name>[\w.\-]+)")
_OP_NAME = re.compile(r'op_name="(?P<op_name>[^"]*)"')
_ENTRY = re.compile(r"^ENTRY\s+%?(?P<name>[\w.\-]+)", re.MULTILINE)
_MODULE = re.compile(r"^HloModule\s+(?P<name>[\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction: its computation, opcode, result dims (None for a tuple), operand
    names, the computations it calls, and its JAX op_name (the traced name stack)."""

    name: str
    computation: str
    op: str
    dims: tuple[int, ...] | None
    operands: tuple[str, ...]
    called: tuple[str, ...]
    op_name: str
    body: str | None  # a while loop's body computation


def _operand_list(rest: str) -> str:
    """The text inside an instruction's operand parentheses (rest starts after the '(')."""
    depth = 0
    for i, ch in enumerate(rest):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return rest[:i]
            depth -= 1
    return rest


@dataclasses.dataclass(frozen=True)
class Module:
    """A compiled program's optimized HLO, parsed: every instruction by name (names are unique
    in a module), the entry computation, and the module name the profiler reports."""

    name: str
    entry: str
    instructions: dict[str, Instruction]
    by_computation: dict[str, list[Instruction]]

    @classmethod
    def parse(cls, text: str) -> Module:
        if "HloModule" not in text:
            raise ValueError("hlo_profile: not an XLA HLO module text (compiled.as_text())")
        module, entry = _MODULE.search(text), _ENTRY.search(text)
        if module is None or entry is None:
            raise ValueError("hlo_profile: the HLO text has no module name or no ENTRY")
        instructions: dict[str, Instruction] = {}
        by_computation: dict[str, list[Instruction]] = {}
        for comp, lines in computations(text).items():
            by_computation[comp] = []
            for line in lines:
                m = _DEFINITION.match(line)
                if m is None:
                    continue
                array = _ARRAY.match(m["shape"])
                dims = tuple(int(d) for d in array["dims"].split(",") if d) if array else None
                op_name = _OP_NAME.search(line)
                called = callees(line)
                inst = Instruction(
                    name=m["name"],
                    computation=comp,
                    op=m["op"],
                    dims=dims,
                    operands=tuple(_OPERAND.findall(_operand_list(m["rest"]))),
                    called=tuple(name for _, name in called),
                    op_name=op_name["op_name"] if op_name else "",
                    body=next((name for attr, name in called if attr == "body"), None),
                )
                instructions[inst.name] = inst
                by_computation[comp].append(inst)
        return cls(module["name"], entry["name"], instructions, by_computation)

    @classmethod
    def of(cls, compiled: Any) -> Module:
        """The parsed optimized HLO of a compiled program (jitted.lower(...).compile())."""
        return cls.parse(compiled.as_text() or "")

    def closure(self, computation: str) -> set[str]:
        """The computation and every computation it calls, transitively."""
        seen, todo = set(), [computation]
        while todo:
            comp = todo.pop()
            if comp in seen or comp not in self.by_computation:
                continue
            seen.add(comp)
            todo += [c for inst in self.by_computation[comp] for c in inst.called]
        return seen

    def holds(self, inst: Instruction, op: str) -> list[Instruction]:
        """The instructions with opcode `op` among inst itself and everything it calls."""
        comps = set().union(*(self.closure(c) for c in inst.called)) if inst.called else set()
        inner = [i for c in comps for i in self.by_computation[c]]
        return [i for i in [inst, *inner] if i.op == op]

    def top_level(self) -> list[Instruction]:
        """Instructions that run as thunks: those of the entry and of the control-flow bodies
        reached from it (not those inside fusions)."""
        out, seen, todo = [], set(), [self.entry]
        while todo:
            comp = todo.pop()
            if comp in seen or comp not in self.by_computation:
                continue
            seen.add(comp)
            for inst in self.by_computation[comp]:
                out.append(inst)
                if inst.op in CONTROL_FLOW:
                    todo += list(inst.called)
        return out


def _stack_cut(
    module: Module, inst: Instruction, stacks: set[tuple[int, ...]]
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(the leaf's dims, the cut's dims) where inst's result holds a cut of one layer (all of it
    or part) of one of `stacks` ([layers, ...] dims), made by a dynamic-slice (a static slice,
    for an unrolled loop) of that leaf inside inst's computation (or by inst itself)."""
    if inst.dims is None:
        return None
    size = math.prod(inst.dims)
    for ds in module.holds(inst, "dynamic-slice") + module.holds(inst, "slice"):
        if not ds.operands or ds.dims is None:
            continue
        src = module.instructions.get(ds.operands[0])
        if src is None or src.dims not in stacks or ds.dims[0] != 1:
            continue
        if size == math.prod(ds.dims):
            return src.dims, ds.dims
    return None


def classify(
    module: Module,
    cache_stacks: set[tuple[int, ...]],
    weight_stacks: set[tuple[int, ...]],
    slot_axes: set[int],
) -> dict[str, Part]:
    """{instruction name: Part} for every top-level instruction (module docstring). cache_stacks
    / weight_stacks: the dims of the stacked cache leaves and layer weights ([layers, ...]);
    slot_axes: the cache's slot count S (choose one no other axis of the program has). The
    slot counts of the kv_block cuts (a blocked read's block, a window) are slot axes too,
    unless a weight has an axis of that size."""
    top = module.top_level()
    cuts = {i.name: c for i in top if (c := _stack_cut(module, i, cache_stacks)) is not None}
    taken = {d for dims in weight_stacks for d in dims}
    axes = set(slot_axes) | {
        c
        for src, cut in cuts.values()
        for c, d in zip(cut[1:], src[1:], strict=True)
        if c != d and c not in taken
    }
    out: dict[str, Part] = {}
    for inst in top:
        if inst.name in cuts:
            src, cut = cuts[inst.name]
            out[inst.name] = Part.KV_COPY if cut[1:] == src[1:] else Part.KV_BLOCK
            continue
        weight = _stack_cut(module, inst, weight_stacks)
        if weight is not None and weight[1][1:] == weight[0][1:]:
            out[inst.name] = Part.WEIGHT_COPY
            continue
        dims = [inst.dims or ()] + [module.instructions[o].dims or () for o in inst.operands]
        over_slots = any(a in d for d in dims for a in axes)
        reads_kv = any(out.get(o) in (Part.KV_COPY, Part.KV_BLOCK) for o in inst.operands)
        if (over_slots or reads_kv) and module.holds(inst, "dot"):
            out[inst.name] = Part.ATTENTION_DOT
        elif any(a in (inst.dims or ()) for a in axes):
            out[inst.name] = Part.SLOTS_OTHER
        else:
            out[inst.name] = Part.REST
    return out


def sum_parts(
    module: Module, parts: dict[str, Part], times: dict[str, list[float]], comps: Any = None
) -> dict[str, dict[str, float]]:
    """{part: {"ms", "calls"}} of the thunks (`thunk_times`) of the instructions `classify`
    sorted (`parts`) that lie in computations `comps` (None: all); control flow left out."""
    out = {p.value: {"ms": 0.0, "calls": 0} for p in Part}
    for name, durs in times.items():
        inst = module.instructions.get(name)
        if inst is None or inst.op in CONTROL_FLOW or name not in parts:
            continue
        if comps is not None and inst.computation not in comps:
            continue
        out[parts[name].value]["ms"] += sum(durs) / 1e3
        out[parts[name].value]["calls"] += len(durs)
    return out


def top_thunks(
    module: Module, parts: dict[str, Part], times: dict[str, list[float]], n: int = 8
) -> list[dict[str, Any]]:
    """The n instructions whose thunks took longest in all: name, part, dims, calls, ms."""
    ran = [
        (k, d)
        for k, d in times.items()
        if k in parts and module.instructions[k].op not in CONTROL_FLOW
    ]
    ran.sort(key=lambda item: -sum(item[1]))
    return [
        dict(
            name=k,
            part=parts[k].value,
            dims=module.instructions[k].dims,
            calls=len(d),
            ms=sum(d) / 1e3,
        )
        for k, d in ran[:n]
    ]


def while_regions(module: Module, marker: str) -> tuple[set[str], set[str]]:
    """(the computations of the loop whose body runs the instructions named `marker`, those of
    the loop around it): for a speculative round, the k draft steps' scan and the round loop.
    The draft loop is the innermost while whose own body (not a nested loop's) holds an
    instruction whose op_name contains `marker`; the round loop is the while that holds it."""
    whiles = [i for i in module.top_level() if i.op == "while" and i.body]
    inside = {w.name: module.closure(str(w.body)) for w in whiles}
    # Each computation's innermost enclosing loop: the smallest closure that holds it.
    parent: dict[str, Instruction] = {}
    for w in sorted(whiles, key=lambda w: -len(inside[w.name])):
        parent.update(dict.fromkeys(inside[w.name], w))

    def own(w: Instruction) -> bool:  # its body's instructions, fusions in, nested loops out
        body = module.by_computation[str(w.body)]
        comps = {str(w.body)} | {c for i in body if i.op != "while" for c in i.called}
        return any(marker in i.op_name for c in comps for i in module.by_computation.get(c, []))

    def depth(w: Instruction) -> int:
        d, comp = 0, w.computation
        while comp in parent:
            d, comp = d + 1, parent[comp].computation
        return d

    marked = [w for w in whiles if own(w)]
    if not marked:
        raise ValueError(f"hlo_profile: no while loop runs instructions named {marker!r}")
    draft = max(marked, key=depth)
    outer = parent.get(draft.computation)
    return inside[draft.name], inside[outer.name] if outer else set()


def thunk_times(trace_dir: str, module: str) -> dict[str, list[float]]:
    """{hlo_op: [duration µs of each run]} of the module's thunks in the newest
    `jax.profiler.trace` output under trace_dir (events with ph "X" and an hlo_op)."""
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True))
    if not files:
        raise ValueError(f"hlo_profile: no *.trace.json.gz under {trace_dir}")
    with gzip.open(files[-1]) as f:
        events = json.load(f)["traceEvents"]
    out: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args and args.get("hlo_module") == module:
            out[args["hlo_op"]].append(float(e["dur"]))
    return dict(out)
