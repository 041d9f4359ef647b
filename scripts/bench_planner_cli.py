"""Start-up cost of the planner CLI: validate, compile and viz of plans/k3_tp8.yaml against a bare
`python -c "import yaml, pydantic, networkx"`, all measured in this run.

Checks (exit 1 when one fails):
  - `python -X importtime -m planner compile plans/k3_tp8.yaml` imports no torch module;
  - validate, compile and viz each take under LIMIT x the bare import (median wall clock of
    --repeats runs, the commands interleaved so machine load hits them alike).
Prints one table row per command: median, min, max wall seconds, the ratio to the bare import,
and the median CPU seconds (user + system) with its ratio: on a shared machine the wall clock
also measures the other jobs, the CPU time does not.

    python scripts/bench_planner_cli.py [--repeats 7] [--plan plans/k3_tp8.yaml]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 3.0


def commands(plan: str, out_dir: str) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "import yaml, pydantic, networkx": [py, "-c", "import yaml, pydantic, networkx"],
        "planner validate": [py, "-m", "planner", "validate", plan],
        "planner compile": [py, "-m", "planner", "compile", plan],
        "planner viz": [py, "-m", "planner", "viz", plan, "-o", str(Path(out_dir) / "plan.dot")],
    }


def torch_imports(plan: str) -> list[str]:
    """Modules named torch or torch.* in the -X importtime log of `planner compile`."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "planner", "compile", plan],
                       capture_output=True, text=True, cwd=ROOT, check=True)
    mods = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    return [m for m in mods if m == "torch" or m.startswith("torch.")]


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run."""
    c0 = os.times()
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    c1 = os.times()
    return wall, (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="plans/k3_tp8.yaml")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    ok = True
    torch_mods = torch_imports(args.plan)
    print(f"python -X importtime -m planner compile {args.plan}: "
          + (f"imports torch ({', '.join(torch_mods[:3])} ...): FAIL" if torch_mods else "no torch import"))
    ok &= not torch_mods
    with tempfile.TemporaryDirectory() as d:
        cmds = commands(args.plan, d)
        for cmd in cmds.values():  # warm the OS file cache and .pyc files once
            timed(cmd)
        times: dict[str, list[float]] = {name: [] for name in cmds}
        cpu: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(args.repeats):
            for name, cmd in cmds.items():
                w, c = timed(cmd)
                times[name].append(w)
                cpu[name].append(c)
    base = statistics.median(times["import yaml, pydantic, networkx"])
    cbase = statistics.median(cpu["import yaml, pydantic, networkx"])
    print(f"\n{'command':<34} {'median s':>9} {'min s':>7} {'max s':>7} {'ratio':>6}  {'':<4} "
          f"{'cpu s':>6} {'ratio':>6}  (limit {LIMIT:g}x on the wall-clock median)")
    for name, ts in times.items():
        med = statistics.median(ts)
        ratio = med / base
        c = statistics.median(cpu[name])
        verdict = ""
        if name.startswith("planner"):
            verdict = "ok" if ratio < LIMIT else "FAIL"
            ok &= ratio < LIMIT
        print(f"{name:<34} {med:>9.3f} {min(ts):>7.3f} {max(ts):>7.3f} {ratio:>6.2f}  {verdict:<4} "
              f"{c:>6.3f} {c / cbase:>6.2f}")
    load = os.getloadavg()
    print(f"\n{args.repeats} interleaved runs each, {sys.executable}, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    print("result:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
