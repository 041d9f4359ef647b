"""torch.profiler Chrome traces -> timeline records (kernels per CUDA stream).

Used by `planner run --timeline` on a GPU (graph replays under the profiler) and by
scripts/trace_to_timeline.py. Streams are named main/aux by first appearance: the stream
that launches first is the caller's.
"""

from __future__ import annotations

__all__ = ["records"]


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
