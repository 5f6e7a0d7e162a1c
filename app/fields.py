"""The Launch form's widgets for config fields, prefilled from a preset: each reads its type,
default and help from the schema and the registries (:mod:`app.form`), is keyed by the preset
(another preset gets fresh widgets holding its values) and registers the field's slot for its
validation message."""

import streamlit as st

from app import form

TRISTATE = {"preset": None, "on": True, "off": False}


class PresetFields:
    """Widgets for the fields of a config, starting from the preset ``preset`` (its mapping
    ``given``); each field's error slot is added to ``slots``, and a registry entry's parameter
    errors to ``local`` (path -> message)."""

    def __init__(self, preset: str, given: dict, slots: form.Slots, local: dict):
        self.preset, self.given, self.slots, self.local = preset, given, slots, local

    def key(self, path: str) -> str:
        return f"{self.preset}:{path}"  # another preset gets fresh widgets holding its values

    def default(self, path: str, section: str | None = None):
        """The preset's value for ``path``, else the schema's default (``section``: the ``$defs``
        name of a nested field's section)."""
        return form.get(
            self.given, path, form.field(section, path.rsplit(".", 1)[-1]).get("default")
        )

    def number(self, label: str, path: str, section: str | None = None, **kwargs):
        """A number input of the schema's type, without bounds (the schema checks them), with the
        field's error slot under it."""
        start = self.default(path, section)
        if form.field(section, path.rsplit(".", 1)[-1]).get("type") == "number":
            value = st.number_input(
                label, value=float(start), format="%g", step=None, key=self.key(path), **kwargs
            )
        else:
            value = st.number_input(
                label,
                value=None if start is None else int(start),
                step=1,
                key=self.key(path),
                **kwargs,
            )
        self.slots.add(path)
        return value

    def optional_float(self, label: str, path: str, section: str | None = None, **kwargs):
        """A number input for a float field that may be left empty (``None``)."""
        start = self.default(path, section)
        value = st.number_input(
            label,
            value=None if start is None else float(start),
            format="%g",
            step=None,
            key=self.key(path),
            **kwargs,
        )
        self.slots.add(path)
        return value

    def checkbox(self, label: str, path: str, section: str | None = None, **kwargs) -> bool:
        return st.checkbox(
            label, value=bool(self.default(path, section)), key=self.key(path), **kwargs
        )

    def text(self, label: str, path: str, section: str | None = None, **kwargs) -> str:
        value = st.text_input(
            label, value=self.default(path, section) or "", key=self.key(path), **kwargs
        )
        self.slots.add(path)
        return value

    def tristate(self, label: str, path: str, section: str | None = None) -> bool | None:
        """A switch that may follow a preset: ``None`` (preset), ``True`` or ``False``."""
        start = {value: name for name, value in TRISTATE.items()}[self.default(path, section)]
        names = list(TRISTATE)
        chosen = st.selectbox(
            label,
            names,
            index=names.index(start),
            key=self.key(path),
            help=f"`{path.rsplit('.', 1)[-1]}`; preset: on with the DGC preset, else off",
        )
        self.slots.add(path)
        return TRISTATE[chosen]

    def select(self, label: str, options: list[str], path: str, section: str | None = None) -> str:
        start = self.default(path, section)
        return st.selectbox(
            label,
            options,
            index=options.index(start) if start in options else 0,
            key=self.key(path),
        )

    def component(
        self, title: str, registry, path: str, section: str, skip=(), more=frozenset()
    ) -> dict:
        """A registry entry: its name and a widget per constructor parameter."""
        name = self.select(title, registry.names(), f"{path}.name", section)
        params, errors = form.param_inputs(
            registry,
            name,
            form.get(self.given, f"{path}.params", {}) or {},
            self.key(f"{path}.params"),
            skip,
            more,
        )
        self.local.update({f"{path}.params.{p}": e for p, e in errors.items()})
        self.slots.add(f"{path}.params")
        self.slots.add(path)
        return {"name": name, "params": params}
