"""Per-block timeline of the fused KDA step kernel (diagnostics, needs an sm_90 GPU).

Replays a CUDA graph of 20 ``kda_fused_step`` calls with ``dbg=1`` configs (4 rotated
weight sets; even/odd steps stamp into two workspaces): every block stamps %globaltimer at start,
at its mid point (producers: before publishing f_a; consumers: when f_a is complete) and
at its end, plus its SM id. Prints, per (M, config), when the stream / producer /
consumer blocks of the last two steps start and end relative to the earlier step's first
block, the step period, and how many blocks started late (a second wave). Usage:
    python scripts/fused_timeline.py [--out DIR] [--precompile] [--cases 0,3,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import executors.cute as ec  # noqa: E402
from executors.cute.config import Config, fused_grid, fused_workspace_words  # noqa: E402

NP, NQ, NFB, NFA, H = 6288, 6144, 1536, 128, 7168
BASE = dict(kind="fused", tiles=2, warps_k=8, unroll=4, fb_tiles=2, dbg=1)
CASES = [  # (M, extra config fields)
    (1, dict(m_tile=8, ppf=1)), (8, dict(m_tile=8, ppf=1)),
    (1, dict(m_tile=8, tiles=1, warps_n=2, fb_tiles=1, ppf=1)),
    (8, dict(m_tile=8, tiles=1, warps_n=2, fb_tiles=1, ppf=1)),
    (8, dict(m_tile=8, tiles=1, warps_n=2, fb_tiles=1)),
    (16, dict(m_tile=16)), (16, dict(m_tile=16, tiles=2, warps_n=2, warps_k=4)),
    # run23: consumers spin on tagged f_a pairs instead of a counter
    (1, dict(m_tile=8, ppf=1, tag=1)), (8, dict(m_tile=8, ppf=1, tag=1)), (16, dict(m_tile=16, tag=1)),
    # run31 (session 5): K interleave (ki) at m_tile 8; why m_tile 16 has a long consumer tail
    (8, dict(m_tile=8, ppf=1, tag=1, ki=1)), (16, dict(m_tile=16, ppf=1, tag=1)),
    (16, dict(m_tile=16, ppf=1, tag=1, ki=1)), (12, dict(m_tile=16, ppf=1, tag=1, ki=1)),
    (16, dict(m_tile=16, ppf=1, tag=1, fb_passes=4)),
    # run32 timed cases 7, 8, 11 and those two with the epoch from fire-and-forget arrivals,
    # which then replaced the counted last arrival (tag = 1 is that scheme from then on)
    # session 6: the defaults with the producers' W_FB prefetch (fbpf) at M = 8 and 16, and the
    # two-pass consumers at M = 9, 12 (why the m_tile-16 step grows 1.4 us from M = 9 to 16)
    (8, dict(m_tile=8, ppf=1, tag=1, ki=1, fbpf=3, minb=3)),
    (9, dict(m_tile=16, ppf=1, tag=1, ki=1, fb_passes=2)),
    (12, dict(m_tile=16, ppf=1, tag=1, ki=1, fb_passes=2)),
    (16, dict(m_tile=16, ppf=1, tag=1, ki=1, fbpf=2, minb=3)),
    (9, dict(m_tile=16, ppf=1, tag=1, ki=1)),
    # session 7: the swapped-role defaults (weights prepacked, wl = 2) at M = 8 (m_tile 8) and
    # m_tile 16 at M = 8, 9, 16 (where do the 1.1-1.9 us between the two go?), and M = 9 with the
    # W_FB prefetch
    (8, dict(m_tile=8, ppf=1, tag=1, ki=1, fbpf=3, minb=3, swap=1, wl=2)),
    (8, dict(m_tile=16, ppf=1, tag=1, ki=1, swap=1, wl=2)),
    (9, dict(m_tile=16, ppf=1, tag=1, ki=1, swap=1, wl=2)),
    (16, dict(m_tile=16, ppf=1, tag=1, ki=1, swap=1, wl=2)),
    (9, dict(m_tile=16, ppf=1, tag=1, ki=1, fbpf=3, minb=3, swap=1, wl=2)),
    # run51: the m_tile-16 default with minb 3 (run50: 0.3-1.1 us faster than without)
    (9, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2)),
    (16, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2)),
    # run55: the same at M = 14 (with the last-ending blocks printed for 25-27)
    (14, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2)),
    # session 8 (run60): the defaults with g1 stored in pairs (gst) at M = 16, 14 (run60 also timed
    # the producers' tagged pairs stored before out, knob tf at commit 69e9694, as case 30)
    (16, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2, gst=1)),
    (14, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2, gst=1)),
    # session 9 (run63): the m_tile-16 default (pwu 3) at M = 16 and 14; run63 timed them with
    # the consumers' dry pass over their F_B code (knob iw, code at commit 7bee194, removed) as
    # cases 31 and 33: is the tail after "f_a seen" instruction fetch? (no: it stays 1-2.4 us)
    (16, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2, gst=1, pwu=3)),
    (14, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2, gst=1, pwu=3)),
    # run64: 4 warps per block (half the loads in flight per block, 417 blocks at 6/SM) at M = 16, 8:
    # period 35 / 34 us against 21 / 20 for the defaults, 42 blocks starting up to 20 us late
    (16, dict(m_tile=16, warps_k=4, ppf=1, tag=1, ki=1, minb=6, swap=1, wl=2, gst=1, pwu=3)),
    (8, dict(m_tile=8, ppf=1, tag=1, ki=1, fbpf=3, minb=3, swap=1, wl=2, gst=1)),
    (8, dict(m_tile=8, warps_k=4, ppf=1, tag=1, ki=1, fbpf=3, minb=6, swap=1, wl=2, gst=1)),
    # run65: where the m_tile-16 consumers' 1-1.4 us after "f_a seen" go: their mid stamp after the
    # last mma (dbg 2) or after the g1 stores are issued (dbg 3), at M = 16 and (m_tile 8) at 8
    (16, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2, gst=1, pwu=3, dbg=2)),
    (16, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2, gst=1, pwu=3, dbg=3)),
    (8, dict(m_tile=8, ppf=1, tag=1, ki=1, fbpf=3, minb=3, swap=1, wl=2, gst=1, dbg=2)),
    (8, dict(m_tile=8, ppf=1, tag=1, ki=1, fbpf=3, minb=3, swap=1, wl=2, gst=1, dbg=3)),
    # run66: the m_tile-16 default at M = 16 with the mid stamp when the second polling warp is done
    # (dbg 4) and after the barrier once a shared load after it returned (dbg 5)
    (16, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2, gst=1, pwu=3, dbg=4)),
    (16, dict(m_tile=16, ppf=1, tag=1, ki=1, minb=3, swap=1, wl=2, gst=1, pwu=3, dbg=5)),
]


def configs():
    return [(m, Config(**{**BASE, **extra})) for m, extra in CASES]


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))] if v else float("nan")


def _summary(m, cfg, rec, z):
    t_all, t0, p, c = fused_grid(cfg, NP, NQ, NFA, NFB)
    us = [[(r[0] - z) / 1e3, (r[1] - z) / 1e3 if r[1] else None, (r[2] - z) / 1e3, r[3]] for r in rec]

    def role(b):  # block index -> role, as build_fused maps it
        return "producer" if b < p else ("stream" if b < t_all else "consumer")

    roles = {"producer": [], "stream": [], "consumer": []}
    for b, r in enumerate(us):
        roles[role(b)].append(r)
    summ = {"M": m, "config": cfg.key(), "grid": len(rec),
            "start_min": round(min(r[0] for r in us), 2), "end_max": round(max(r[2] for r in us), 2),
            "late_starts_gt_1us": sum(1 for r in us if r[0] > min(q[0] for q in us) + 1.0),
            "blocks_per_sm_max": max(sum(1 for r in us if r[3] == s) for s in {r[3] for r in us})}
    for name, rs in roles.items():
        if not rs:
            continue
        summ[name] = {"n": len(rs), "start_max": round(max(r[0] for r in rs), 2),
                      "end_p10": round(pct([r[2] for r in rs], 0.1), 2),
                      "end_p50": round(pct([r[2] for r in rs], 0.5), 2),
                      "end_max": round(max(r[2] for r in rs), 2)}
        mids = [r[1] for r in rs if r[1] is not None]
        if mids:
            summ[name]["mid_max"] = round(max(mids), 2)
    return summ, us


def run(m, cfg, steps=20):
    """Capture `steps` fused steps (4 rotated weight sets) in a CUDA graph, replay it, and
    return the stamps of the last two steps (even/odd steps use two workspaces), with times
    relative to the earlier step's first block start."""
    import torch

    t_all, t0, p, c = fused_grid(cfg, NP, NQ, NFA, NFB)
    grid = t_all + c
    x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
    wps = [torch.randn(NP, H, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(4)]
    wks = [ec.tile_weights(w, cfg.wl) for w in wps] if cfg.wl else wps  # the layout cfg reads
    wfb = torch.randn(NFB, NFA, device="cuda", dtype=torch.bfloat16) * 0.05
    out = torch.empty(m, NP, device="cuda", dtype=torch.bfloat16)
    g1 = torch.empty(m, NFB, device="cuda", dtype=torch.bfloat16)
    words = fused_workspace_words(cfg, NP, NQ, NFA, NFB)
    wss = [torch.zeros(words, dtype=torch.int32, device="cuda") for _ in range(2)]

    def body():
        for i in range(steps):
            ec.kda_fused_step(x, wks[i % 4], wfb, out, g1, fa_col=NQ, config=cfg, workspace=wss[i % 2])

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()  # compile / load outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            body()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ref = x.float() @ wps[(steps - 1) % 4].float().t()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    recs = [w[4:4 + 8 * grid].view(torch.int64).view(grid, 4).cpu().tolist() for w in wss]
    last = (steps - 1) % 2
    prev, cur = recs[1 - last], recs[last]
    z = min(r[0] for r in prev)
    sp, _ = _summary(m, cfg, prev, z)
    sc, us = _summary(m, cfg, cur, z)
    summ = {"M": m, "config": cfg.key(), "rel_err": err,
            "step_period_us": round(sc["end_max"] - sp["end_max"], 2),
            "gap_prev_end_to_start_us": round(sc["start_min"] - sp["end_max"], 2),
            "prev": sp, "cur": sc, "last_blocks": _last_blocks(us, t_all, p)}
    return summ, us


def _last_blocks(us, t_all, p, n=6):
    """The n blocks of a step that end last: (block, role, start, mid, end, SM, [ends of the
    other blocks of that step on the same SM]), to tell a straggler from a crowded SM."""
    out = []
    for b in sorted(range(len(us)), key=lambda i: -us[i][2])[:n]:
        st, mid, end, sm = us[b]
        role = "producer" if b < p else ("stream" if b < t_all else "consumer")
        peers = sorted(round(r[2], 2) for i, r in enumerate(us) if r[3] == sm and i != b)
        out.append([b, role, round(st, 2), round(mid, 2) if mid is not None else None, round(end, 2), sm, peers])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/fused_timeline"))
    ap.add_argument("--precompile", action="store_true", help="compile for sm_90a only (no GPU)")
    ap.add_argument("--cases", default="", help="comma-separated indices into CASES (default: all)")
    args = ap.parse_args()
    pick = {int(i) for i in args.cases.split(",") if i.strip()}
    cases = [c for i, c in enumerate(configs()) if not pick or i in pick]
    if args.precompile:
        for _, cfg in cases:
            ec.get_fused_kernel(cfg, NP, H, NQ, NFB, NFA, arch="sm_90a")
        print(f"precompiled {len(cases)} dbg kernels into {ec.cache_dir()}")
        return
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = []
    for m, cfg in cases:
        summ, us = run(m, cfg)
        res.append({"summary": summ, "blocks": us})
        print(json.dumps(summ), flush=True)
    (out / "fused_timeline.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "cases": res}))


if __name__ == "__main__":
    main()
