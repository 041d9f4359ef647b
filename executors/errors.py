"""Errors the runtime raises: at build time (BuildError) and at a call's input check (InputError)."""

from __future__ import annotations

from .dims import DimError

__all__ = ["BuildError", "InputError"]


class BuildError(ValueError):
    """The compiled plan cannot be lowered with the given weights, groups or externs."""


class InputError(DimError):
    """A call's inputs do not match the plan: raised before any kernel or collective runs."""
