"""Turn a torch.profiler Chrome trace into timeline records and draw them.

Kernels ("cat": "kernel") are grouped by CUDA stream; --first N keeps the first N
graph replays (a replay starts at a kernel on the first stream after a gap). Stream
ids are renamed main/aux by first appearance (the stream that launches first is the
caller's).

    python scripts/trace_to_timeline.py TRACE.json -o out.png [--first 2] [--title T]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.viz.timeline import render_timeline  # noqa: E402


def records(trace: dict, first: int | None = None, gap_us: float = 20.0) -> list[dict]:
    ks = sorted((e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    if not ks:
        return []
    names = {}
    for e in ks:
        sid = e.get("args", {}).get("stream", e.get("tid"))
        names.setdefault(sid, "main" if not names else ("aux" if len(names) == 1 else f"aux{len(names)}"))
    # split into replays at idle gaps longer than gap_us on all streams together
    groups, cur, end = [], [], None
    for e in ks:
        if end is not None and e["ts"] - end > gap_us:
            groups.append(cur)
            cur = []
        cur.append(e)
        end = max(end or 0.0, e["ts"] + e["dur"])
    groups.append(cur)
    keep = [e for g in groups[: first or len(groups)] for e in g]
    t0 = keep[0]["ts"]
    out = []
    for e in keep:
        sid = e.get("args", {}).get("stream", e.get("tid"))
        name = e["name"]
        short = name.split("(")[0].split("<")[0].replace("void ", "")[-40:]
        out.append({"stream": names[sid], "op": short, "kind": "gemm" if "gemm" in name.lower() or "nvjet" in name
                    or "kernel_cutlass" in name or "mma" in name.lower() else "kernel",
                    "start_us": e["ts"] - t0, "end_us": e["ts"] - t0 + e["dur"]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--first", type=int, default=2, help="graph replays to draw (default 2)")
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    recs = records(json.loads(Path(args.trace).read_text()), args.first)
    if not recs:
        print("no kernel events in the trace", file=sys.stderr)
        return 1
    path = render_timeline(recs, args.output, args.title or f"{Path(args.trace).name}: kernels per stream")
    print(f"wrote {path}: {len(recs)} kernels on {sorted({r['stream'] for r in recs})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
