#!/usr/bin/env python3
"""Row-strided bf16 add: torch.add vs the CuTe DSL kernel (executors.cute.elementwise).

The zero-copy SP tail writes 4 states add(h, r) into column slots of a packed
[rows, 4*7168] bf16 buffer (row stride 28672). Paths per row count (TP2 SP shapes: 512
rows for T = 1024, 2048 rows for T = 4096):
  torch_contig   torch.add(a, b, out=contiguous [rows, 7168])
  torch_strided  torch.add(a, b, out=slot of the packed buffer)
  cute_strided   strided_add(a, b, slot)
  cute_contig    strided_add(a, b, contiguous out)
  cat4           torch.cat of 4 contiguous [rows, 7168] into [rows, 28672] (what cat packing adds)
  zc_4           4 cute strided adds into the 4 slots (zero-copy producer step)
  cp_4           4 torch contiguous adds + cat4 (cat-packing producer step)
Correctness first: bit-exact vs torch.add into NaN-poisoned outputs, eagerly and from a
graph captured on a side stream. Timing: one CUDA graph of --iters calls per path,
--nsets input sets rotated (working set > L2), 2 warm-ups, median of --trials replays.
    python scripts/bench_strided_add.py --out /tmp/strided_add
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from executors.cute import elementwise as ew
from executors.tools.bench import env_info, log, md_table
from executors.tools.timing import time_graphs

ROOT = Path(__file__).resolve().parent.parent

H = 7168
NSTATE = 4


def _bits_equal(x, y):
    return torch.equal(x.contiguous().view(torch.int16), y.contiguous().view(torch.int16))


def check(rows: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(rows)
    res = {}
    a = torch.randn(rows, H, device="cuda", generator=g).to(torch.bfloat16)
    b = (torch.randn(rows, H, device="cuda", generator=g) * 7).to(torch.bfloat16)
    ref = torch.add(a, b)
    out = torch.full((rows, H), float("nan"), device="cuda", dtype=torch.bfloat16)
    ew.strided_add(a, b, out)
    res["contig_exact"] = _bits_equal(out, ref)
    packed = torch.full((rows, NSTATE * H), float("nan"), device="cuda", dtype=torch.bfloat16)
    for i in range(NSTATE):
        ew.strided_add(a, b, packed[:, i * H:(i + 1) * H])
    res["strided_exact"] = _bits_equal(packed, torch.cat([ref] * NSTATE, 1))
    packed.fill_(float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        for i in range(NSTATE):
            ew.strided_add(a, b, packed[:, i * H:(i + 1) * H])
    a.copy_(torch.randn(rows, H, device="cuda", generator=g).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    res["graph_side_stream_exact"] = _bits_equal(packed, torch.cat([torch.add(a, b)] * NSTATE, 1))
    return res


def time_graph(step, iters: int, trials: int, nsets: int) -> float:
    """us per call: one graph of `iters` calls of step(k) (k = input set), median over trials."""
    return time_graphs({"step": lambda i: step(i % nsets)}, iters=iters, trials=trials, warmup=1, nsets=nsets)["step"]


def bench(rows: int, iters: int, trials: int, nsets: int) -> dict:
    mk = lambda: torch.randn(rows, H, device="cuda").to(torch.bfloat16)  # noqa: E731
    A = [mk() for _ in range(nsets)]
    B = [mk() for _ in range(nsets)]
    C = [torch.empty(rows, H, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
    P = [torch.empty(rows, NSTATE * H, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
    S = [[P[k][:, i * H:(i + 1) * H] for i in range(NSTATE)] for k in range(nsets)]
    CS = [[torch.empty(rows, H, device="cuda", dtype=torch.bfloat16) for _ in range(NSTATE)] for _ in range(nsets)]
    paths = {
        "torch_contig": lambda k: torch.add(A[k], B[k], out=C[k]),
        "torch_strided": lambda k: torch.add(A[k], B[k], out=S[k][1]),
        "cute_strided": lambda k: ew.strided_add(A[k], B[k], S[k][1]),
        "cute_contig": lambda k: ew.strided_add(A[k], B[k], C[k]),
        "cat4": lambda k: torch.cat(CS[k], 1, out=P[k]),
    }

    def zc4(k):
        for i in range(NSTATE):
            ew.strided_add(A[(k + i) % nsets], B[(k + i) % nsets], S[k][i])

    def cp4(k):
        for i in range(NSTATE):
            torch.add(A[(k + i) % nsets], B[(k + i) % nsets], out=CS[k][i])
        torch.cat(CS[k], 1, out=P[k])

    def tz4(k):
        for i in range(NSTATE):
            torch.add(A[(k + i) % nsets], B[(k + i) % nsets], out=S[k][i])

    paths.update({"zc_4": zc4, "cp_4": cp4, "torch_zc_4": tz4})
    row = {"rows": rows, "T_tp2": 2 * rows}
    for name, fn in paths.items():
        row[name] = time_graph(fn, iters if not name.endswith("_4") else max(iters // 4, 5), trials, nsets)
    nbytes = 3 * rows * H * 2
    row["cute_strided_tbs"] = nbytes / row["cute_strided"] / 1e6
    row["torch_strided_over_cute"] = row["torch_strided"] / row["cute_strided"]
    row["cute_strided_over_torch_contig"] = row["cute_strided"] / row["torch_contig"]
    row["cp4_over_zc4"] = row["cp_4"] / row["zc_4"]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="512,2048")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--trials", type=int, default=9)
    ap.add_argument("--nsets", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows_list = [int(x) for x in args.rows.split(",")]
    meta = env_info()
    meta["config"] = {r: ew.add_config(H) for r in rows_list}
    ok = True
    checks = {}
    for r in rows_list + [1, 3, 4097]:
        c = check(r)
        checks[r] = c
        log(f"check rows={r}: {c}")
        ok &= all(c.values())
    if not ok:
        log("CORRECTNESS FAILED")
    results = [bench(r, args.iters, args.trials, args.nsets) for r in rows_list]
    cols = [("rows", "rows", "d"), ("T_tp2", "T (TP2)", "d"), ("torch_contig", "torch add contig", ".1f"),
            ("torch_strided", "torch add strided", ".1f"), ("cute_strided", "cute add strided", ".1f"),
            ("cute_contig", "cute add contig", ".1f"), ("cat4", "cat of 4", ".1f"),
            ("zc_4", "4 cute strided adds", ".1f"), ("torch_zc_4", "4 torch strided adds", ".1f"),
            ("cp_4", "4 torch adds + cat", ".1f"),
            ("torch_strided_over_cute", "torch strided / cute", ".2f"),
            ("cute_strided_over_torch_contig", "cute strided / torch contig", ".2f"),
            ("cp4_over_zc4", "(4 adds+cat) / 4 cute strided", ".2f"),
            ("cute_strided_tbs", "cute TB/s", ".2f")]
    table = md_table(results, cols)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_strided_add.json").write_text(json.dumps(
            {"meta": meta, "checks": {str(k): v for k, v in checks.items()}, "rows": results}, indent=1, default=str))
        (out / "bench_strided_add.md").write_text(f"meta: {json.dumps(meta, default=str)}\n\n{table}\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
