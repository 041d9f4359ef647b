"""Dump the SASS of every default CuTe kernel and compare it with a reference dump.

Compiles for sm_90a on the CPU (no GPU needed; nvdisasm from the dev extra) every distinct
default config of the KDA shapes: the GEMM defaults (default_config, M = 1..16) and the fused
step defaults (default_fused_config, M = 1..16, f_a column unknown / tile-aligned / not aligned,
with and without the prepacked weight). File names say the shape and the M values that map to
the kernel, not the config's key, so a renamed setting keeps the file name.

    python scripts/check_sass_identical.py dump DIR             # write DIR/*.sass
    python scripts/check_sass_identical.py check DIR [--ref R]  # dump to DIR, diff against R

Exit status 1 when a kernel's SASS differs or a file is missing on either side.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

import executors.cute as ec

NP, NQ, NFB, NFA, K = 6288, 6144, 1536, 128, 7168
GEMM_SHAPES = {"fa_beta": (144, K), "fb": (NFB, NFA), "qkvg": (NQ, K), "packed": (NP, K)}
ALL_M = range(1, 17)


def gemm_kernels() -> dict[str, tuple]:
    """name -> (config, n, k) of every distinct GEMM default."""
    by_cfg: dict[tuple, list[int]] = {}
    names: dict[tuple, str] = {}
    for shape, (n, k) in GEMM_SHAPES.items():
        for m in ALL_M:
            key = (ec.default_config(m, n, k), n, k)
            by_cfg.setdefault(key, []).append(m)
            names.setdefault(key, shape)
    return {f"gemm_{names[key]}_m{ms[0]}-{ms[-1]}": key for key, ms in by_cfg.items()}


def fused_kernels() -> dict[str, tuple]:
    """name -> (config, a0) of every distinct fused default (a0: the f_a column compiled in)."""
    by_cfg: dict[tuple, list[tuple]] = {}
    for label, a0 in (("nofa", None), ("aligned", NQ), ("unaligned", NQ - 8)):
        for swap in (False, True):
            for m in ALL_M:
                cfg = ec.default_fused_config(m, NP, K, NFA, a0, swap)
                # a0 unknown: the caller's f_a column is compiled in, NQ as in the plans
                by_cfg.setdefault((cfg, NQ if a0 is None else a0), []).append((label, swap, m))
    out = {}
    for key, uses in by_cfg.items():
        label, swap, m = uses[0]
        out[f"fused_{label}{'_prepacked' if swap else ''}_m{m}-{uses[-1][2]}_a{key[1]}"] = key
    return out


def dump(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    names = []
    for name, (cfg, n, k) in gemm_kernels().items():
        (folder / f"{name}.sass").write_text(ec.compile_for_arch(cfg, n, k, sass=True))
        names.append(name)
        print(name, flush=True)
    for name, (cfg, a0) in fused_kernels().items():
        sass = ec.compile_fused_for_arch(cfg, NP, K, a0, NFB, NFA, sass=True)
        (folder / f"{name}.sass").write_text(sass)
        names.append(name)
        print(name, flush=True)
    return names


def compare(folder: Path, ref: Path) -> int:
    mine = {p.name for p in folder.glob("*.sass")}
    theirs = {p.name for p in ref.glob("*.sass")}
    bad = 0
    for name in sorted(mine ^ theirs):
        print(f"only in {'new' if name in mine else 'reference'}: {name}")
        bad += 1
    for name in sorted(mine & theirs):
        a, b = (ref / name).read_text(), (folder / name).read_text()
        if a != b:
            bad += 1
            diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "reference", "new", lineterm=""))
            print(f"DIFFERS: {name} ({len(diff)} diff lines)")
            print("\n".join(diff[:40]))
        else:
            print(f"identical: {name}")
    print(f"{len(mine & theirs) - (bad - len(mine ^ theirs))} of {len(mine | theirs)} kernels identical")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("dump", "check"))
    ap.add_argument("folder", type=Path)
    ap.add_argument("--ref", type=Path, default=Path("sass_reference"),
                    help="reference folder (check mode)")
    args = ap.parse_args(argv)
    if not ec.importable() or ec.nvdisasm_path() is None:
        print("needs nvidia-cutlass-dsl and nvdisasm (dev extra)", file=sys.stderr)
        return 2
    dump(args.folder)
    return compare(args.folder, args.ref) if args.mode == "check" else 0


if __name__ == "__main__":
    sys.exit(main())
