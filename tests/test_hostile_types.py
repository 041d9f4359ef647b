"""Wrong types in every field the schema allows (tests/hostile/types/, written by make_types.py):
each is a located PlanError from load or compile (exit 2 from the command line), never a traceback."""

import json
import sys
from pathlib import Path

import pytest

from planner.errors import PlanError
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan
from tests.limits_util import run_planner

HERE = Path(__file__).resolve().parent / "hostile"
CASES = sorted((HERE / "types").glob("*.yaml"))


def test_corpus_matches_its_generator():
    sys.path.insert(0, str(HERE))
    from make_types import FIELDS, cases
    names = {f"{n}.yaml" for n, *_ in cases()}
    assert names == {p.name for p in CASES}, "run python tests/hostile/make_types.py"
    assert len(FIELDS) >= 40 and len(CASES) >= 300


def test_base_plan_is_valid():
    compile_plan(load_plan(HERE / "base.yaml"))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_wrong_type_is_a_located_error(path):
    with pytest.raises(PlanError) as ei:
        compile_plan(load_plan(path))
    d = ei.value.diagnostics[0]
    assert d.loc is not None and d.loc.line >= 1, d.format()
    assert d.loc.file.endswith(path.name) and d.message, d.format()


@pytest.mark.parametrize("case", ["params__tp_size__choices__0", "params__tp_size__min__1",
                                  "dims__num_tokens__buckets__0", "weights__w__dtype__4"])
def test_command_line_exits_2(case):
    out = run_planner(["validate", str(HERE / "types" / f"{case}.yaml")])
    assert out.rc == 2 and "Traceback" not in out.stderr, out.describe()
    assert f"{case}.yaml:" in out.stderr and "error[" in out.stderr, out.describe()


TUNING = {
    "not_object": [], "limits_list": {"limits": []}, "limit_float": {"limits": {"lim": 1.5}},
    "limit_str": {"limits": {"lim": "a"}}, "limit_bool": {"limits": {"lim": True}},
    "limit_negative": {"limits": {"lim": -1}}, "backend_int": {"backends": {"gemm:bf16:M=1,N=8,K=8": 7}},
    "backend_name_int": {"backends": {"gemm:bf16:M=1,N=8,K=8": {"backend": 7}}},
    "backend_config_list": {"backends": {"gemm:bf16:M=1,N=8,K=8": {"backend": "torch", "config": []}}},
    "measured_str": {"measured": {"x": "fast"}}, "measured_negative": {"measured": {"x": -1}},
}


@pytest.mark.parametrize("case", sorted(TUNING))
def test_tuning_file_entry_of_the_wrong_type(case, tmp_path):
    p = tmp_path / f"{case}.json"
    p.write_text(json.dumps(TUNING[case]))
    out = run_planner(["compile", str(HERE / "base.yaml"), "--tuning", str(p)])
    assert out.rc == 2 and "Traceback" not in out.stderr, out.describe()
    assert str(p) in out.stderr and "error[schema]" in out.stderr, out.describe()
