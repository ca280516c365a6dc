"""ml_collections at the boundary: load a config file, check overrides, build frozen dataclasses.

Launchers take an `ml_collections.ConfigDict` (a file with `get_config()` plus `--config.a.b=v`
overrides), lock it, and immediately turn each section into a frozen dataclass with
`dataclass_from_dict`; library code only ever sees the dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import ml_collections

T = TypeVar("T")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Optional dependencies -> the pyproject extra that installs them.
EXTRAS = {
    "lm_eval": "eval",
    "accelerate": "eval",
    "datasets": "eval",
    "transformers": "convert",
    "torch": "convert",
}
HELP_FLAGS = ("--help", "-help", "-h", "--helpshort", "-?", "--helpfull", "--helpxml")


def did_you_mean(unknown: Sequence[str], valid: Sequence[str]) -> str:
    """' (did you mean X?)' naming the closest valid key of each unknown one, or ''."""
    close = {u: difflib.get_close_matches(u, list(valid), n=1, cutoff=0.6) for u in unknown}
    hints = [f"{u!r} -> {m[0]!r}" for u, m in close.items() if m]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


def to_plain(value: Any) -> Any:
    """ConfigDict / FieldReference trees -> plain dicts, lists -> tuples (hashable, frozen)."""
    if isinstance(value, ml_collections.ConfigDict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return tuple(to_plain(v) for v in value)
    return value


def dataclass_from_dict(cls: type[T], values: Mapping[str, Any], section: str) -> T:
    """Builds the frozen dataclass `cls` from `values`; unknown keys raise a ValueError that
    names them and lists the valid keys of `section` (e.g. "optimizer")."""
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    plain = to_plain(values)
    unknown = sorted(set(plain) - set(known))
    if unknown:
        raise ValueError(
            f"unknown key(s) {unknown} in config section {section!r}"
            f"{did_you_mean(unknown, known)}; valid keys: {', '.join(known)}"
        )
    missing = [
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name not in plain
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"config section {section!r} is missing required key(s) {missing}")
    return cls(**plain)


def section(instance: Any) -> ml_collections.ConfigDict:
    """A config section holding every field of a dataclass instance (so every field can be
    overridden from the command line). None becomes a placeholder of the field's type (str
    unless it is annotated `float | None` / `int | None`): config_flags cannot override a plain
    None. A mapping of
    dataclasses (ModelConfig.kinds) becomes a section of sections (model.kinds.gdn.chunk)."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if isinstance(value, Mapping) and all(dataclasses.is_dataclass(v) for v in value.values()):
            value = ml_collections.ConfigDict({k: section(v) for k, v in value.items()})
        if value is None:
            first = str(field.type).split("|")[0].strip()
            value = ml_collections.config_dict.placeholder(
                {"float": float, "int": int}.get(first, str)
            )
        values[field.name] = value
    return ml_collections.ConfigDict(values)


def with_group(model: ml_collections.ConfigDict, name: str, options: Any) -> Any:
    """A model section with its option group `name` (lora, moe) set to the `options` mapping.
    A group that is off is a str placeholder in a `section` (config_flags cannot override a
    plain None), which a ConfigDict cannot replace by a section in place: the whole model
    section is rebuilt."""
    values = model.to_dict()
    values[name] = dict(options)
    return ml_collections.ConfigDict(values)


