"""The scripted runtime: plays a scenario file (``scenarios/<name>.json``, shipped with the package) as a runtime
would, deterministically and without credentials."""

from ._adapter import ScriptedAdapter

__all__ = ["ScriptedAdapter"]
