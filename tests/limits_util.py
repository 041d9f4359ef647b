"""Run `planner validate` (or any planner command) in a child process under a wall-clock timeout and
an address-space cap, and report its exit code, output, wall time and peak RSS."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["Outcome", "run_planner", "ROOT"]


@dataclass
class Outcome:
    rc: int | None          # None: killed at the timeout
    stdout: str
    stderr: str
    wall_s: float
    max_rss_mb: float
    cpu_s: float = 0.0      # user + system time of the child: what the work costs on a shared machine

    def describe(self) -> str:
        return (f"rc={self.rc} wall={self.wall_s:.2f}s cpu={self.cpu_s:.2f}s rss={self.max_rss_mb:.0f}MB\n"
                f"stdout: {self.stdout[-600:]}\nstderr: {self.stderr[-1500:]}")


def run_planner(args: list[str], timeout_s: float = 10.0, mem_mb: int = 1024, cwd: Path | None = None) -> Outcome:
    """`python -m planner ARGS` with RLIMIT_AS = mem_mb; killed (rc None) past timeout_s."""
    def cap():
        lim = mem_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    with tempfile.TemporaryDirectory() as d:
        rss_file = Path(d) / "rss"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "_RSS_FILE": str(rss_file)}
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, "-c", _WRAPPER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=cap, env=env, cwd=cwd or ROOT, text=True)
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return Outcome(None, out, err, time.monotonic() - t0, 0.0)
        wall = time.monotonic() - t0
        rss_kib, cpu = (rss_file.read_text().split() if rss_file.exists() else ("0", "0"))
    return Outcome(p.returncode, out, err, wall, float(rss_kib) / 1024, float(cpu))


# `python -m planner` that writes its own peak RSS (KiB) on the way out
_WRAPPER = """
import os, resource, runpy, sys
sys.argv = ["planner", *sys.argv[1:]]
try:
    runpy.run_module("planner", run_name="__main__", alter_sys=True)
finally:
    with open(os.environ["_RSS_FILE"], "w") as f:
        u = resource.getrusage(resource.RUSAGE_SELF)
        f.write(f"{u.ru_maxrss} {u.ru_utime + u.ru_stime}")
"""