def flat_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    """All leaf keys of a config as dotted paths ("optimizer.lr", ...)."""
    keys = []
    for k, v in config.items():
        path = f"{prefix}{k}"
        if isinstance(v, ml_collections.ConfigDict):
            keys.extend(flat_keys(v, path + "."))
        else:
            keys.append(path)
    return keys


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """Runs `get_config()` of a config file given as "path.py" or "path.py:arg"."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise ValueError(f"config file {path!r} does not exist (from {os.getcwd()})")
    module_spec = importlib.util.spec_from_file_location("_orthros_config", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


def define_config_flag(default: str, help_text: str, tool: str, *, lock: bool = True) -> Any:
    """`--config`, a config file flag (config_flags.DEFINE_config_file), for a launcher named
    `tool`. Defining it already applies the command line's `--config.<key>` overrides (to
    `default` when no --config is given), so the keys are checked first: a key the file does
    not have exits with the valid keys listed instead of a bare AttributeError."""
    from absl import flags
    from ml_collections import config_flags

    if not os.path.isfile(default.partition(":")[0]):  # run from outside the repository
        default = os.path.join(REPO, default)
    try:
        spec = config_spec(sys.argv, default=default) or default
        if not os.path.isfile(spec.partition(":")[0]):
            raise ValueError(f"--config={spec}: no such file (from {os.getcwd()})")
        check_override_keys(sys.argv, default=default)
    except ValueError as e:
        raise SystemExit(f"{tool}: {e}") from None
    holder = config_flags.DEFINE_config_file("config", default, help_text, lock_config=lock)
    # A key flag of the launcher (listed by its --help, not only --helpfull); absl names the
    # main module by its script path.
    caller = sys._getframe(1).f_globals.get("__name__", "__main__")
    caller = sys.argv[0] if caller == "__main__" else caller
    flags.FLAGS.register_key_flag_for_module(caller, flags.FLAGS["config"])
    return holder


def config_spec(
    argv: Sequence[str], flag: str = "config", default: str | None = None
) -> str | None:
    """The config file spec ("path.py[:arg]") the command line gives, else `default`."""
    spec = default
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{flag}="):
            spec = arg.split("=", 1)[1]
        elif arg == f"--{flag}" and i + 1 < len(argv):
            spec = argv[i + 1]
    return spec


def run(main: Any, tool: str, errors: tuple[type[BaseException], ...] = (ValueError,)) -> None:
    """absl's app.run for a launcher: --help exits 0; a usage error, one of `errors` or a
    missing optional dependency ends with one line naming `tool` instead of a traceback."""
    from absl import app

    def wrapped(argv: list[str]) -> None:
        try:
            main(argv)
        except app.UsageError as e:
            raise SystemExit(f"{tool}: {e} (see --help)") from None
        except ModuleNotFoundError as e:
            extra = EXTRAS.get((e.name or "").split(".")[0])
            if extra is None:
                raise
            raise SystemExit(
                f"{tool}: needs the {e.name!r} package: pip install -e '.[{extra}]'"
            ) from None
        except errors as e:
            raise SystemExit(f"{tool}: {e}") from None

    def parse(argv: list[str]) -> list[str]:
        from absl import flags

        try:
            return flags.FLAGS(argv)
        except flags.Error as e:  # absl would print it over two lines
            raise SystemExit(f"{tool}: {e} (see --help)") from None

    try:
        app.run(wrapped, flags_parser=parse)
    except SystemExit as e:
        if e.code == 1 and any(a in HELP_FLAGS for a in sys.argv[1:]):
            raise SystemExit(0) from None  # absl exits 1 after printing the help
        raise


def check_override_keys(
    argv: Sequence[str], flag: str = "config", default: str | None = None
) -> None:
    """Fails early, with the valid keys listed, when `--config.<key>=...` names a key the
    config file (`--config`, else `default`) does not have."""
    spec = config_spec(argv, flag, default)
    overrides = [
        arg[len(f"--{flag}.") :].split("=", 1)[0] for arg in argv if arg.startswith(f"--{flag}.")
    ]
    if spec is None or not overrides:
        return
    valid = flat_keys(load_config_file(spec))
    sections = {k.rsplit(".", 1)[0] for k in valid if "." in k}
    unknown = [k for k in overrides if k not in valid and k not in sections]
    if unknown:
        raise ValueError(
            f"unknown config key(s) {unknown} in overrides of {spec!r}"
            f"{did_you_mean(unknown, valid)}; valid keys:\n  " + "\n  ".join(valid)
        )
