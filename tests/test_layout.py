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


# Modules that drive or hold every kind: none may name an FFN choice (layers/ffn.FFNS gives
# every name).
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

# Every module of the library, launch/ and benchmarks/ is checked for kind and arm names. A
# kind's name and params key are written only in its own modules (the one defining its KIND and
# its options class) and the presets below; every other module asks the registry
# (registry.KINDS, a kind module's KIND, the architectures and arms tables,
# convert.common.own_arm). EXTERNAL: other projects' names that equal ours, per file.
EXTERNAL = {
    "orthros_jax/convert/fla_config.py": {"gla", "retnet"},  # fla's model_types
    "orthros_jax/layers/retention.py": {"retnet"},  # fla's model_type of the kind's export
    "orthros_jax/convert/mamba2_hf.py": {"mamba2"},  # transformers' model_type
    "orthros_jax/convert/remote.py": {"orthros"},  # the trust_remote_code model_type
    "orthros_jax/serving/metrics.py": {"orthros"},  # the Prometheus metrics' namespace
}
# Files that may name anything: the trust_remote_code config copied next to exported weights
# imports nothing of ours, so it carries its own list of the arms it reads.
STANDALONE = {"orthros_jax/convert/hf_remote/configuration_orthros.py"}


def _string_literals(path: pathlib.Path) -> set[str]:
    return {
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _kind_modules() -> dict[str, set[str]]:
    """{file: the names of the kind it defines}: the module of each kind's KIND and of its
    options class."""
    import sys

    from orthros_jax.layers.registry import KINDS

    out: dict[str, set[str]] = {}
    for kind in KINDS.values():
        own = {kind.name, kind.params_key}
        homes = [m for m, mod in sys.modules.items() if getattr(mod, "KIND", None) is kind]
        if kind.options is not None:
            homes.append(kind.options.__module__)
        for module in homes:
            path = pathlib.Path(sys.modules[module].__file__ or "")
            out.setdefault(str(path.relative_to(ROOT)), set()).update(own)
    return out


def test_only_the_registry_names_kinds_and_arms():
    from orthros_jax.config.arms import ARMS
    from orthros_jax.layers.registry import KINDS

    # "layers": attention's params key is the model's stack of layers (the original layout),
    # also the logical axis over them: a generic word, not a kind's name.
    names = (set(KINDS) | {k.params_key for k in KINDS.values()} | set(ARMS)) - {"layers"}
    files = [
        *PKG.rglob("*.py"),
        *(ROOT / "launch").glob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
    ]
    literals = {str(p.relative_to(ROOT)): _string_literals(p) for p in files}
    assert PRESETS <= set(literals), sorted(PRESETS - set(literals))
    kind_modules = _kind_modules()
    assert len(kind_modules) >= len(KINDS), kind_modules
    found = {}
    for f, lits in literals.items():
        if f in PRESETS | STANDALONE:
            continue
        allowed = EXTERNAL.get(f, set()) | kind_modules.get(f, set())
        if hits := (lits & names) - allowed:
            found[f] = sorted(hits)
    assert not found, f"kind or arm names outside the registry: {found}"


def test_every_kind_has_one_own_arm():
    """convert.common.own_arm finds the arm a checkpoint imports as by its kinds: each kind's
    pure stack, and the attention-GDN hybrid, is one row of the architectures table."""
    from orthros_jax.config.architectures import ARCHITECTURES
    from orthros_jax.convert.common import own_arm, own_arms
    from orthros_jax.layers import attention, gdn
    from orthros_jax.layers.registry import KINDS

    table = own_arms()
    assert len(set(table.values())) == len(table)
    for name in KINDS:
        assert ARCHITECTURES[own_arm(name)].layer_types == (name,)
    hybrid = ARCHITECTURES[own_arm(gdn.KIND.name, attention.KIND.name)]
    assert not hybrid.two_streams and hybrid.kinds == {gdn.KIND.name, attention.KIND.name}


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
