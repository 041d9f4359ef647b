"""Errors the runtime raises at build time."""

from __future__ import annotations

__all__ = ["BuildError"]


class BuildError(ValueError):
    """The compiled plan cannot be lowered with the given weights, groups or externs."""
