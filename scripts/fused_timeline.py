"""Per-block timeline of the fused KDA step kernel (diagnostics, needs an sm_90 GPU).

Replays a CUDA graph of 20 ``kda_fused_step`` calls with ``timeline`` configs (4 rotated
weight sets; even/odd steps stamp into two workspaces): every block stamps %globaltimer at start,
at its mid point (producers: before publishing f_a; consumers: when f_a is complete) and
at its end, plus its SM id. Prints, per (M, config), when the stream / producer /
consumer blocks of the last two steps start and end relative to the earlier step's first
block, the step period, and how many blocks started late (a second wave). Usage:
    python scripts/fused_timeline.py [--out DIR] [--precompile] [--cases 0,3,...]
        [--config '{"M": 16, "m_tile": 16, "tiles": 2, "warps_k": 8, "unroll": 4, "fb_tiles": 2}']
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import executors.cute as ec
from executors.cute.config import Config, fused_grid, fused_workspace_words

NP, NQ, NFB, NFA, H = 6288, 6144, 1536, 128, 7168
M_VALUES = (1, 8, 9, 14, 16)


def configs(extra: list[dict] = ()):
    """(M, config) cases: the fused defaults (with and without the prepacked weight) at M_VALUES,
    then each `extra` config dict (field names as in Config), all with the timeline switch on."""
    out = []
    for prepacked in (False, True):
        for m in M_VALUES:
            out.append((m, dataclasses.replace(ec.default_fused_config(m, NP, H, NFA, NQ, prepacked), timeline=True)))
    for d in extra:
        d = dict(d)
        m = d.pop("M")
        out.append((m, dataclasses.replace(Config.from_dict({"kind": "fused", **d}), timeline=True)))
    return out


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
    wks = [ec.tile_weights(w, cfg.weight_layout) for w in wps] if cfg.weight_layout else wps  # the layout cfg reads
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
    ap.add_argument("--cases", default="", help="comma-separated indices into the cases (default: all)")
    ap.add_argument("--config", action="append", default=[], type=json.loads,
                    help="an extra case: a JSON config dict with its M (repeatable)")
    args = ap.parse_args()
    pick = {int(i) for i in args.cases.split(",") if i.strip()}
    every = configs(args.config)
    if pick - set(range(len(every))):
        ap.error(f"--cases {sorted(pick - set(range(len(every))))}: there are {len(every)} cases (0..{len(every) - 1}):"
                 f" the fused defaults at M = {M_VALUES} without and with the prepacked weight, then --config ones")
    cases = [c for i, c in enumerate(every) if not pick or i in pick]
    if args.precompile:
        for _, cfg in cases:
            ec.get_fused_kernel(cfg, NP, H, NQ, NFB, NFA, arch="sm_90a")
        print(f"precompiled {len(cases)} timeline kernels into {ec.cache_dir()}")
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
