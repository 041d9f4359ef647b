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

from planner.viz.profiler_trace import records
from planner.viz.timeline import render_timeline


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
