"""The configuration's checks, written once, and the base of a layer kind's options section.

Checks raise a one-line ValueError naming the field (`where`, e.g. "ModelConfig.d_model"):
    check_positive_int(where, value)    an int >= 1 (not a bool)
    check_positive(where, value)        a number > 0
    check_choice(where, value, allowed) one of `allowed`
    choice(*allowed)                    check_choice as a field's check
    unknown_keys(what, unknown, known)  the error for keys that do not exist (closest one named)

A kind's options section (kinds.py) is a frozen dataclass subclassing `Options` (its `kind`
names the section), each field declared with `option(default, check, runtime=...)`;
constructing one runs every field's check, then `validate()` (the kind's checks across its
fields).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

Check = Callable[[str, Any], None]


def check_positive_int(where: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where} must be a positive int, got {value!r}")


def check_positive(where: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{where} must be > 0, got {value!r}")


def check_choice(where: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{where}={value!r} is unknown; allowed: {', '.join(map(repr, allowed))}")


def choice(*allowed: Any) -> Check:
    """A check that the value is one of `allowed`."""
    return lambda where, value: check_choice(where, value, allowed)


def unknown_keys(
    what: str, unknown: list[str], known: list[str], hints: Iterable[str] = ()
) -> ValueError:
    """The ValueError for keys of `what` that do not exist, with the closest of `known` (or of
    `hints`, other spellings that are not keys of `what` itself) named for each."""
    candidates = [*known, *hints]
    named = [
        f"{k!r} (did you mean {close[0]!r}?)"
        if (close := difflib.get_close_matches(k, candidates, 1))
        else repr(k)
        for k in unknown
    ]
    return ValueError(f"unknown {what} {', '.join(named)}; valid: {', '.join(sorted(known))}")


def option(default: Any, check: Check | None = None, *, runtime: bool = False) -> Any:
    """A field of an Options section. check(where, value) raises ValueError when the value does
    not fit; runtime=True: it changes how the layer runs, not the function its weights compute
    (e.g. a kernel's chunk), so a resumed training run may change it."""
    return dataclasses.field(default=default, metadata={"check": check, "runtime": runtime})


@dataclasses.dataclass(frozen=True)
class Options:
    """One layer kind's options (subclass as a frozen dataclass; see the module docstring)."""

    kind: ClassVar[str] = ""

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


class OptionGroup:
    """A ModelConfig option group's frozen dataclass (ModelConfig.moe, ModelConfig.lora): built
    from a mapping (model.json, ml_collections) naming unknown keys, and back."""

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], field: str = "") -> Any:
        """From a mapping; field: the ModelConfig field it is (named in the errors)."""
        known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        unknown = sorted(set(values) - set(known))
        if unknown:
            what = f"ModelConfig.{field}" if field else cls.__name__
            raise unknown_keys(f"{what} option(s)", unknown, known)
        return cls(**dict(values))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]
