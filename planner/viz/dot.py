"""The compiled dependency graph as Graphviz DOT text.

Layout, outermost first: a box per collapsed repeat ("x69"), per region, per gated
variant (label = its `when` gate), and innermost one lane per stream, filled with the
stream's colour. Ops are boxes filled by op kind; fused collectives have a double
border and list what they absorbed. Solid dark edges carry tensors; dashed red edges go
from the op that records an event to the op that waits on it; dashed grey edges feed
the next repetition of a collapsed group.
"""

from __future__ import annotations

import html
import re
import textwrap
from dataclasses import dataclass, field

from ..errors import PlanError, did_you_mean
from ..opbase import written_in_place
from ..shapes import fmt_shape
from .collapse import Repeat, find_repeats, node_order
from .palette import CARRY_COLOR, DATA_COLOR, EVENT_COLOR, kind_color, stream_color

__all__ = ["VizOptions", "VizStats", "to_dot"]

_DISCARD = re.compile(r"\._\d+$")
ENTRY = "entry"
EXIT = "exit"
BR_LEFT = '<BR ALIGN="LEFT"/>'


@dataclass
class VizOptions:
    variant: str | None = None   # keep only this variant of every region that has it
    expand: bool = False         # draw every repetition instead of one with a count
    min_repeat: int = 3          # fewest repetitions that collapse
    min_hidden: int = 8          # ...and only when that hides at least this many ops
    lanes: str = "inner"         # inner: lanes inside regions/variants; outer: one column per stream
    title: str = ""              # extra title line (e.g. "after assign-streams")
    max_outputs: int = 4         # output lines per node before "+N more"


@dataclass
class VizStats:
    ops: int = 0
    nodes: int = 0
    groups: list = field(default_factory=list)  # (label, count, period)
    streams: list = field(default_factory=list)


def _esc(s) -> str:
    return html.escape(str(s), quote=True)


def _q(s) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def _short(op_id: str) -> str:
    return op_id.rsplit("/", 1)[-1]


def _double_border(op) -> bool:
    """A fused collective (the legend's double border); a fused gemm chain is no collective."""
    return bool(getattr(op, "fused_from", None)) and op.op != "gemm_chain"


def select_variant(cp, name: str) -> set[str]:
    """Nodes to keep when only variant `name` is shown (regions without it keep all)."""
    regions = cp.plan.regions
    live = getattr(cp, "variants", None)
    live = {r: live.get(r, []) for r in regions} if live is not None else {r: reg.variants for r, reg in regions.items()}
    have = {r for r, vs in live.items() if any(v.name == name for v in vs)}
    if not have:
        written = {r for r, reg in regions.items() if any(v.name == name for v in reg.variants)}
        if written:  # the compile removed it (its gate folds to false for these params)
            raise PlanError.at(None, "variant", f"--variant {name}: the compile removed variant '{name}' from"
                               f" {len(written)} region(s) ({sorted(written)[0]}{', ...' if len(written) > 1 else ''}): its gate is false for these"
                               " params (see the report's Dead code)", "pick a live variant, or --set the params it needs")
        names = sorted({v.name for reg in regions.values() for v in reg.variants})
        hint = did_you_mean(name, names) or (f"variants in this plan: {', '.join(names)}" if names
                                             else "this plan has no gated regions")
        raise PlanError.at(None, "variant", f"--variant {name}: no region has a variant named '{name}'", hint)
    g = cp.graph
    return {v for v in g.nodes if all(r not in have or var == name for r, var in g.nodes[v].get("ctx", ()))}


