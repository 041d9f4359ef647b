"""Measured per-stream timeline (Gantt chart) from executor records.

records = [{"stream": str, "op": str, "kind": str, "start_us": float, "end_us": float}]
(the executor derives them from CUDA events). One row per stream, bars coloured by op
kind with the graph's palette, a time axis in us, and a red band wherever two or more
streams are busy at once, so overlap shows at a glance.

The chart is laid out once as rectangles and text, then written as SVG (pure Python),
or as PNG through matplotlib when it is installed, else through Graphviz (`neato -n2`
with every box pinned). With neither, render_timeline writes the SVG and returns its path.
"""

from __future__ import annotations

import html
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .palette import EVENT_COLOR, kind_color
from .render import find_dot

__all__ = ["TimelineError", "render_timeline", "timeline_svg", "check_records", "overlap_us"]

WIDTH = 1200
LEFT, RIGHT, TOP = 120, 30, 64
ROW_H, BAR_H, GAP = 30, 22, 10


class TimelineError(ValueError):
    """The records are malformed (missing keys, end before start, nothing to draw)."""


@dataclass
class Rect:
    x: float
    y: float
    w: float
    h: float
    fill: str
    stroke: str = "none"
    tip: str = ""
    opacity: float = 1.0


@dataclass
class Text:
    x: float
    y: float           # baseline
    s: str
    size: float = 11
    anchor: str = "start"  # start | middle | end
    color: str = "#222222"
    bold: bool = False


def check_records(records) -> list[dict]:
    if not isinstance(records, list) or not records:
        raise TimelineError("no timeline records to draw")
    out = []
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise TimelineError(f"record {i} is not a mapping")
        miss = [k for k in ("stream", "op", "start_us", "end_us") if k not in r]
        if miss:
            raise TimelineError(f"record {i} lacks {', '.join(miss)} (needs stream, op, start_us, end_us; kind is optional)")
        try:
            s, e = float(r["start_us"]), float(r["end_us"])
        except (TypeError, ValueError):
            raise TimelineError(f"record {i} ({r.get('op')}): start_us/end_us must be numbers") from None
        if not (math.isfinite(s) and math.isfinite(e)):
            raise TimelineError(f"record {i} ({r.get('op')}): start_us/end_us must be finite numbers,"
                                f" got {r['start_us']!r} and {r['end_us']!r}")
        if e < s:
            raise TimelineError(f"record {i} ({r.get('op')}): end_us {e} is before start_us {s}")
        out.append({"stream": str(r["stream"]), "op": str(r["op"]), "kind": str(r.get("kind") or "op"),
                    "start_us": s, "end_us": e})
    return out


def overlap_us(recs: list[dict]) -> list[tuple[float, float]]:
    """Intervals where ops of two or more different streams run at once."""
    return _busy(recs, 2)


def _busy(recs: list[dict], streams: int) -> list[tuple[float, float]]:
    """Intervals where ops of at least `streams` different streams run (1: any op runs; ops that
    overlap on one stream count once)."""
    edges = []
    for r in recs:
        if r["end_us"] > r["start_us"]:
            edges += [(r["start_us"], 1, r["stream"]), (r["end_us"], -1, r["stream"])]
    edges.sort(key=lambda x: (x[0], x[1]))
    busy: dict[str, int] = {}
    out, since = [], None
    for t, d, s in edges:
        busy[s] = busy.get(s, 0) + d
        n = sum(1 for c in busy.values() if c > 0)
        if n >= streams and since is None:
            since = t
        elif n < streams and since is not None:
            if t > since:
                out.append((since, t))
            since = None
    return out


