"""The package's shape: the import graph of orthros_jax (every import, function-level and
TYPE_CHECKING ones included) has no cycle, the library never imports launch/ or benchmarks/,
and packages depend on each other in one direction only."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "orthros_jax"
# Package order: a module may import only from its own package or from packages to its left.
ORDER = (
    "leaves",  # the LEAVES below (and the root __init__)
    "kernels",
    "layers",
    "model",
    "checkpoint",
    "parallel",
    "inference",
    "data",
    "training",
    "convert",
    "evaluation",
    "serving",
    "rl",  # GRPO: rollouts from serving, updates from training
    "root",  # orthros_jax/__init__.py
)
# The config package (orthros_jax/config/) and these modules.
LEAVES = {"orthros_jax.axes"}
# Top-level modules that belong to a package of the order.
ALIASES = {"orthros_jax": "root"}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(name: str, path: pathlib.Path, modules: set[str]) -> set[str]:
    """Every module this one imports, anywhere in its body."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(full if full in modules else base)
    return out


def graph() -> dict[str, set[str]]:
    mods = _modules()
    names = set(mods)
    return {n: _imports(n, p, names) for n, p in mods.items()}


def _find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (found := visit(n)):
            return found
    return None


def _package(module: str) -> str:
    if module in LEAVES or module.split(".")[:2] == ["orthros_jax", "config"]:
        return "leaves"
    if module in ALIASES:
        return ALIASES[module]
    return module.split(".")[1]


def test_module_import_graph_has_no_cycle():
    g = graph()
    internal = {n: {m for m in e if m in g} for n, e in g.items()}
    assert _find_cycle(internal) is None, f"import cycle: {' -> '.join(_find_cycle(internal))}"


def test_library_never_imports_launch_or_benchmarks():
    bad = {
        (n, m)
        for n, e in graph().items()
        for m in e
        if m.split(".")[0] in ("launch", "benchmarks", "tests")
    }
    assert not bad, sorted(bad)


def test_packages_depend_in_one_direction():
    g = graph()
    bad = []
    for n, e in g.items():
        src = _package(n)
        for m in e:
            if m not in g:
                continue
            dst = _package(m)
            if dst != src and ORDER.index(dst) > ORDER.index(src):
                bad.append(f"{n} -> {m}")
    assert not bad, "imports against the package order:\n" + "\n".join(sorted(bad))


def test_files_stay_small():
    big = {
        str(p.relative_to(ROOT)): n
        for p in list(PKG.rglob("*.py")) + list((ROOT / "benchmarks").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not big, big


def test_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


# Modules that drive or hold every kind: none may name one (a kind is found through the
# registry). arms.py's table, the kinds' own modules and the checkpoint-format converters of
# one kind's format (convert/ but remote.py) name kinds as data.
# Every module outside layers/ and convert/ (kinds and their conversions live there), and the
# generic modules inside them: none names a kind (the kind and arm tables of layers/registry.py
# give every name).
GENERIC = [
    *(
        str(p.relative_to(ROOT))
        for p in PKG.rglob("*.py")
        if p.relative_to(PKG).parts[0] not in ("layers", "convert")
    ),
    *(str(p.relative_to(ROOT)) for p in (ROOT / "launch").glob("*.py")),
    "orthros_jax/convert/remote.py",
    "orthros_jax/convert/export.py",
    "orthros_jax/layers/stack.py",
    "orthros_jax/layers/kind.py",
    "orthros_jax/layers/cache_view.py",
    "orthros_jax/layers/flops.py",
]
# The presets: the architectures' default cycles, the kinds' options sections and the arms name
# kinds (and arms named after them) as data.
PRESETS = {
    "orthros_jax/config/architectures.py",
    "orthros_jax/config/kinds.py",
    "orthros_jax/config/arms.py",
    "orthros_jax/evaluation/arms.py",
}
GENERIC = [f for f in GENERIC if f not in PRESETS]


def _string_literals(path: pathlib.Path) -> set[str]:
    return {
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_generic_modules_name_no_kind():
    from orthros_jax.layers.registry import KINDS

    # "layers": attention's params key is the model's stack of layers (the original layout),
    # also the logical axis over them: a generic word, not a kind's name.
    names = set(KINDS) | {k.params_key for k in KINDS.values()} - {"layers"}
    found = {
        f: sorted(_string_literals(ROOT / f) & names)
        for f in GENERIC
        if _string_literals(ROOT / f) & names
    }
    assert not found, found


def test_kinds_have_no_sequence_parallel_code():
    from orthros_jax.layers.registry import KINDS

    for kind in KINDS.values():
        module = pathlib.Path(__import__(kind.step.__module__, fromlist=["_"]).__file__)
        text = module.read_text()
        for word in ("slot_offset", "halo", "gathered", "shard_map", "SEQUENCE_AXIS"):
            assert word not in text, (module.name, word)


def test_every_kind_satisfies_the_protocol():
    from orthros_jax.layers.kind import LayerKind
    from orthros_jax.layers.registry import KINDS

    for name, kind in KINDS.items():
        assert isinstance(kind, LayerKind) and kind.name == name


def test_generic_modules_name_no_ffn_choice():
    from orthros_jax.config.moe import MOE_IMPLS, ROUTED_CYCLE
    from orthros_jax.layers.ffn import FFNS

    # An FFN choice is found through layers/ffn.FFNS, as a kind through the kind registry.
    # The experts' kernels' names (MOE_IMPLS: "grouped", the all-experts "dense" reference) are
    # another word in the two modules that name them, and config/moe.py declares the default
    # ffn_cycle (ROUTED_CYCLE) as data; ModelConfig's `moe` field is an identifier.
    names = set(FFNS) | {f.params_key for f in FFNS.values()}
    own = {
        "orthros_jax/config/moe.py": set(MOE_IMPLS) | set(ROUTED_CYCLE),
        "orthros_jax/kernels/moe.py": set(MOE_IMPLS),
    }
    found = {}
    for f in GENERIC:
        hits = _string_literals(ROOT / f) & names - own.get(f, set())
        if hits:
            found[f] = sorted(hits)
    assert not found, found
