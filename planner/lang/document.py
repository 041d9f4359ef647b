"""Top-level plan document schema (pydantic) and the include mechanism."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import Diagnostic, Loc, PlanError, did_you_mean, display_path
from .yamlsrc import MAX_BYTES, Source, load_yaml

__all__ = ["PlanDoc", "BlockDoc", "validate_doc", "pydantic_error", "load_tree"]

MAX_INCLUDES = 64


# a tuned limit: a non-negative integer, as tuning files hold them (true is not 1)
TunedLimit = Annotated[int, Field(strict=True, ge=0)]

class BlockDoc(BaseModel):
    """A reusable group of ops, inlined at every call with its own name scope."""
    model_config = ConfigDict(extra="forbid")
    doc: str | None = None
    args: list[str] = Field(default_factory=list, description="Tensor parameters, bound positionally at the call.")
    outputs: list[str] = Field(default_factory=list, description="Names the block returns, in order.")
    ops: Any = None
    variants: list[dict] | None = None


class PlanDoc(BaseModel):
    """A plan file. Library files (pulled in with `include:`) may omit `plan`."""
    model_config = ConfigDict(extra="forbid")
    plan: str | None = Field(None, description="The plan's name.")
    doc: str | None = None
    include: list[str] = Field(default_factory=list, description="Other plan files, relative to this one.")
    params: dict[str, Any] = Field(default_factory=dict)
    dims: dict[str, Any] = Field(default_factory=dict)
    groups: dict[str, Any] = Field(default_factory=dict)
    tuned: dict[str, TunedLimit] = Field(default_factory=dict)
    streams: list[str] | None = Field(None, description="The streams the plan may use, main first; pins must name one.")
    inputs: dict[str, Any] = Field(default_factory=dict)
    weights: dict[str, Any] = Field(default_factory=dict)
    outputs: list[str] = Field(default_factory=list)
    blocks: dict[str, BlockDoc] = Field(default_factory=dict)
    ops: Any = None
    variants: list[dict] | None = None


_TYPE_WORDS = {
    "missing": "is required", "extra_forbidden": "is not a known field",
    "string_type": "must be a string", "int_type": "must be an integer",
    "int_parsing": "must be an integer", "list_type": "must be a list", "dict_type": "must be a mapping",
    "model_type": "must be a mapping", "literal_error": "has an invalid value",
    "union_tag_invalid": "names an unknown op", "bool_type": "must be true or false",
    "float_type": "must be a number", "float_parsing": "must be a number",
}


def type_words(err: dict) -> str | None:
    """How a pydantic error reads in the plan's words ("must be an integer"), or None."""
    if err["type"] == "literal_error":
        return err["msg"].replace("Input should be", "must be")
    if err["type"] == "greater_than_equal" and "ge" in (err.get("ctx") or {}):
        return f"must be >= {err['ctx']['ge']}"
    return _TYPE_WORDS.get(err["type"])


def pydantic_error(exc: ValidationError, src: Source, base: tuple, model_fields=None, strip_tag=False) -> PlanError:
    diags = []
    for err in exc.errors()[:8]:
        loc = tuple(err["loc"])
        if strip_tag and loc:
            loc = loc[1:]  # discriminated union puts the tag first
        field = ".".join(str(x) for x in loc) or "value"
        word = type_words(err) or err["msg"].lower()
        hint = None
        if err["type"] == "extra_forbidden" and model_fields:
            hint = did_you_mean(str(loc[-1]), model_fields)
        found = ""
        if err["type"] not in ("missing", "extra_forbidden") and "input" in err:
            v = err["input"]
            found = f" (found {str(v).lower() if isinstance(v, bool) else repr(v):.60})"
        diags.append(Diagnostic("schema", f"'{field}' {word}{found}", src.loc(base + loc), hint))
    return PlanError(diags)


def validate_doc(src: Source) -> PlanDoc:
    if not isinstance(src.data, dict):
        raise PlanError.at(src.loc(()), "schema", "a plan file must be a YAML mapping (plan:, params:, ops: ...)")
    try:
        return PlanDoc.model_validate(src.data)
    except ValidationError as exc:
        raise pydantic_error(exc, src, (), list(PlanDoc.model_fields)) from None


# what an included (library) file may hold besides `include`, `doc` and its own `plan` name
LIBRARY_KEYS = ("params", "dims", "groups", "tuned", "blocks")
LIBRARY_ONLY_NOT = ("streams", "inputs", "weights", "outputs", "ops", "variants")


def load_tree(path: Path, text: str | None = None) -> list[tuple[Source, PlanDoc]]:
    """The root plan and every file it includes (depth-first, each once), root last.

    Includes are confined to the root plan's directory tree.
    """
    root_path = Path(path)
    root_dir = root_path.resolve().parent
    out: list[tuple[Source, PlanDoc]] = []
    done: set[Path] = set()
    stack: list[Path] = []
    used = [0]  # bytes read so far: the file-bytes budget covers the root and all its includes

    def visit(p: Path, txt: str | None, from_loc: Loc | None):
        rp = p.resolve()
        if rp in stack:
            chain = " -> ".join(display_path(x) for x in stack + [rp])
            raise PlanError.at(from_loc, "include", f"include cycle: {chain}")
        if rp in done:
            return
        if len(done) >= MAX_INCLUDES:
            raise PlanError.at(from_loc, "limit", f"more than {MAX_INCLUDES} included files")
        src = load_yaml(p, display_path(p), txt, MAX_BYTES - used[0])
        used[0] += src.size
        doc = validate_doc(src)
        if from_loc is not None:  # an included file: only what the docs say it contributes
            for key in LIBRARY_ONLY_NOT:
                if key in doc.model_fields_set and getattr(doc, key) not in (None, [], {}):
                    raise PlanError.at(src.loc((key,)), "schema", f"an included file contributes only"
                                       f" {', '.join(LIBRARY_KEYS)}; '{key}' belongs to the plan that includes it")
        stack.append(rp)
        for i, inc in enumerate(doc.include):
            loc = src.value_loc(("include", i))
            target = (rp.parent / inc)
            try:
                resolved = target.resolve()
            except (OSError, RuntimeError):
                raise PlanError.at(loc, "include", f"cannot resolve include '{inc}'") from None
            if not resolved.is_relative_to(root_dir):
                raise PlanError.at(loc, "include", f"include '{inc}' leaves the plan's directory ({display_path(root_dir)})")
            if resolved.is_dir():
                raise PlanError.at(loc, "include", f"include '{inc}' is a directory; name a YAML file")
            if not resolved.is_file():
                raise PlanError.at(loc, "include", f"included file '{inc}' does not exist")
            visit(target, None, loc)
        stack.pop()
        done.add(rp)
        out.append((src, doc))

    visit(root_path, text, None)
    return out