def _nice_step(span: float, target: int = 10) -> float:
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _layout(records, title: str):
    recs = check_records(records)
    streams: list[str] = []
    for r in sorted(recs, key=lambda r: r["start_us"]):
        if r["stream"] not in streams:
            streams.append(r["stream"])
    if "main" in streams:
        streams.remove("main")
        streams.insert(0, "main")
    t0 = min(r["start_us"] for r in recs)
    t1 = max(r["end_us"] for r in recs)
    span = max(t1 - t0, 1e-3)
    step = _nice_step(span)
    t_end = math.ceil(span / step - 1e-9) * step
    plot_w = WIDTH - LEFT - RIGHT

    def X(t):
        return LEFT + (t - t0) / t_end * plot_w

    # sub-rows inside a stream only when its own ops overlap (should not happen on one stream)
    rows: dict[str, list[list[dict]]] = {s: [] for s in streams}
    for r in sorted(recs, key=lambda r: (r["start_us"], r["end_us"])):
        for sub in rows[r["stream"]]:
            if sub[-1]["end_us"] <= r["start_us"] + 1e-9:
                sub.append(r)
                break
        else:
            rows[r["stream"]].append([r])
    shapes: list = []
    y = TOP
    row_y = {}
    for s in streams:
        row_y[s] = y
        y += ROW_H * max(1, len(rows[s])) + GAP
    bottom = y
    ov = overlap_us(recs)
    ov_total = sum(b - a for a, b in ov)
    busy = {s: sum(b - a for a, b in _busy([r for r in recs if r["stream"] == s], 1)) for s in streams}
    height = bottom + 80
    shapes.append(Rect(0, 0, WIDTH, height, "#ffffff"))
    shapes.append(Text(LEFT, 22, title or "timeline", 15, bold=True))
    stat = (f"span {span:.1f} us; " + ", ".join(f"{s} busy {busy[s]:.1f} us" for s in streams)
            + f"; streams overlap {ov_total:.1f} us ({100 * ov_total / span:.0f}% of span)")
    shapes.append(Text(LEFT, 42, stat, 11, color="#444444"))
    # row backgrounds and names
    for i, s in enumerate(streams):
        h = ROW_H * max(1, len(rows[s]))
        shapes.append(Rect(LEFT, row_y[s], plot_w, h, "#f4f6f9" if i % 2 == 0 else "#fbfbfb", "#dddddd"))
        shapes.append(Text(LEFT - 10, row_y[s] + h / 2 + 4, f"stream {s}", 12, "end", bold=True))
    # grid and axis
    n_ticks = int(round(t_end / step))
    for k in range(n_ticks + 1):
        x = X(t0 + k * step)
        shapes.append(Rect(x, TOP - 4, 0.6, bottom - TOP - GAP + 8, "#e0e0e0"))
        shapes.append(Text(x, bottom + 12, f"{k * step:g}", 10, "middle", "#444444"))
    shapes.append(Rect(LEFT, bottom - GAP + 4, plot_w, 1, "#888888"))
    shapes.append(Text(LEFT + plot_w / 2, bottom + 28, f"time (us) since the first op started; t0 = {t0:g} us",
                       11, "middle", "#444444"))
    # overlap bands behind the bars
    for a, b in ov:
        shapes.append(Rect(X(a), TOP - 6, max(X(b) - X(a), 0.8), bottom - TOP - GAP + 10, EVENT_COLOR,
                           tip=f"streams overlap {a - t0:.1f}..{b - t0:.1f} us ({b - a:.1f} us)", opacity=0.13))
    # bars
    kinds: list[str] = []
    for s in streams:
        for j, sub in enumerate(rows[s]):
            yb = row_y[s] + j * ROW_H + (ROW_H - BAR_H) / 2
            for r in sub:
                if r["kind"] not in kinds:
                    kinds.append(r["kind"])
                fill, border = kind_color(r["kind"])
                x0, x1 = X(r["start_us"]), X(r["end_us"])
                w = max(x1 - x0, 1.5)
                d = r["end_us"] - r["start_us"]
                tip = (f"{r['op']} ({r['kind']}) on {s}: {r['start_us'] - t0:.2f}..{r['end_us'] - t0:.2f} us,"
                       f" {d:.2f} us")
                shapes.append(Rect(x0, yb, w, BAR_H, fill, border, tip))
                label = r["op"].rsplit("/", 1)[-1]
                if w > 6.2 * len(label) + 6:
                    shapes.append(Text(x0 + w / 2, yb + BAR_H / 2 + 4, label, 10, "middle"))
    # legend
    lx, ly = LEFT, bottom + 48
    for k in kinds:
        fill, border = kind_color(k)
        shapes.append(Rect(lx, ly, 14, 12, fill, border))
        shapes.append(Text(lx + 19, ly + 10, k, 11))
        lx += 34 + 7 * len(k)
    shapes.append(Rect(lx + 10, ly, 14, 12, EVENT_COLOR, opacity=0.25))
    shapes.append(Text(lx + 29, ly + 10, "2+ streams busy (overlap)", 11))
    return shapes, WIDTH, height


