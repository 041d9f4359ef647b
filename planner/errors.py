"""Located diagnostics for plan files.

Every error a user can cause is a PlanError carrying one or more Diagnostics that
name the file, line and column of the offending YAML node. The CLI prints them and
exits 2; nothing here ever shows a traceback to the user.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Loc", "Diagnostic", "PlanError", "closest", "did_you_mean", "read_json"]

# error classes, documented in docs/plan-language.md#errors
CODES = {
    "yaml": "the file is not valid YAML",
    "limit": "a budget is exceeded: the document is too large or too deep, asks for too much work, or a run needs more memory than the device has free",
    "schema": "a field is missing, unknown or of the wrong type",
    "expr": "an expression does not parse",
    "name": "a name is not defined",
    "type": "an expression has the wrong type",
    "param": "a parameter cannot be evaluated or violates its constraints",
    "shape": "shapes or dtypes do not agree",
    "dup": "a name is defined twice",
    "cycle": "the ops form a dependency cycle",
    "include": "an include cannot be read or escapes the plan's directory",
    "variant": "variants are malformed (missing fallback, differing outputs, ...)",
    "stream": "a stream annotation is invalid",
    "io": "the plan file cannot be read",
}


@dataclass(frozen=True)
class Loc:
    file: str
    line: int = 0  # 1-based; 0 = unknown
    col: int = 0

    def __str__(self) -> str:
        if self.line:
            return f"{self.file}:{self.line}:{self.col}"
        return self.file

    def shift(self, dcol: int) -> Loc:
        """Location `dcol` characters further on the same line (inside a scalar)."""
        return Loc(self.file, self.line, self.col + dcol) if self.line else self


@dataclass
class Diagnostic:
    code: str
    message: str
    loc: Loc | None = None
    hint: str | None = None

    def format(self) -> str:
        where = f"{self.loc}: " if self.loc else ""
        text = f"{where}error[{self.code}]: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def to_json(self) -> dict:
        return {
            "code": self.code,
            "message": self.message,
            "file": self.loc.file if self.loc else None,
            "line": self.loc.line if self.loc else None,
            "col": self.loc.col if self.loc else None,
            "hint": self.hint,
        }


@dataclass
class PlanError(Exception):
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @classmethod
    def at(cls, loc: Loc | None, code: str, message: str, hint: str | None = None) -> PlanError:
        return cls([Diagnostic(code, message, loc, hint)])

    @property
    def code(self) -> str:
        return self.diagnostics[0].code if self.diagnostics else "schema"

    def __str__(self) -> str:
        return "\n".join(d.format() for d in self.diagnostics)


def closest(name: str, candidates) -> str | None:
    names = [c for c in candidates if isinstance(c, str)]
    got = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return got[0] if got else None


def did_you_mean(name: str, candidates) -> str | None:
    c = closest(name, candidates)
    return f"did you mean '{c}'?" if c else None


class no_gc:
    """Pause the cyclic GC while building large object graphs (it made big plans superlinear)."""

    def __enter__(self):
        import gc
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        import gc
        if self.was:
            gc.enable()


def display_path(path: Path | str) -> str:
    """Path as the user would type it: relative to the cwd when possible."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs):
    out = {}
    for k, v in pairs:
        if k in out:  # json.loads would keep the last silently; plans refuse duplicates too
            raise _DuplicateKey(k)
        out[k] = v
    return out


def read_json(path, what: str):
    """A JSON file named on the command line (a tuning file, a device profile, timeline records):
    its value, or a PlanError located at the file (exit 2) when it cannot be read, is not UTF-8,
    is not JSON (with line and column), repeats a key or nests too deep to decode."""
    loc = Loc(str(path))
    try:
        return json.loads(Path(path).read_bytes().decode("utf-8"), object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise PlanError.at(Loc(str(path), exc.lineno, exc.colno), "io", f"cannot read the {what}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise PlanError.at(loc, "io", f"cannot read the {what}: not UTF-8 text (byte {exc.start})") from None
    except _DuplicateKey as exc:
        raise PlanError.at(loc, "dup", f"duplicate key '{exc.args[0]}' in the {what}") from None
    except (OSError, RecursionError) as exc:
        raise PlanError.at(loc, "io", f"cannot read the {what}: {getattr(exc, 'strerror', None) or exc}") from None
    except ValueError as exc:  # what json.loads refuses past parsing: an integer of over 4,300 digits
        raise PlanError.at(loc, "io", f"cannot read the {what}: {str(exc).split(';')[0]}") from None
