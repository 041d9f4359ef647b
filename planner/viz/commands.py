"""Handlers of `planner viz` and `planner timeline` (parsers: planner.cli).

Exit codes: 0 picture written; 1 an image (svg/png/html) was asked for but could not be
rendered (no Graphviz, timeout): the DOT text is written next to it instead; 2 invalid
plan, records or arguments.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..errors import Loc, PlanError, read_json
from ..lang.loader import load_plan, parse_overrides
from .dot import VizOptions, to_dot
from .render import FORMATS, INSTALL_HINT, RenderError, html_page, render_dot, write_bytes

__all__ = ["compile_for_viz", "cmd_viz", "cmd_timeline", "check_timeline_output"]

TIMELINE_FORMATS = (".svg", ".png")


def _note(msg: str) -> None:
    print(f"planner: {msg}", file=sys.stderr)


def compile_for_viz(plan, after: str | None = None, disable: list[str] | None = None, streams: int | None = None):
    """The compiled plan through the pipeline (stopping after `after`), over at most `streams`
    streams (None: the plan's)."""
    from ..commands import check_stream_bound, plan_warnings, tuned_config
    from ..pipeline import compile_plan
    check_stream_bound(streams)
    # the configuration `planner compile` uses (shipped tuning included), so both show one plan
    cfg = tuned_config(plan, disable_passes=set(disable or ()), stop_after=after, num_streams=streams)
    cp = compile_plan(plan, cfg)
    if after is None:
        plan_warnings(cp, cfg)
    for p in cp.bucket_plans:
        if p.get("cp") is not None:
            _note(f"{p['dim']} {p['lo']}..{p['hi']} runs a stream plan of its own, not drawn here"
                  f" (planner compile lists it)")
    ran = list(getattr(cp, "passes_run", []) or [])
    what = f"after {after}" if after else (f"after {len(ran)} passes" if ran else "")
    return cp, what


def _fmt_of(path: Path | None, fmt: str | None) -> str:
    if fmt:
        return fmt
    if path is None:
        return "dot"
    ext = path.suffix.lower().lstrip(".")
    if ext == "gv":
        return "dot"
    if ext == "htm":
        return "html"
    if ext not in FORMATS:
        raise PlanError.at(None, "param", f"-o {path}: unknown picture format '.{ext}'",
                           f"use one of {', '.join('.' + f for f in FORMATS)}")
    return ext


def cmd_viz(args) -> int:
    out = Path(args.output) if args.output else None
    if out is not None and out.resolve() == Path(args.plan).resolve():
        raise PlanError.at(None, "param", f"-o {args.output} is the plan file itself: the picture would overwrite it",
                           "write the picture to another file")
    fmt = _fmt_of(out, args.format)
    plan = load_plan(args.plan, parse_overrides(args.overrides))
    cp, stage = compile_for_viz(plan, args.after, args.disable, args.streams)
    t0 = time.perf_counter()
    dot_text, stats = to_dot(cp, VizOptions(variant=args.variant, expand=args.expand, title=stage, lanes=args.lanes))
    summary = (f"{stats.ops} ops drawn as {stats.nodes} nodes"
               + "".join(f"; {n}x{p}-op block ({lbl})" for lbl, n, p in stats.groups)
               + f"; streams {', '.join(stats.streams)}")
    if fmt == "dot":
        if out is None:
            sys.stdout.write(dot_text)
        else:
            write_bytes(out, dot_text)
            _note(f"wrote {out}: {summary}")
        return 0
    try:
        data = render_dot(dot_text, "png" if fmt == "png" else "svg", timeout=args.timeout)
    except RenderError as exc:
        fallback = (out or Path("plan.svg")).with_suffix(".dot")
        write_bytes(fallback, dot_text)
        _note(f"cannot draw {fmt}: {exc}")
        how = (f"`dot -T{fmt} {fallback}`" if fmt != "html" else
               f"`dot -Tsvg {fallback}` (the html page wraps that SVG), or `planner viz` again with Graphviz installed")
        _note(f"wrote the DOT text to {fallback} instead (render it later with {how})")
        return 1
    if fmt == "html":
        data = html_page(data.decode("utf-8", errors="replace"), f"plan {plan.name}").encode()
    if out is None:
        sys.stdout.buffer.write(data)
    else:
        write_bytes(out, data)
        _note(f"wrote {out} in {time.perf_counter() - t0:.1f} s: {summary}")
    return 0


def load_records(path: str) -> tuple[list[dict], str]:
    """Records saved as JSON: a list, or {"records": [...], "title": ...}."""
    p = Path(path)
    data = read_json(p, "timeline records")
    title = ""
    if isinstance(data, dict):
        title = str(data.get("title", ""))
        data = data.get("records")
    if not isinstance(data, list):
        raise PlanError.at(Loc(str(p)), "schema", "records JSON must be a list of records or {\"records\": [...]}")
    return data, title


def check_timeline_output(path: str, flag: str = "-o", also: tuple = ()) -> None:
    """A timeline picture is .svg or .png (planner run --timeline also writes .json records):
    another name would get SVG text under it."""
    allowed = TIMELINE_FORMATS + also
    ext = Path(path).suffix.lower()
    if ext not in allowed:
        raise PlanError.at(None, "param", f"{flag} {path}: unknown timeline format '{ext or '(no extension)'}'",
                           f"use one of {', '.join(allowed)}")


def cmd_timeline(args) -> int:
    from .timeline import TimelineError, render_timeline
    check_timeline_output(args.output)
    records, title = load_records(args.records)
    out = Path(args.output)
    try:
        written = render_timeline(records, out, title=args.title or title or Path(args.records).stem)
    except TimelineError as exc:
        raise PlanError.at(Loc(args.records), "schema", str(exc)) from None
    if Path(written) != out:
        _note(f"cannot draw {out.suffix.lstrip('.')}: no PNG renderer (matplotlib or Graphviz); {INSTALL_HINT}")
        _note(f"wrote {written} instead")
        return 1
    _note(f"wrote {out}")
    return 0
