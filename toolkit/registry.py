"""Name -> constructor registries, so configs can say ``{"name": "lars", "params": {...}}``.

A registry checks the name and the parameter names before constructing anything, and its
errors list what is allowed: configs are validated with these messages before any process starts.
An entry may be a ``"module:attribute"`` reference, imported when first needed, so that a
registry's names can be checked without importing what its constructors need (TensorFlow). An
:class:`Entry` also declares its parameters and their defaults, so they are checked without
importing anything either; :meth:`Registry.signature` reads them off the constructor, for the
test that keeps the two equal.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

REQUIRED = inspect.Parameter.empty
"""An :class:`Entry` parameter without a default: a config must give it."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """A constructor (a ``"module:attribute"`` reference) and its parameters with their
    defaults (:data:`REQUIRED`: none), which :meth:`Registry.get` calls it with. A schedule
    builder's signature has no defaults of its own; any other constructor's are these
    (:meth:`Registry.signature`, tests/test_catalog.py)."""

    constructor: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Registry:
    """Maps names to constructors (classes or functions) of one ``kind`` of object."""

    def __init__(self, kind: str, entries: Mapping[str, Callable[..., Any] | str | Entry]):
        self.kind = kind
        self._entries = dict(entries)

    def names(self) -> list[str]:
        """The names, sorted (as error messages list them)."""
        return sorted(self._entries)

    def __iter__(self):
        """The names in the order they were registered (as a form lists them)."""
        return iter(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def check_name(self, name: str) -> None:
        """Raise ``ValueError`` listing the known names if ``name`` is not one (imports nothing)."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {self.names()}")

    def constructor(self, name: str) -> Callable[..., Any]:
        self.check_name(name)
        entry = self._entries[name]
        reference = entry.constructor if isinstance(entry, Entry) else entry
        if not isinstance(reference, str):
            return reference
        module, _, attribute = reference.partition(":")  # a lazy "module:attribute" reference
        return getattr(importlib.import_module(module), attribute)

    def declares(self, name: str) -> bool:
        """Whether ``name``'s parameters are declared in the table (an :class:`Entry`), so
        checking them imports nothing."""
        self.check_name(name)
        return isinstance(self._entries[name], Entry)

    def parameters(self, name: str) -> dict[str, Any]:
        """Parameter names of ``name``'s constructor (through its base classes) and defaults
        (``None`` for one without a default)."""
        return {p: None if d is inspect.Parameter.empty else d for p, d in self._defaults(name)}

    def required(self, name: str) -> list[str]:
        """The parameters of ``name``'s constructor that have no default."""
        return [p for p, d in self._defaults(name) if d is inspect.Parameter.empty]

    def _defaults(self, name: str) -> list[tuple[str, Any]]:
        """``(parameter, default)`` of ``name``: declared by its :class:`Entry`, else of its
        constructor, the first ``__init__`` that names a parameter giving its default
        (:data:`REQUIRED`: none)."""
        if self.declares(name):
            return list(self._entries[name].params.items())
        return list(self.signature(name).items())

    def signature(self, name: str) -> dict[str, Any]:
        """``name``'s parameters and defaults (:data:`REQUIRED`: none) as its constructor's
        signature gives them (importing its module): the first ``__init__`` that names a
        parameter gives its default."""
        found: dict[str, Any] = {}
        for init in _init_chain(self.constructor(name)):
            for p in inspect.signature(init).parameters.values():
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                    found.setdefault(p.name, p.default)
        return found

    def check_params(
        self, name: str, params: Mapping[str, Any], supplied: tuple[str, ...] = ()
    ) -> None:
        """Raise ``ValueError`` naming any parameter ``name`` does not accept, or any it
        needs (one without a default) that neither ``params`` nor the caller (``supplied``)
        gives."""
        allowed = self.parameters(name)
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            own = sorted(set(allowed) - set(supplied))
            raise ValueError(
                f"{self.kind} {name!r} has no parameter {', '.join(map(repr, unknown))}; "
                f"its parameters are {own}"
            )
        required = self.required(name)
        if missing := [p for p in required if p not in params and p not in supplied]:
            raise ValueError(
                f"{self.kind} {name!r} needs the parameter{'s' * (len(missing) > 1)} "
                f"{', '.join(map(repr, missing))}"
            )

    def get(self, name: str, *inputs, **params) -> Any:
        """Construct ``name`` with ``params`` after checking both (an :class:`Entry`'s
        defaults filled in), after ``inputs``, which the caller's code gives (a schedule's
        base rate and lengths). A parameter of the wrong type (``None``, a list, a string where
        the default is a number) is a ``ValueError`` naming it, not the constructor's
        ``TypeError``."""
        self.check_params(name, params)
        if self.declares(name):
            params = {**self.parameters(name), **params}
        try:
            return self.constructor(name)(*inputs, **params)
        except TypeError as error:
            self.check_kinds(name, params, because=f" ({error})")
            raise ValueError(
                f"{self.kind} {name!r}: a parameter has the wrong type ({error})"
            ) from None

    def check_kinds(self, name: str, params: Mapping[str, Any], because: str = "") -> None:
        """Raise ``ValueError`` naming each parameter whose value could not stand where its
        default does (a string or a list where the default is a number, a number where it is
        a boolean); ``because`` ends the message."""
        defaults = self.parameters(name)
        odd = [k for k, v in params.items() if not _same_kind(v, defaults.get(k))]
        if odd:
            named = ", ".join(f"{k}={params[k]!r:.80} (default {defaults[k]!r})" for k in odd)
            raise ValueError(f"{self.kind} {name!r}: {named} has the wrong type{because}")


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
