#!/usr/bin/env python3
"""Write executors/cute/fp8_defaults.py from a `bench_fp8_gemm.py --sweep grid` record.

Per (shape, M bucket) of the record's sweep: the fastest correct config, kept where it beats the
shape heuristic (fp8.heuristic_fp8_config) by more than --margin (default 2 %) and where it runs
every M of its bucket; the rest stay on the heuristic. A row the current table already has stays
unless the sweep timed something faster than it by more than the margin (so a sweep around the
table's rows only changes the rows it clearly improves).

    python scripts/fp8_defaults_from_sweep.py results/data/fp8_gemm/<record>_fp8_gemm.json

A record swept with per-tensor scales (`--sweep-kinds tensor`) fills MEASURED_TENSOR instead,
against what per-tensor scales ran before (the MEASURED row, else the heuristic); the other table
is carried over unchanged.
"""

from __future__ import annotations

import argparse
import json
import re
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


def row_comments(text: str) -> dict:
    """(N, K, m_tile) -> the comment line above that row in a table's text (its provenance)."""
    out, last = {}, None
    for line in text.splitlines():
        t = line.strip()
        if t.startswith("# "):
            last = t[2:]
            continue
        m = re.match(r"\((\d+), (\d+), (\d+)\):", t)
        if m and last is not None:
            out[tuple(int(v) for v in m.groups())] = last
        last = None
    return out


def rows_from(record: dict, margin: float, current: dict | None = None,
              baseline=None, against: str = "the heuristic",
              comments: dict | None = None, source: str = "this record") -> tuple[dict, list[str]]:
    """baseline(m_tile, n, k) -> the config a row must beat (default: the shape heuristic),
    named `against` in the notes. A row carried over from `current` keeps its comment from
    `comments` (where it was measured); a current row the record measured slower than a config
    within the margin of `against` is dropped (the heuristic takes its place)."""
    comments = comments or {}
    dropped = set()
    baseline = baseline or (lambda mt, n, k: fp8.heuristic_fp8_config(mt, n, k))
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
            heur = baseline(mt, n, k).key()
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
                    note = f"{name}: {have_us:.2f} us in {source}" if have_us is not None else name
                    table[(n, k, mt)] = (have_cfg.to_dict(), comments.get((n, k, mt), note), None, None, None)
                    notes.append(f"{name} M<={mt}: current row {have_cfg.key()} kept")
                    continue
            label = name if have is None else f"{name} (replaces {have_cfg.key()}, {have_us:.2f} us in {source})"
            if heur_us is None or v["best_us"] < heur_us * (1 - margin):
                table[(n, k, mt)] = (cfg.to_dict(), label, v["best_us"], heur, heur_us)
            else:
                dropped.add((n, k, mt))
                notes.append(f"{name} M<={mt}: best {cfg.key()} {v['best_us']:.2f} us within {margin:.0%}"
                             f" of {against} {heur} {heur_us:.2f} us: {against} kept")
    for key, d in (current or {}).items():  # rows this record did not sweep (or could not replace)
        if key not in dropped:
            table.setdefault(key, (d, comments.get(key, "(not in this record)"), None, None, None))
    return table, notes


def _rows(table: dict, against: str) -> list[str]:
    lines = []
    for (n, k, mt), (d, name, us, heur, heur_us) in sorted(table.items()):
        hu = f"{heur_us:.2f} us" if heur_us is not None else "not timed"
        lines.append(f"    # {name}: {us:.2f} us vs {against} {heur} {hu}" if us is not None else f"    # {name}")
        lines.append(f"    ({n}, {k}, {mt}): {json.dumps(d, sort_keys=True).replace('true', 'True').replace('false', 'False')},")
    return lines


TENSOR_MARK = "# per-tensor scales on both operands"


def render_block(table: dict, source: str) -> str:
    lines = [HEADER, f"SOURCE = {source!r}", "SMS = 132", "# (N, K, m_tile) -> Fp8Config fields",
             "MEASURED: dict[tuple[int, int, int], dict] = {"]
    return "\n".join(lines + _rows(table, "the heuristic") + ["}"]) + "\n"


def render_tensor(table: dict, source: str) -> str:
    lines = [f"{TENSOR_MARK}: (N, K, m_tile) -> Fp8Config fields, where a sweep with them beat",
             "# the row above (MEASURED) by more than 2 %", f"SOURCE_TENSOR = {source!r}",
             "MEASURED_TENSOR: dict[tuple[int, int, int], dict] = {"]
    return "\n".join(lines + _rows(table, "the block-scale default") + ["}"]) + "\n"


def split_current(text: str) -> tuple[str, str]:
    """(the block-scale part, the per-tensor part) of the current table's text."""
    i = text.find(TENSOR_MARK)
    return (text, "") if i < 0 else (text[:i], text[i:])


def _source(src: str, old: str, fresh: bool) -> str:
    if fresh or not old:
        return src
    if old.startswith(src):
        return old  # the same record again: its source line stays as it was
    older = [p for p in dict.fromkeys(re.findall(r"[^\s(:;,]+\.json", old)) if p != src]
    return f"{src} (rows it did not improve: {', '.join(older)})" if older else src


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
    src = Path(a.record)
    src = str(src.resolve().relative_to(ROOT)) if src.resolve().is_relative_to(ROOT) else src.name
    block_text, tensor_text = split_current(TARGET.read_text())
    if record.get("sweep_kinds", "block") == "tensor":
        table, notes = rows_from(record, a.margin, {} if a.fresh else fp8_defaults.MEASURED_TENSOR,
                                 baseline=lambda mt, n, k: fp8.default_fp8_config(mt, n, k),
                                 against="the block-scale default", comments=row_comments(tensor_text),
                                 source=src)
        tensor_text = render_tensor(table, _source(src, fp8_defaults.SOURCE_TENSOR, a.fresh))
        what = "per-tensor"
    else:
        table, notes = rows_from(record, a.margin, {} if a.fresh else fp8_defaults.MEASURED,
                                 comments=row_comments(block_text), source=src)
        block_text = render_block(table, _source(src, fp8_defaults.SOURCE, a.fresh))
        what = "block-scale"
    Path(a.out).write_text(block_text.rstrip("\n") + "\n" + (tensor_text and "\n" + tensor_text))
    for n in notes:
        print(n)
    print(f"{len(table)} measured {what} rows written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
