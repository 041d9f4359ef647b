#!/usr/bin/env python3
"""Write executors/cute/fp8_defaults.py from a `bench_fp8_gemm.py --sweep grid` record.

Per (shape, M bucket) of the record's sweep: the fastest correct config, kept where it beats the
shape heuristic (fp8.heuristic_fp8_config) by more than --margin (default 2 %) and where it runs
every M of its bucket; the rest stay on the heuristic. A row the current table already has stays
unless the sweep timed something faster than it by more than the margin (so a sweep around the
table's rows only changes the rows it clearly improves).

    python scripts/fp8_defaults_from_sweep.py results/data/fp8_gemm/<record>_fp8_gemm.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from executors.cute import fp8, fp8_defaults

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "executors" / "cute" / "fp8_defaults.py"
HEADER = '''"""Measured fp8 skinny-GEMM configs (pure Python): the fastest correct config per weight shape
and M bucket on an H200 (132 SMs), from `bench_fp8_gemm.py --sweep grid`.

Written by scripts/fp8_defaults_from_sweep.py from the record named in SOURCE (raw outputs under
results/data/fp8_gemm/); a row is kept only where the sweep's best beat the shape heuristic of
fp8_config.default_fp8_config by more than 2 %. Shapes not listed here, and other SM counts, use
the heuristic.
"""

from __future__ import annotations
'''


def rows_from(record: dict, margin: float, current: dict | None = None) -> tuple[dict, list[str]]:
    shapes = {r["shape"]: (r["N"], r["K"]) for r in record.get("rows", [])}
    table, notes = {}, []
    for name, buckets in sorted(record.get("sweep", {}).items()):
        if name not in shapes:
            notes.append(f"{name}: no table row in the record (shape unknown), skipped")
            continue
        n, k = shapes[name]
        for bucket, v in sorted(buckets.items(), key=lambda kv: int(kv[0])):
            mt = int(bucket)
            cfg = fp8.Fp8Config.from_dict(v["best"])
            heur = fp8.heuristic_fp8_config(mt, n, k).key()
            heur_us = v["all_us"].get(heur)
            lo = 1 if mt == 8 else 9
            bad = [m for m in range(lo, mt + 1) if cfg.check(m, n, k) is not None]
            if bad or cfg.m_tile != mt:
                notes.append(f"{name} M<={mt}: best {cfg.key()} cannot run M={bad[:1]}, skipped")
                continue
            have = (current or {}).get((n, k, mt))
            if have is not None:
                have_cfg = fp8.Fp8Config.from_dict(have)
                have_us = v["all_us"].get(have_cfg.key())
                if have_us is None or v["best_us"] >= have_us * (1 - margin):
                    table[(n, k, mt)] = (have_cfg.to_dict(), name, have_us, heur, heur_us)
                    notes.append(f"{name} M<={mt}: current row {have_cfg.key()} kept")
                    continue
            if heur_us is None or v["best_us"] < heur_us * (1 - margin):
                table[(n, k, mt)] = (cfg.to_dict(), name, v["best_us"], heur, heur_us)
            else:
                notes.append(f"{name} M<={mt}: best {cfg.key()} {v['best_us']:.2f} us within {margin:.0%}"
                             f" of the heuristic {heur} {heur_us:.2f} us: heuristic kept")
    for key, d in (current or {}).items():  # rows of shapes this record did not sweep
        table.setdefault(key, (d, "(not in this record)", None, None, None))
    return table, notes


def render(table: dict, source: str) -> str:
    lines = [HEADER, f"SOURCE = {source!r}", "SMS = 132", "# (N, K, m_tile) -> Fp8Config fields",
             "MEASURED: dict[tuple[int, int, int], dict] = {"]
    for (n, k, mt), (d, name, us, heur, heur_us) in sorted(table.items()):
        hu = f"{heur_us:.2f} us" if heur_us is not None else "not timed"
        lines.append(f"    # {name}: {us:.2f} us vs the heuristic {heur} {hu}" if us is not None else f"    # {name}")
        lines.append(f"    ({n}, {k}, {mt}): {json.dumps(d, sort_keys=True).replace('true', 'True').replace('false', 'False')},")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", help="the .json a --sweep grid run of bench_fp8_gemm.py wrote")
    ap.add_argument("--margin", type=float, default=0.02)
    ap.add_argument("--out", default=str(TARGET))
    ap.add_argument("--fresh", action="store_true", help="ignore the current table's rows")
    a = ap.parse_args()
    try:
        record = json.loads(Path(a.record).read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"cannot read {a.record}: {e}", file=sys.stderr)
        return 2
    if not record.get("sweep"):
        print(f"{a.record} has no sweep (run bench_fp8_gemm.py --sweep grid)", file=sys.stderr)
        return 2
    table, notes = rows_from(record, a.margin, {} if a.fresh else fp8_defaults.MEASURED)
    src = Path(a.record)
    src = str(src.resolve().relative_to(ROOT)) if src.resolve().is_relative_to(ROOT) else src.name
    if not a.fresh and fp8_defaults.SOURCE.startswith(src):
        src = fp8_defaults.SOURCE  # the same record again: its source line stays as it was
    elif not a.fresh and fp8_defaults.SOURCE:
        src = f"{src} (rows it did not improve: {fp8_defaults.SOURCE})"
    Path(a.out).write_text(render(table, src))
    for n in notes:
        print(n)
    print(f"{len(table)} measured rows written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
