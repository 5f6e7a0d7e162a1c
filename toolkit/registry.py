"""Name -> constructor registries, so configs can say ``{"name": "lars", "params": {...}}``.

A registry checks the name and the parameter names before constructing anything, and its
errors list what is allowed: configs are validated with these messages before any process starts.
An entry may be a ``"module:attribute"`` reference, imported when first needed, so that a
registry's names can be checked without importing what its constructors need (TensorFlow).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any


class Registry:
    """Maps names to constructors (classes or functions) of one ``kind`` of object."""

    def __init__(self, kind: str, entries: Mapping[str, Callable[..., Any] | str]):
        self.kind = kind
        self._entries = dict(entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def check_name(self, name: str) -> None:
        """Raise ``ValueError`` listing the known names if ``name`` is not one (imports nothing)."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {self.names()}")

    def constructor(self, name: str) -> Callable[..., Any]:
        self.check_name(name)
        entry = self._entries[name]
        if isinstance(entry, str):  # a lazy "module:attribute" reference
            module, _, attribute = entry.partition(":")
            entry = self._entries[name] = getattr(importlib.import_module(module), attribute)
        return entry

    def parameters(self, name: str) -> dict[str, Any]:
        """Parameter names of ``name``'s constructor (through its base classes) and defaults."""
        found: dict[str, Any] = {}
        for init in _init_chain(self.constructor(name)):
            for p in inspect.signature(init).parameters.values():
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                    found.setdefault(p.name, None if p.default is p.empty else p.default)
        return found

    def check_params(self, name: str, params: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` naming any parameter ``name`` does not accept."""
        allowed = self.parameters(name)
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise ValueError(
                f"{self.kind} {name!r} has no parameter {', '.join(map(repr, unknown))}; "
                f"its parameters are {sorted(allowed)}"
            )

    def get(self, name: str, **params) -> Any:
        """Construct ``name`` with ``params`` after checking both. A parameter of the wrong
        type (``None``, a list, a string where the default is a number) is a ``ValueError``
        naming it, not the constructor's ``TypeError``."""
        self.check_params(name, params)
        try:
            return self.constructor(name)(**params)
        except TypeError as error:
            defaults = self.parameters(name)
            odd = [k for k, v in params.items() if not _same_kind(v, defaults.get(k))]
            named = ", ".join(f"{k}={params[k]!r:.80} (default {defaults[k]!r})" for k in odd)
            raise ValueError(
                f"{self.kind} {name!r}: {named or 'a parameter'} has the wrong type ({error})"
            ) from None


def _same_kind(value: Any, default: Any) -> bool:
    """Whether ``value`` could stand where ``default`` does (any value, where it is ``None``)."""
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def _init_chain(constructor: Callable[..., Any]):
    """The ``__init__`` functions that see a call's keywords: the class's own, then each base's
    for as long as the previous one forwards ``**kwargs``."""
    if not inspect.isclass(constructor):
        yield constructor
        return
    for cls in constructor.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        yield init
        kinds = {p.kind for p in inspect.signature(init).parameters.values()}
        if inspect.Parameter.VAR_KEYWORD not in kinds:
            return
