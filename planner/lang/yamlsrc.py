"""Safe YAML loading that remembers where every value came from.

PyYAML's SafeLoader composes a node tree; we convert it ourselves so that
  - only plain scalars, sequences and mappings exist (no tags, no objects),
  - duplicate keys are errors instead of silent overwrites,
  - size, depth and alias expansion are bounded (no billion laughs, no RecursionError),
  - every value's (line, col) is kept in a side table keyed by its path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import Loc, PlanError

__all__ = ["Source", "load_yaml"]

# libyaml's parser is ~10x faster; the pure-Python one gives the same nodes and marks
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 500_000

_SCALAR_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}


@dataclass
class Source:
    """A parsed YAML document plus the location of each of its nodes."""

    file: str
    data: object
    locs: dict[tuple, Loc] = field(default_factory=dict)
    vlocs: dict[tuple, Loc] = field(default_factory=dict)  # where a scalar's text starts
    size: int = 0  # characters of the text

    def value_loc(self, path: tuple) -> Loc:
        """Location of the first character of the scalar at `path` (for expression columns)."""
        return self.vlocs.get(tuple(path)) or self.loc(path)

    def loc(self, path: tuple) -> Loc:
        """Location of the node at `path`, or of its closest ancestor that has one."""
        path = tuple(path)
        while path:
            if path in self.locs:
                return self.locs[path]
            path = path[:-1]
        return self.locs.get((), Loc(self.file, 1, 1))


class _Converter:
    def __init__(self, file: str):
        self.file = file
        self.locs: dict[tuple, Loc] = {}
        self.vlocs: dict[tuple, Loc] = {}
        self.count = 0
        self.ctor = yaml.SafeLoader.__new__(yaml.SafeLoader)
        yaml.constructor.SafeConstructor.__init__(self.ctor)

    def loc(self, node) -> Loc:
        m = node.start_mark
        return Loc(self.file, m.line + 1, m.column + 1)

    def scalar(self, node, what: str):
        """A scalar key or value under a standard tag (a located error for any other tag, and for
        a malformed value under an explicit one: !!int abc)."""
        if node.tag not in _SCALAR_TAGS:
            raise PlanError.at(self.loc(node), "schema", f"YAML tag '{node.tag}' is not allowed in a plan")
        try:
            return self.ctor.construct_object(node)
        except Exception as exc:
            raise PlanError.at(self.loc(node), "yaml", f"bad {what}: {exc}") from None

    def convert(self, root):
        # iterative to survive deep documents; depth is already bounded by _check_depth
        out_root: list = [None]
        stack = [(root, (), out_root, 0)]
        while stack:
            node, path, parent, key = stack.pop()
            self.count += 1
            if self.count > MAX_NODES:
                raise PlanError.at(
                    self.loc(node), "limit",
                    f"document has more than {MAX_NODES:,} nodes with aliases expanded (budget 'yaml-nodes')",
                )
            self.locs.setdefault(path, self.loc(node))
            if isinstance(node, yaml.ScalarNode):
                if node.style in ("'", '"'):
                    self.vlocs[path] = self.loc(node).shift(1)
                elif not node.style:
                    self.vlocs[path] = self.loc(node)
                parent[key] = self.scalar(node, "scalar")
            elif isinstance(node, yaml.SequenceNode):
                if node.tag != "tag:yaml.org,2002:seq":
                    raise PlanError.at(self.loc(node), "schema", f"YAML tag '{node.tag}' is not allowed in a plan")
                seq = [None] * len(node.value)
                parent[key] = seq
                for i in reversed(range(len(node.value))):
                    stack.append((node.value[i], path + (i,), seq, i))
            elif isinstance(node, yaml.MappingNode):
                if node.tag != "tag:yaml.org,2002:map":
                    raise PlanError.at(self.loc(node), "schema", f"YAML tag '{node.tag}' is not allowed in a plan")
                mapping: dict = {}
                parent[key] = mapping
                pending = []
                for knode, vnode in node.value:
                    if not isinstance(knode, yaml.ScalarNode):
                        raise PlanError.at(self.loc(knode), "schema", "mapping keys must be plain scalars")
                    if knode.tag == "tag:yaml.org,2002:merge":  # the resolver tags '<<' before we see it
                        raise PlanError.at(self.loc(knode), "schema", "YAML merge keys ('<<') are not supported")
                    k = self.scalar(knode, "key")
                    if isinstance(k, bool) or k is None or isinstance(k, float):
                        k = knode.value  # `on:`/`null:` keys keep their text
                    k = str(k)
                    if k == "<<":
                        raise PlanError.at(self.loc(knode), "schema", "YAML merge keys ('<<') are not supported")
                    if k in mapping:
                        raise PlanError.at(self.loc(knode), "dup", f"duplicate key '{k}'")
                    mapping[k] = None
                    self.locs[path + (k,)] = self.loc(knode)
                    pending.append((vnode, path + (k,), mapping, k))
                stack.extend(reversed(pending))
            else:  # pragma: no cover - PyYAML has only three node kinds
                raise PlanError.at(self.loc(node), "yaml", "unknown YAML node")
        return out_root[0]


def _check_depth(text: str, file: str) -> None:
    # one streaming pass before composing: depth and node count are refused before any tree is built
    depth = events = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            events += 1
            if events > MAX_NODES:
                m = event.start_mark
                raise PlanError.at(Loc(file, m.line + 1, m.column + 1), "limit",
                                   f"document has more than {MAX_NODES:,} YAML nodes (budget 'yaml-nodes')")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    m = event.start_mark
                    raise PlanError.at(Loc(file, m.line + 1, m.column + 1), "limit",
                                       f"document nests deeper than {MAX_DEPTH} levels (budget 'yaml-depth')")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file, text) from None


def _reader_error(exc: yaml.reader.ReaderError, file: str, text: str) -> PlanError:
    """A character YAML refuses anywhere, at its line and column. The error's position is a byte
    offset for libyaml and a character offset for PyYAML: the character itself is looked up."""
    c = exc.character if isinstance(exc.character, int) else ord(exc.character)
    at = text.find(chr(c))
    loc = Loc(file, text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)) if at >= 0 else Loc(file)
    name = " (NUL)" if c == 0 else ""
    return PlanError.at(loc, "yaml", f"character U+{c:04X}{name} is not allowed in a plan: YAML text has no"
                        " control characters besides tab, newline and carriage return",
                        "delete it (an editor may not show it)")


def _yaml_error(exc: yaml.YAMLError, file: str, text: str = "") -> PlanError:
    if isinstance(exc, yaml.reader.ReaderError):
        return _reader_error(exc, file, text)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    loc = Loc(file, mark.line + 1, mark.column + 1) if mark else Loc(file)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    msg = f"YAML syntax: {problem}" + (f" ({context})" if context else "")
    hint = None
    line = text.split("\n")[mark.line] if mark and text and mark.line < text.count("\n") + 1 else ""
    import re
    if re.search(r":\s*\[[^\]]*\]\s*\w", line):
        hint = ("a value that starts with '[' is a YAML list; write a tensor type as bf16[d0, d1] or quote the"
                " whole value")
    elif "mapping values are not allowed" in problem:
        hint = "a value containing ': ' must be quoted"
    return PlanError.at(loc, "yaml", msg, hint)


def load_yaml(path: Path | str, display: str | None = None, text: str | None = None,
              max_bytes: int = MAX_BYTES) -> Source:
    """Parse one plan file (or `text` as if it were that file) of at most `max_bytes`."""
    file = display or str(path)
    if text is None:
        try:
            # stat first: a huge (or sparse) file is refused without reading it
            size = Path(path).stat().st_size
            if size > max_bytes:
                raise PlanError.at(Loc(file), "limit", f"plan file is {size:,} bytes; the limit is {max_bytes:,}"
                                   " (budget 'file-bytes', all included files together)")
            with open(path, "rb") as f:
                raw = f.read(max_bytes + 1)  # the file may grow between stat and read
        except OSError as exc:
            raise PlanError.at(Loc(file), "io", f"cannot read plan: {exc.strerror or exc}") from None
        if len(raw) > max_bytes:
            raise PlanError.at(Loc(file), "limit", f"plan file is over {max_bytes:,} bytes (budget 'file-bytes')")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PlanError.at(Loc(file), "yaml", f"plan is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    elif len(text) > max_bytes:
        raise PlanError.at(Loc(file), "limit", f"plan text is {len(text):,} characters; the limit is {max_bytes:,}"
                           " (budget 'file-bytes')")
    _check_depth(text, file)
    try:
        nodes = list(yaml.compose_all(text, Loader=_LOADER))
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file, text) from None
    except RecursionError:
        raise PlanError.at(Loc(file), "limit", "document nests too deeply") from None
    if not nodes or nodes[0] is None:
        raise PlanError.at(Loc(file, 1, 1), "schema", "plan file is empty")
    if len(nodes) > 1:
        m = nodes[1].start_mark
        raise PlanError.at(Loc(file, m.line + 1, m.column + 1), "schema", "a plan file holds one YAML document")
    conv = _Converter(file)
    data = conv.convert(nodes[0])
    return Source(file, data, conv.locs, conv.vlocs, len(text))
