"""The error every door reports the same way: a config that cannot run.

It lives apart from :mod:`toolkit.config` because two layers raise it: the schema (a bad field)
and the plan (fields that do not go together, or a batch the data cannot fill), and the schema
asks the plan. The CLI exits 2 on it, the Launch form shows it next to the field it names.
"""


class ConfigError(ValueError):
    """A config that cannot run; the message names every bad field and what it allows."""