class _Builder:
    def __init__(self, cp, opts: VizOptions):
        self.cp, self.opts = cp, opts
        g = cp.graph
        keep = select_variant(cp, opts.variant) if opts.variant else set(g.nodes)
        self.g = g.subgraph(keep)
        self.order = [v for v in node_order(cp) if v in keep]
        reps = [] if opts.expand else find_repeats(self.g, self.order, opts.min_repeat)
        self.repeats: list[Repeat] = [r for r in reps if (r.count - 1) * r.period >= opts.min_hidden]
        self.group_of = {v: r for r in self.repeats for v in r.index}
        self.streams = list(cp.streams)
        for v in self.order:
            s = self.g.nodes[v].get("stream") or "main"
            if s not in self.streams:
                self.streams.append(s)
        used = {self.g.nodes[v].get("stream") or "main" for v in self.order}
        self.multi = len(used) > 1
        self.ids: dict[str, str] = {}
        self.kinds: list[str] = []
        self.edge_kinds: set[str] = set()
        self.out_names = set(cp.plan.outputs)
        self.lines: list[str] = []
        self._clusters: list[tuple] = []

    # ---------------------------------------------------------------- mapping

    def shown(self, v: str) -> str | None:
        """The drawn node standing for `v` (itself, or its copy in the first repetition)."""
        r = self.group_of.get(v)
        return r.rep(v) if r else v

    def nid(self, v: str) -> str:
        if v not in self.ids:
            self.ids[v] = f"n{len(self.ids)}"
        return self.ids[v]

    def path(self, v: str) -> tuple:
        d = self.g.nodes[v]
        s = d.get("stream") or "main"
        p = []
        if self.opts.lanes == "outer" or not self.multi:
            p.append(("lane", s))
        if v in self.group_of:
            p.append(("rep", self.group_of[v].gid))
        for i, (r, var) in enumerate(d.get("ctx", ())):
            outer = tuple(d["ctx"][:i])
            p.append(("region", outer, r))
            p.append(("variant", outer, r, var))
        if self.opts.lanes != "outer" and self.multi:
            p.append(("lane", s))
        return tuple(p)

    # ---------------------------------------------------------------- labels

    def node_label(self, v: str) -> str:
        d = self.g.nodes[v]
        op = d["op"]
        tensors = self.cp.tensors
        fused = list(getattr(op, "fused_from", None) or [])
        head = f"<B>{_esc(op.op)}</B>"
        if fused:
            head += f" <B>· fused ×{len(fused)}</B>"
        rows = [head]
        name = _short(op.id)
        if op.op == "extern":
            rows.append(f"{_esc(name)} = <I>{_esc(op.fn)}</I>")
        else:
            rows.append(_esc(name))
        outs = [o for o in op.out if o in tensors and not _DISCARD.search(o)]
        for o in outs[: self.opts.max_outputs]:
            t = tensors[o]
            prefix = f"{_esc(_short(o))} " if len(outs) > 1 else ""
            rows.append(f'<FONT POINT-SIZE="9">{prefix}{_esc(fmt_shape(t.shape))} {_esc(t.dtype)}</FONT>')
        if len(outs) > self.opts.max_outputs:
            rows.append(f'<FONT POINT-SIZE="9">+{len(outs) - self.opts.max_outputs} more</FONT>')
        if fused:
            for line in _wrap("absorbed: " + ", ".join(fused), 44):
                rows.append(f'<FONT POINT-SIZE="9"><I>{_esc(line)}</I></FONT>')
        inplace = getattr(op, "inplace", None)
        if inplace is True:  # the norms: their results overwrite these inputs
            inplace = None
            rows.append(f'<FONT POINT-SIZE="9"><I>{_esc("overwrites " + ", ".join(written_in_place(op)))}</I></FONT>')
        if inplace:
            for line in _wrap("written in place: " + ", ".join(inplace), 44):
                rows.append(f'<FONT POINT-SIZE="9"><I>{_esc(line)}</I></FONT>')
        extra = []
        if d.get("cost_us") is not None:
            extra.append(f"~{d['cost_us']:.3g} us")
        if any(o in self.out_names for o in op.out):
            extra.append("⇒ plan output")
        if extra:
            rows.append(f'<FONT POINT-SIZE="9">{_esc("   ".join(extra))}</FONT>')
        return "<" + "<BR/>".join(rows) + ">"

    def tooltip(self, v: str) -> str:
        d = self.g.nodes[v]
        op = d["op"]
        parts = [op.id, f"kind: {op.op}", f"stream: {d.get('stream') or 'main'}",
                 "inputs: " + ", ".join(op.inputs())]
        if d.get("ctx"):
            parts.append("when: " + " / ".join(f"{r}={var}" for r, var in d["ctx"]))
        if d.get("waits"):
            parts.append("waits: " + ", ".join(d["waits"]))
        if d.get("records"):
            parts.append("records: " + ", ".join(d["records"]))
        r = self.group_of.get(v)
        if r:
            parts.append(f"stands for {r.count} repetitions")
        return "\n".join(parts)

    def cluster_label(self, key: tuple) -> tuple[str, dict]:
        kind = key[0]
        if kind == "rep":
            r = next(x for x in self.repeats if x.gid == key[1])
            first, last = r.instances[0], r.instances[-1]
            label = (f"<<B>×{r.count}</B>  repeated block of {r.period} op{'s' if r.period > 1 else ''}{BR_LEFT}"
                     f"<FONT POINT-SIZE=\"10\">first shown: {_esc(first[0])} … {_esc(first[-1])};"
                     f" last: {_esc(last[0])} … {_esc(last[-1])}</FONT>{BR_LEFT}>")
            return label, {"style": "dashed,rounded,bold", "color": "#555555", "penwidth": "2"}
        if kind == "region":
            return (f"<<B>region {_esc(key[2])}</B>  (one variant runs per call)>",
                    {"style": "rounded", "color": "#7f7f7f"})
        if kind == "variant":
            r, var = key[2], key[3]
            reg = self.cp.plan.regions.get(r)
            vobj = next((x for x in reg.variants if x.name == var), None) if reg else None
            rows = [f"<B>variant {_esc(var)}</B>"]
            if vobj is not None:
                if vobj.when is None:
                    rows[0] += " (fallback: when no gate above holds)"
                else:
                    gate = vobj.when_text or vobj.when_src or ""
                    for i, line in enumerate(_wrap(gate, 48)):
                        rows.append(f'<FONT POINT-SIZE="10">{"when " if i == 0 else "     "}{_esc(line)}</FONT>')
                    if vobj.static is True:
                        rows.append('<FONT POINT-SIZE="10">(gate is always true here)</FONT>')
                    elif vobj.static is False:
                        rows.append('<FONT POINT-SIZE="10">(gate is always false here: never runs)</FONT>')
            return "<" + BR_LEFT.join(rows) + BR_LEFT + ">", {"style": "rounded,filled", "fillcolor": "#fffdf5",
                                                    "color": "#b08d2a"}
        s = key[1]
        fill, border = stream_color(s, self.streams)
        return (f"<<B>stream {_esc(s)}</B>>",
                {"style": "rounded,filled", "fillcolor": fill, "color": border, "penwidth": "1.5"})

    # ---------------------------------------------------------------- emit

    def build(self) -> tuple[str, VizStats]:
        cp, g = self.cp, self.g
        drawn = [v for v in self.order if self.shown(v) == v]
        stats = VizStats(ops=len(self.order), nodes=len(drawn), streams=sorted(
            {g.nodes[v].get("stream") or "main" for v in self.order}, key=self.streams.index))
        stats.groups = [(f"{r.instances[0][0]} … {r.instances[-1][-1]}", r.count, r.period) for r in self.repeats]

        # the cluster tree: path prefix -> children / nodes
        tree: dict[tuple, dict] = {(): {"children": [], "nodes": []}}
        for v in drawn:
            p = self.path(v)
            for i in range(1, len(p) + 1):
                if p[:i] not in tree:
                    tree[p[:i]] = {"children": [], "nodes": []}
                    tree[p[:i - 1]]["children"].append(p[:i])
            tree[p]["nodes"].append(v)
        # the call's start and end: events main records on entry / waits on before returning
        self.exit_waits = [e for e in getattr(cp, "exit_waits", None) or () if self._event_source(e) is not None]
        self.terminals = [ENTRY] if any(self._event_source(e) is None for v in g.nodes
                                        for e in g.nodes[v].get("waits", ())) else []
        if self.exit_waits:
            self.terminals.append(EXIT)
        main_lane = ("lane", "main")
        if self.terminals and (main_lane,) not in tree:
            tree[(main_lane,)] = {"children": [], "nodes": []}
            tree[()]["children"].append((main_lane,))

        title = [f"<B>plan {_esc(cp.plan.name)}</B>: {len(self.order)} ops"
                 + (f", {len(drawn)} drawn" if len(drawn) != len(self.order) else "")
                 + f"; streams: {_esc(', '.join(stats.streams))}"]
        if self.opts.title:
            title.append(_esc(self.opts.title))
        if self.repeats:
            title.append("repeated blocks are drawn once with their count (--expand draws all)")
        L = self.lines
        L.append("digraph plan {")
        L.append('  graph [rankdir=TB, newrank=true, compound=true, fontname="Helvetica", fontsize=12,'
                 ' nodesep=0.3, ranksep=0.45, labelloc=t, labeljust=l, '
                 f'label=<{BR_LEFT.join(title)}{BR_LEFT}>];')
        L.append('  node [fontname="Helvetica", fontsize=11, shape=box, style="rounded,filled", margin="0.12,0.05"];')
        L.append(f'  edge [fontname="Helvetica", fontsize=9, color="{DATA_COLOR}", arrowsize=0.7];')
        self._emit(tree, (), 1)
        self._inputs(drawn)
        self._edges(drawn)
        if ENTRY in self.terminals:
            L.append(f"  {{ rank=min; {ENTRY}; }}")
        if EXIT in self.terminals:
            L.append(f"  {{ rank=max; {EXIT}; }}")
        self._legend()
        L.append("}")
        return "\n".join(L) + "\n", stats

    def _emit(self, tree, key, depth):
        ind = "  " * depth
        for v in tree[key]["nodes"]:
            self._node(v, ind)
        if key == (("lane", "main"),):
            tips = {ENTRY: "event recorded on main when the plan is called",
                    EXIT: "main waits on these events before the call returns (join)"}
            for t in self.terminals:
                self.lines.append(f'{ind}{t} [label="{t}", shape=circle, style=filled, fillcolor="#ffffff",'
                                  f' color="{EVENT_COLOR}", fontsize=9, width=0.5, fixedsize=true,'
                                  f' tooltip="{tips[t]}"];')
        for child in tree[key]["children"]:
            name = f"cluster_{len(self._clusters)}"
            self._clusters.append(child)
            label, attrs = self.cluster_label(child[-1])
            self.lines.append(f"{ind}subgraph {name} {{")
            a = ", ".join(f"{k}={_q(v)}" for k, v in attrs.items())
            self.lines.append(f"{ind}  graph [label={label}, {a}, fontsize=11, margin=10];")
            self._emit(tree, child, depth + 1)
            self.lines.append(f"{ind}}}")

    def _node(self, v, ind):
        op = self.g.nodes[v]["op"]
        fill, border = kind_color(op.op)
        if op.op not in self.kinds:
            self.kinds.append(op.op)
        attrs = {"fillcolor": fill, "color": border, "tooltip": self.tooltip(v)}
        if _double_border(op):
            attrs.update(peripheries="2", penwidth="2.5")
        elif op.op == "select":
            attrs.update(shape="box", style="rounded,filled,dashed")
        a = ", ".join(f"{k}={_q(x)}" for k, x in attrs.items())
        self.lines.append(f"{ind}{self.nid(v)} [label={self.node_label(v)}, {a}];")

    def _inputs(self, drawn):
        """Plan inputs (not weights) as dashed boxes on top, with edges to their drawn readers."""
        drawn_set = set(drawn)
        ranks = []
        for name in self.cp.plan.inputs:
            t = self.cp.tensors.get(name)
            readers = sorted({self.shown(v) for v in self.g.nodes if name in self.g.nodes[v]["op"].inputs()},
                             key=lambda v: self.order.index(v))
            readers = [v for v in readers if v in drawn_set]
            if t is None or not readers:
                continue
            nid = f"in{len(ranks)}"
            ranks.append(nid)
            label = f"<<B>input</B> {_esc(name)}<BR/><FONT POINT-SIZE=\"9\">{_esc(fmt_shape(t.shape))} {_esc(t.dtype)}</FONT>>"
            self.lines.append(f'  {nid} [label={label}, style="rounded,dashed", fillcolor="#ffffff", color="#555555",'
                              f' tooltip={_q("plan input " + name)}];')
            for v in readers:
                self.lines.append(f"  {nid} -> {self.nid(v)} [tooltip={_q(name)}];")
        if ranks:
            self.lines.append("  { rank=min; " + "; ".join(ranks) + "; }")

    def _event_source(self, e: str) -> str | None:
        ev = self.cp.events.get(e)
        if e == ENTRY or not ev or ev.get("op") is None or ev["op"] not in self.g:
            return None
        return ev["op"]

    def _edges(self, drawn):
        g = self.g
        agg: dict[tuple, list] = {}

        def add(u, v, kind, what):
            agg.setdefault((u, v, kind), []).append(what)

        for u, v, d in g.edges(data=True):
            su, sv = self.shown(u), self.shown(v)
            ru, rv = self.group_of.get(u), self.group_of.get(v)
            carry = ru is not None and ru is rv and ru.index[u][0] != rv.index[v][0]
            add(su, sv, "carry" if carry else "data", ", ".join(d.get("tensors", ())))
        for v in g.nodes:
            for e in g.nodes[v].get("waits", ()):
                src = self._event_source(e)
                add(ENTRY if src is None else self.shown(src), self.shown(v), "event", e)
        for e in self.exit_waits:
            add(self.shown(self._event_source(e)), EXIT, "event", e)
        L = self.lines
        for (u, v, kind), whats in agg.items():
            self.edge_kinds.add(kind)
            su = ENTRY if u == ENTRY else self.nid(u)
            sv = EXIT if v == EXIT else self.nid(v)
            n = len(whats)
            # inside one collapsed block every edge repeats with the block: the box says how often
            inner = u in self.group_of and self.group_of[u] is self.group_of.get(v)
            if kind == "data":
                tip = "; ".join(sorted(set(whats)))[:300]
                label = f", label={_q(f'×{n}')}" if n > 1 and not inner else ""
                L.append(f"  {su} -> {sv} [tooltip={_q(tip)}{label}];")
            elif kind == "carry":
                L.append(f'  {su} -> {sv} [style=dashed, color="{CARRY_COLOR}", constraint=false,'
                         f' label={_q(f"next block ×{n}")}, fontcolor="{CARRY_COLOR}"];')
            else:
                first = whats[0] if whats[0] == ENTRY or "/" not in whats[0] else "ev." + _short(whats[0])
                label = first if n == 1 or inner else f"{first} (×{n})"
                L.append(f'  {su} -> {sv} [style=dashed, penwidth=1.8, color="{EVENT_COLOR}",'
                         f' fontcolor="{EVENT_COLOR}", label={_q(label)}, tooltip={_q("wait on " + label)}];')

    def _legend(self):
        rows = ['<TR><TD COLSPAN="2"><B>legend</B></TD></TR>']
        for k in self.kinds:
            fill, border = kind_color(k)
            rows.append(f'<TR><TD BGCOLOR="{fill}" WIDTH="26"> </TD><TD ALIGN="LEFT">{_esc(k)}</TD></TR>')
        rows.append(f'<TR><TD><FONT COLOR="{DATA_COLOR}">━━▶</FONT></TD>'
                    '<TD ALIGN="LEFT">data: consumer reads producer\'s tensor</TD></TR>')
        if "event" in self.edge_kinds:
            rows.append(f'<TR><TD><FONT COLOR="{EVENT_COLOR}">╍╍▶</FONT></TD>'
                        '<TD ALIGN="LEFT">event: recorded after tail op, waited on before head op</TD></TR>')
        if "carry" in self.edge_kinds:
            rows.append(f'<TR><TD><FONT COLOR="{CARRY_COLOR}">╍╍▶</FONT></TD>'
                        '<TD ALIGN="LEFT">feeds the next repetition</TD></TR>')
        if any(_double_border(self.g.nodes[v]["op"]) for v in self.g.nodes):
            rows.append('<TR><TD><TABLE BORDER="1" CELLBORDER="1" CELLSPACING="1" CELLPADDING="3"><TR><TD> </TD>'
                        '</TR></TABLE></TD><TD ALIGN="LEFT">double border: fused collective (lists what it absorbed)</TD></TR>')
        if self.repeats:
            rows.append('<TR><TD BORDER="1" STYLE="dashed">×N</TD>'
                        '<TD ALIGN="LEFT">repeated block: first copy drawn, N copies run</TD></TR>')
        for s in self.streams:
            if not self.multi and s != "main":
                continue
            fill, border = stream_color(s, self.streams)
            rows.append(f'<TR><TD BGCOLOR="{fill}" COLOR="{border}" BORDER="1"> </TD>'
                        f'<TD ALIGN="LEFT">lane: stream {_esc(s)}</TD></TR>')
        self.lines.append('  legend [shape=plaintext, style="", margin=0, tooltip="legend", label=<'
                          '<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="2" CELLPADDING="3" COLOR="#999999">'
                          + "".join(rows) + "</TABLE>>];")


def to_dot(cp, opts: VizOptions | None = None) -> tuple[str, VizStats]:
    """DOT text for a compiled plan, and what it drew."""
    return _Builder(cp, opts or VizOptions()).build()
