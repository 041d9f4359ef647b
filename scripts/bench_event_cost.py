#!/usr/bin/env python3
"""What one cross-stream dependency costs, eagerly and under CUDA-graph replay (the cost model's
DeviceProfile.event_us): a chain of K small kernels on one stream vs the same chain hopping
between two streams with an event record + wait at every hop, both in one run.

The kernels are in-place adds on a small tensor (about a microsecond each), so the chain is
launch- and dependency-bound: (hopping - one stream) / hops is the price of one edge between
streams. Correctness first: after every run the tensor must hold exactly K additions.

    python scripts/bench_event_cost.py [--k 64] [--trials 15] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch


def chain(x, k: int, hop: bool, streams, events):
    main, aux = streams
    cur = main
    for i in range(k):
        nxt = (aux if i % 2 else main) if hop else main
        if nxt is not cur:
            events[i].record(cur)
            nxt.wait_event(events[i])
            cur = nxt
        with torch.cuda.stream(cur):
            x.add_(1.0)
    if cur is not main:  # join back
        events[k].record(cur)
        main.wait_event(events[k])


def run(k: int, trials: int) -> dict:
    dev = torch.device("cuda")
    x = torch.zeros(4096, device=dev)
    res = {}
    for mode in ("eager", "graph"):
        for hop in (False, True):
            side = torch.cuda.Stream()
            cap = torch.cuda.Stream()
            events = [torch.cuda.Event() for _ in range(k + 1)]
            if mode == "graph":
                cap.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(cap):
                    chain(x, k, hop, (cap, side), events)  # warm-up
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=cap):
                    chain(x, k, hop, (cap, side), events)
                torch.cuda.synchronize()

                def once(g=g):
                    g.replay()
            else:
                main = torch.cuda.current_stream()

                def once(side=side, events=events, hop=hop, main=main):
                    chain(x, k, hop, (main, side), events)
            x.zero_()
            once()
            torch.cuda.synchronize()
            if float(x[0]) != k or not bool((x == k).all()):
                raise SystemExit(f"{mode} hop={hop}: tensor holds {float(x[0])} after one run, want {k}")
            times = []
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(trials):
                torch.cuda.synchronize()
                e0.record()
                for _ in range(10):
                    once()
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) * 1e3 / 10)
            res[(mode, hop)] = statistics.median(times)
    out = {}
    for mode in ("eager", "graph"):
        one, hopping = res[(mode, False)], res[(mode, True)]
        out[mode] = {"one_stream_us": round(one, 2), "hopping_us": round(hopping, 2),
                     "per_kernel_us": round(one / k, 3), "per_edge_us": round((hopping - one) / (k - 1), 3)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--out", help="write <date>_event_cost.{md,json} here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_event_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    r = run(a.k, a.trials)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "k": a.k, "trials": a.trials}
    lines = [f"# cross-stream dependency cost, {meta['device']}, {meta['date']}", "",
             f"chain of {a.k} in-place adds; one stream vs hopping streams at every kernel (event record + wait);"
             f" median of {a.trials} x 10 runs", "",
             "| mode | one stream us | hopping us | per kernel us | per cross-stream edge us |", "|---|---:|---:|---:|---:|"]
    for mode, v in r.items():
        lines.append(f"| {mode} | {v['one_stream_us']} | {v['hopping_us']} | {v['per_kernel_us']} | {v['per_edge_us']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        d = Path(a.out)
        d.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M")
        (d / f"{stamp}_event_cost.md").write_text(text)
        (d / f"{stamp}_event_cost.json").write_text(json.dumps({**meta, "results": r}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
