"""Resource checks before running: `planner run` refuses a plan that cannot fit (exit 2, with the
bytes and the device's free memory) before any rank allocates; build_executor checks the activations."""

import pytest

from executors import resources
from executors.errors import BuildError
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan
from tests.limits_util import run_planner

HUGE_INPUT = """plan: huge
params: {hidden: 1000000}
dims: {num_tokens: 1..64}
inputs: {x: "bf16[num_tokens * 400000, hidden]"}
outputs: [y]
ops:
  - y: copy(x)
"""
HUGE_WEIGHT = """plan: hugew
params: {hidden: 200000}
dims: {num_tokens: 1..64}
inputs: {x: "bf16[num_tokens, hidden]"}
weights: {w: "bf16[hidden, hidden]"}
outputs: [y]
ops:
  - y: gemm(x, w)
"""
SMALL = """plan: small
params: {hidden: 16}
dims: {num_tokens: 1..N}
inputs: {x: "fp32[num_tokens, hidden]"}
weights: {w: "fp32[hidden, hidden]"}
outputs: [y]
ops:
  - t: gemm(x, w)
  - y: add(t, x)
"""


@pytest.mark.parametrize("text, what", [(HUGE_INPUT, "input 'x'"), (HUGE_WEIGHT, "weight 'w'")])
def test_run_refuses_what_cannot_fit(tmp_path, text, what):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    out = run_planner(["run", str(p), "--check", "--world-size", "1"], timeout_s=60, mem_mb=4096)
    assert out.rc == 2 and "Traceback" not in out.stderr, out.describe()
    assert "error[limit]" in out.stderr and "free" in out.stderr and what in out.stderr, out.describe()
    assert "p.yaml:" in out.stderr.split("error[limit]")[0], out.describe()  # located at the declaration


def test_need_bytes_counts_inputs_weights_and_activations(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(SMALL.replace("N", "64"))
    cp = compile_plan(load_plan(p))
    need = resources.need_bytes(cp, {"num_tokens": 10})
    assert need["inputs"] == 10 * 16 * 4 and need["weights"] == 16 * 16 * 4
    assert need["activations"] == 2 * 10 * 16 * 4  # t and y live together at the add
    assert need["total"] == need["inputs"] + need["weights"] + need["activations"]


def test_build_executor_refuses_activations_beyond_free_memory(tmp_path, monkeypatch):
    import torch

    from executors.lowering import build_executor
    p = tmp_path / "s.yaml"
    p.write_text(SMALL.replace("N", "1000000"))
    w = {"w": torch.zeros(16, 16)}
    monkeypatch.setattr(resources, "_cpu_free", lambda: 10 * 1024 * 1024)  # a 10 MB device
    with pytest.raises(BuildError, match=r"needs 122\.1 MB of activations .* but cpu has 10\.0 MB free"):
        build_executor(compile_plan(load_plan(p)), w, device="cpu")
    build_executor(compile_plan(load_plan(p)), w, device="cpu", check_memory=False)
    p.write_text(SMALL.replace("N", "1000"))
    build_executor(compile_plan(load_plan(p)), w, device="cpu")


def test_cpu_free_memory_respects_the_address_space_limit():
    assert resources.free_bytes("cpu") > 0
    assert resources.fmt_bytes(52 * 1024**4) == "52.0 TB"
