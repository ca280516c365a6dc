"""The config checks, written once, and the option sections of the layer kinds.

Checks raise a one-line ValueError naming the field (`where`, e.g. "ModelConfig.d_model"):
    check_positive_int(where, value)    an int >= 1 (not a bool)
    check_positive(where, value)        a number > 0
    check_choice(where, value, allowed) one of `allowed`

A layer kind's own options are a frozen dataclass subclassing `Options` (its `kind` names the
section), each field declared with `option(default, check, runtime=...)`; constructing one runs
every field's check, then `validate()` (the kind's checks across its fields). `Sections` holds one
`Options` per registered kind, as ModelConfig.kinds: cfg.kinds.gdn.chunk, in an ml_collections
config `config.model.kinds.gdn.chunk` (CLI: --config.model.kinds.gdn.chunk=32). Before the
sections, each kind's options were flat ModelConfig fields `{legacy_prefix}_{name}` (gdn_chunk);
`legacy_key` maps such a key of an old model.json to its section.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

Check = Callable[[str, Any], None]


def check_positive_int(where: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where} must be a positive int, got {value!r}")


def check_positive(where: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{where} must be > 0, got {value!r}")


def check_choice(where: str, value: Any, allowed: Any) -> None:
    if value not in allowed:
        raise ValueError(f"{where}={value!r} is unknown; allowed: {', '.join(map(repr, allowed))}")


def choice(*allowed: Any) -> Check:
    """A check that the value is one of `allowed`."""
    return lambda where, value: check_choice(where, value, allowed)


def unknown_keys(what: str, unknown: list[str], known: list[str]) -> ValueError:
    """The ValueError for keys of `what` that do not exist, with the closest known key of each."""
    hints = [
        f"{k!r} (did you mean {close[0]!r}?)"
        if (close := difflib.get_close_matches(k, known, 1))
        else repr(k)
        for k in unknown
    ]
    return ValueError(f"unknown {what} {', '.join(hints)}; valid: {', '.join(sorted(known))}")


def option(default: Any, check: Check | None = None, *, runtime: bool = False) -> Any:
    """A field of an Options section. check(where, value) raises ValueError when the value does
    not fit; runtime=True: it changes how the layer runs, not the function its weights compute
    (e.g. a kernel's chunk), so a resumed training run may change it."""
    return dataclasses.field(default=default, metadata={"check": check, "runtime": runtime})


@dataclasses.dataclass(frozen=True)
class Options:
    """One layer kind's options (subclass as a frozen dataclass; see the module docstring)."""

    kind: ClassVar[str] = ""
    legacy_prefix: ClassVar[str | None] = None  # old flat ModelConfig fields {prefix}_{name}

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.metadata.get("check") is not None:
                f.metadata["check"](self.where(f.name), getattr(self, f.name))
        self.validate()

    def validate(self) -> None:
        """The kind's checks across its fields (ValueError naming them); none by default."""

    @classmethod
    def where(cls, name: str) -> str:
        return f"ModelConfig.kinds.{cls.kind}.{name}"

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Options:
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise unknown_keys(f"option(s) of ModelConfig.kinds.{cls.kind}", unknown, known)
        return cls(**dict(values))

    @classmethod
    def runtime_fields(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("runtime"))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes: Any) -> Options:
        return dataclasses.replace(self, **changes)


# The option sections of the registered layer kinds (layers/registry.py registers them).
OPTIONS: dict[str, type[Options]] = {}


def register_options(cls: type[Options]) -> None:
    OPTIONS[cls.kind] = cls


def legacy_key(key: str) -> tuple[str, str] | None:
    """(kind, option) that an old flat ModelConfig key {legacy_prefix}_{option} names, or None."""
    for kind, cls in OPTIONS.items():
        pre = cls.legacy_prefix
        if pre and key.startswith(pre + "_"):
            name = key[len(pre) + 1 :]
            if name in {f.name for f in dataclasses.fields(cls)}:
                return kind, name
    return None


class Sections(Mapping[str, Options]):
    """Every registered kind's Options (ModelConfig.kinds), by kind name and as attributes
    (cfg.kinds.gdn); hashable, so a config stays a static jit argument. Built from a mapping of
    kind -> Options or -> a dict of options (the defaults fill the rest, and every registered
    kind without an entry gets its defaults)."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        values = dict(values or {})
        unknown = sorted(set(values) - set(OPTIONS))
        if unknown:
            raise unknown_keys("layer kind(s) in ModelConfig.kinds", unknown, list(OPTIONS))
        items = {}
        for kind, cls in OPTIONS.items():
            v = values.get(kind, {})
            items[kind] = v if isinstance(v, cls) else cls.from_dict(dict(v))
        self._items: dict[str, Options] = items

    def __getitem__(self, kind: str) -> Options:
        return self._items[kind]

    def __getattr__(self, kind: str) -> Any:
        items = self.__dict__.get("_items", {})
        if kind in items:
            return items[kind]
        raise AttributeError(f"ModelConfig.kinds has no kind {kind!r}; registered: {list(items)}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sections) and self._items == other._items

    def __repr__(self) -> str:
        return f"Sections({self._items!r})"

    def merged(self, changes: Mapping[str, Any]) -> Sections:
        """These sections with `changes` applied: kind -> Options replaces the section, kind ->
        dict changes only the options it names."""
        out: dict[str, Any] = dict(self._items)
        for kind, v in changes.items():
            if kind in out and not isinstance(v, Options):
                v = out[kind].to_dict() | dict(v)
            out[kind] = v
        return Sections(out)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {kind: o.to_dict() for kind, o in self._items.items()}