def _svg(shapes, width, height) -> str:
    e = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" '
           f'viewBox="0 0 {width} {height:.0f}" font-family="Helvetica, Arial, sans-serif">']
    for s in shapes:
        if isinstance(s, Rect):
            op = f' fill-opacity="{s.opacity}"' if s.opacity < 1 else ""
            st = f' stroke="{s.stroke}" stroke-width="0.8"' if s.stroke != "none" else ""
            body = f"<title>{e(s.tip)}</title>" if s.tip else ""
            out.append(f'<rect x="{s.x:.2f}" y="{s.y:.2f}" width="{s.w:.2f}" height="{s.h:.2f}" fill="{s.fill}"'
                       f'{op}{st}>{body}</rect>' if body else
                       f'<rect x="{s.x:.2f}" y="{s.y:.2f}" width="{s.w:.2f}" height="{s.h:.2f}" fill="{s.fill}"{op}{st}/>')
        else:
            w = ' font-weight="bold"' if s.bold else ""
            out.append(f'<text x="{s.x:.2f}" y="{s.y:.2f}" font-size="{s.size}" text-anchor="{s.anchor}" '
                       f'fill="{s.color}"{w}>{e(s.s)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def timeline_svg(records, title: str = "") -> str:
    return _svg(*_layout(records, title))


def _png_matplotlib(shapes, width, height, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        return False
    fig = plt.figure(figsize=(width / 100, height / 100), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    for s in shapes:
        if isinstance(s, Rect):
            ax.add_patch(Rectangle((s.x, s.y), s.w, s.h, facecolor=s.fill, alpha=s.opacity,
                                   edgecolor=None if s.stroke == "none" else s.stroke, linewidth=0.6))
        else:
            ax.text(s.x, s.y, s.s, fontsize=s.size * 0.75, ha={"start": "left", "middle": "center", "end": "right"}[s.anchor],
                    va="baseline", color=s.color, fontweight="bold" if s.bold else "normal")
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return True


def _blend(color: str, opacity: float) -> str:
    """Graphviz has no fill opacity for PNG boxes: mix the colour with white instead."""
    if opacity >= 1:
        return color
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    mix = [round(255 - (255 - c) * opacity) for c in (r, g, b)]
    return "#" + "".join(f"{c:02x}" for c in mix)


def _png_graphviz(shapes, width, height, path: Path, timeout: float = 60.0) -> bool:
    exe = find_dot()
    if exe is None:
        return False

    def q(s):
        return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'
    lines = ["graph timeline {", f'  graph [bb="0,0,{width},{height:.0f}", pad=0, dpi=110, bgcolor="#ffffff"];',
             '  node [fixedsize=true, label="", fontname="Helvetica"];']
    for i, s in enumerate(shapes):
        if isinstance(s, Rect):
            cx, cy = s.x + s.w / 2, height - (s.y + s.h / 2)
            pen = "0.6" if s.stroke != "none" else "0"
            fill = _blend(s.fill, s.opacity)
            lines.append(f'  r{i} [shape=box, style=filled, fillcolor="{fill}", color="{s.stroke if s.stroke != "none" else fill}",'
                         f' penwidth={pen}, width={max(s.w, 0.3) / 72:.4f}, height={max(s.h, 0.3) / 72:.4f},'
                         f' pos="{cx:.2f},{cy:.2f}!"];')
        else:
            # a fixed-width box with the text justified inside it, so no text-width guess moves it
            box = 0.75 * s.size * len(s.s) + 20
            cx = s.x + {"start": box / 2, "middle": 0, "end": -box / 2}[s.anchor]
            cy = height - s.y + s.size * 0.35
            just = {"start": "\\l", "middle": "", "end": "\\r"}[s.anchor]
            font = "Helvetica-Bold" if s.bold else "Helvetica"
            lines.append(f'  t{i} [shape=plaintext, label={q(s.s)[:-1]}{just}", fontsize={s.size}, fontcolor="{s.color}",'
                         f' fontname="{font}", width={box / 72:.4f}, height={s.size * 1.3 / 72:.4f}, margin=0,'
                         f' pos="{cx:.2f},{cy:.2f}!"];')
    lines.append("}")
    try:
        res = subprocess.run([exe, "-Kneato", "-n2", "-Tpng"], input="\n".join(lines).encode(),
                             capture_output=True, timeout=timeout, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return False
    if res.returncode != 0 or not res.stdout:
        return False
    path.write_bytes(res.stdout)
    return True


def render_timeline(records, path, title: str = "") -> Path:
    """Draw records to `path` (.svg, or .png). Returns the path written: for a .png with no
    PNG renderer available, the SVG next to it (the caller tells the user)."""
    path = Path(path)
    shapes, width, height = _layout(records, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() != ".png":
        path.write_text(_svg(shapes, width, height), encoding="utf-8")
        return path
    if _png_matplotlib(shapes, width, height, path) or _png_graphviz(shapes, width, height, path):
        return path
    svg = path.with_suffix(".svg")
    svg.write_text(_svg(shapes, width, height), encoding="utf-8")
    return svg
