"""rmsnorm / add_rmsnorm / silu_and_mul on the GPU: the backend `planner tune` picks vs torch.

For each op (hidden 7168; silu_and_mul takes [M, 2 * 7168]) and each M in the decode
(1, 2, 4, ..., 256) and prefill (2048, 8192) sizes:
  1. choose: executors.tools.tune_ops.time_op with the tuner's candidates (torch, and
     FlashInfer where its capability check passes). Every candidate is first checked on
     fresh random inputs against an fp32 reference with its output poisoned (NaN), then
     timed over CUDA-graph replays (iters steps per graph, `--sets` input sets rotated so L2
     does not flatter, median of trials in shuffled order). The choice is what tune records:
     the fastest correct candidate, torch on ties.
  2. confirm: a second, independent timing of torch and the chosen backend in one run
     (fresh inputs, new graphs); prints torch/chosen. The claim is chosen <= torch (ratio
     >= 1, 2% measurement slack); rows where it fails are marked SLOWER and the exit code is 1.

    python scripts/bench_norm_ops.py [--ms 1,2,4,...] [--iters 50 --trials 7 --sets 4] [-o out.json]

Writes JSON rows (op, M, choice, candidates us, confirm us, ratio) with the device, torch
and flashinfer versions and the date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

DECODE = [1, 2, 4, 8, 16, 32, 64, 128, 256]
PREFILL = [2048, 8192]


def op_and_specs(kind: str, m: int, hidden: int):
    from planner.ops_pointwise import AddRmsNorm, RmsNorm, SiluAndMul
    from planner.shapes import TensorSpec
    if kind == "rmsnorm":
        op = RmsNorm(op="rmsnorm", id="y", x="x", w="w", out=["y"])
        specs = [TensorSpec("x", (m, hidden), "bf16"), TensorSpec("w", (hidden,), "bf16")]
    elif kind == "add_rmsnorm":
        op = AddRmsNorm(op="add_rmsnorm", id="y", x="x", residual="r", w="w", out=["y", "r2"])
        specs = [TensorSpec("x", (m, hidden), "bf16"), TensorSpec("r", (m, hidden), "bf16"),
                 TensorSpec("w", (hidden,), "bf16")]
    else:
        op = SiluAndMul(op="silu_and_mul", id="y", x="x", out=["y"])
        specs = [TensorSpec("x", (m, 2 * hidden), "bf16")]
    return op, specs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default=",".join(map(str, DECODE + PREFILL)))
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--ops", default="rmsnorm,add_rmsnorm,silu_and_mul")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--sets", type=int, default=4)
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import importlib.util

    from executors.tools.tune_ops import op_candidates, time_op
    if importlib.util.find_spec("flashinfer") is None:  # then torch is the only candidate
        print("NOTE: flashinfer is not importable here: torch is the only candidate, every choice is torch"
              " (stage flashinfer to compare its kernels)", flush=True)
    rows, bad = [], 0
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    print(f"{'op':<14}{'M':>6}  {'choice':<12}{'candidates (us)':<40}{'torch us':>10}{'chosen us':>11}{'torch/chosen':>14}")
    for kind in args.ops.split(","):
        for m in (int(x) for x in args.ms.split(",")):
            op, specs = op_and_specs(kind, m, args.hidden)
            cands = op_candidates(op, specs, "cuda")
            first = time_op(op, specs, {}, cands, iters=args.iters, trials=args.trials, nsets=args.sets, log=log)
            ok = {b: us for b, us in first.items() if us is not None}
            if "torch" not in ok:
                print(f"{kind:<14}{m:>6}  torch failed its own correctness check: {first}")
                bad += 1
                continue
            choice = min(ok, key=lambda b: (ok[b], b != "torch"))
            again = time_op(op, specs, {}, sorted({"torch", choice}), iters=args.iters, trials=args.trials,
                            nsets=args.sets, log=log)
            ratio = again["torch"] / again[choice] if again.get(choice) else float("nan")
            slower = not ratio >= 0.98
            bad += slower
            cand_txt = ", ".join(f"{b} {'x' if us is None else f'{us:.2f}'}" for b, us in first.items())
            print(f"{kind:<14}{m:>6}  {choice:<12}{cand_txt:<40}{again['torch']:>10.2f}{again[choice]:>11.2f}"
                  f"{ratio:>13.3f}x" + ("  SLOWER" if slower else ""))
            rows.append({"op": kind, "M": m, "hidden": args.hidden, "choice": choice, "candidates_us": first,
                         "confirm_us": again, "torch_over_chosen": ratio, "slower": slower})
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    try:
        import flashinfer
        meta["flashinfer"] = flashinfer.__version__
    except Exception as exc:  # noqa: BLE001 - recorded, the run itself said which candidates ran
        meta["flashinfer"] = f"not importable ({type(exc).__name__})"
    if args.output:
        Path(args.output).write_text(json.dumps({**meta, "rows": rows}, indent=1))
    print(f"{meta}; {len(rows)} rows, {bad} where the chosen backend was slower than torch")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
