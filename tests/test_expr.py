import pytest

from planner.expr import ExprError, evaluate, fold, free_names, parse, unparse
from planner.predicates import Facts, GateSchema, check_gate, compile_gate, simplify_gate


@pytest.mark.parametrize("text", [
    "heads / tp_size", "ceil_div(num_tokens, tp_size)", "a and not b or c <= 3",
    "gemm(x, w[:qkvg], out_dtype=bf16)", "x[:, 0:128]", "[2, n // 2, n - 3]",
    "tuned.kda_max >= num_tokens", "[L for L in range(n) if L % 4 != 3]", "-(a + b) * c",
])
def test_parse_unparse_roundtrip(text):
    e = parse(text)
    assert parse(unparse(e)) == e


def test_precedence():
    assert evaluate(parse("1 + 2 * 3"), {}) == 7
    assert evaluate(parse("(1 + 2) * 3"), {}) == 9
    assert evaluate(parse("10 - 4 - 3"), {}) == 3
    assert evaluate(parse("2 < 3 and 3 < 2 or true"), {}) is True
    assert evaluate(parse("not 1 == 2"), {}) is True


def test_exact_division_and_floor():
    assert evaluate(parse("96 / 8"), {}) == 12
    with pytest.raises(ExprError, match="does not divide exactly"):
        evaluate(parse("96 / 7"), {})
    assert evaluate(parse("93 // 2"), {}) == 46
    with pytest.raises(ExprError, match="division by zero"):
        evaluate(parse("1 // 0"), {})


def test_comprehension_kda_layers():
    layers = evaluate(parse("[L for L in range(n) if (L + 1) % 4 != 0 and L + 1 != n]"), {"n": 93})
    assert len(layers) == 69 and layers[:4] == [0, 1, 2, 4] and 92 not in layers


@pytest.mark.parametrize("bad, pos", [
    ("__import__('os').system('x')", 16), ("a.__class__", 1), ("x[", 2), ("1 +", 3),
    ("f(a=1, b)", 7), ("a < b < c", 6), ("lambda: 0", 6), ("a; b", 1), ("`x`", 0),
])
def test_rejects_python_and_garbage(bad, pos):
    with pytest.raises(ExprError) as ei:
        parse(bad)
    assert ei.value.pos >= 0


def test_unknown_name_suggests():
    with pytest.raises(ExprError) as ei:
        evaluate(parse("tp_sise * 2"), {"tp_size": 8})
    assert ei.value.code == "name" and "tp_size" in ei.value.hint


def test_fold_keeps_dynamic_dims():
    d = fold(parse("ceil_div(num_tokens, tp_size) * tp_size"), {"tp_size": 8})
    assert unparse(d) == "ceil_div(num_tokens, 8) * 8"
    assert free_names(d) == {"num_tokens"}
    assert fold(parse("a * 1 + 0"), {}) == parse("a")


def test_limits():
    with pytest.raises(ExprError, match="limit|long"):
        parse("1+" * 3000 + "1")
    with pytest.raises(ExprError):
        parse("(" * 200 + "1" + ")" * 200)
    with pytest.raises(ExprError, match="too long"):
        evaluate(parse("range(10000000)"), {})


SCHEMA = GateSchema(params={"tp_size": 8, "mode": "fast"}, dims={"num_tokens"}, tuned={"max_m": 14},
                    tensors={"x"})


def test_gate_typecheck_and_compile():
    e = parse("capturing and tp_size == 8 and num_tokens <= tuned.max_m and contiguous(x) and dtype(x) == bf16")
    uses = check_gate(e, SCHEMA)
    assert {"capturing", "num_tokens", "contiguous"} <= uses
    s = simplify_gate(e, SCHEMA.params)
    assert "tp_size" not in unparse(s)

    class T:
        dtype = "torch.bfloat16"

        def __init__(self, c):
            self.c = c

        def is_contiguous(self):
            return self.c
    f = compile_gate(s)
    facts = Facts(dims={"num_tokens": 4}, capturing=True, tuned={"max_m": 14}, tensors={"x": T(True)})
    assert f(facts) is True
    facts.tensors["x"] = T(False)
    assert f(facts) is False
    facts.tensors["x"] = T(True)
    facts.dims["num_tokens"] = 15
    assert f(facts) is False


@pytest.mark.parametrize("gate, code, word", [
    ("num_tokns < 4", "name", "num_tokens"),
    ("tuned.nope > 1", "name", "tuned limit"),
    ("num_tokens + capturing", "type", "needs integers"),
    ("num_tokens", "type", "must be a boolean"),
    ("contiguous(y)", "name", "not a tensor"),
    ("mode == 3", "type", "cannot compare"),
    ("foo(x)", "name", "unknown function"),
])
def test_gate_errors(gate, code, word):
    with pytest.raises(ExprError) as ei:
        check_gate(parse(gate), SCHEMA)
    assert ei.value.code == code and word in ei.value.message + (ei.value.hint or "")


def test_static_gate_folds():
    assert simplify_gate(parse("tp_size == 4 and capturing"), {"tp_size": 8}) == parse("false")
    assert simplify_gate(parse("tp_size == 8 or capturing"), {"tp_size": 8}) == parse("true")
