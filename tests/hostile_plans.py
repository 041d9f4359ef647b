"""Generated hostile plans: each asks the loader for unbounded work (time or memory).

HOSTILE maps a case name to a function(dir) -> path of the plan it writes. Every case must end in
exit 0 or 2 within a few seconds and a few hundred MB (tests/test_limits.py), never a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

HEAD = "plan: hostile\ndims: {num_tokens: 1..64}\ninputs: {x: 'bf16[num_tokens, 8]'}\noutputs: [x]\n"


def _write(d: Path, name: str, text: str) -> Path:
    p = d / f"{name}.yaml"
    p.write_text(text)
    return p


def blocks_deep(d, levels=24):
    # b0 calls b1 twice, b1 calls b2 twice, ...: 2**levels ops if inlined naively
    lines = [HEAD, "blocks:"]
    for i in range(levels):
        body = ("      - y: copy(a)" if i == levels - 1
                else f"      - t: b{i + 1}(a)\n      - y: b{i + 1}(t)")
        lines.append(f"  b{i}:\n    args: [a]\n    outputs: [y]\n    ops:\n{body}")
    lines.append("ops:\n  - z: b0(x)")
    return _write(d, "blocks_deep", "\n".join(lines) + "\n")


def blocks_wide(d):
    # shallow but wide: each block calls the next 12 times (12**5 ops)
    lines = [HEAD, "blocks:"]
    for i in range(6):
        if i == 5:
            body = "      - y: copy(a)"
        else:
            body = "\n".join(f"      - t{k}: b{i + 1}(a)" for k in range(12)) + "\n      - y: copy(t0)"
        lines.append(f"  b{i}:\n    args: [a]\n    outputs: [y]\n    ops:\n{body}")
    lines.append("ops:\n  - z: b0(x)")
    return _write(d, "blocks_wide", "\n".join(lines) + "\n")


def params_reverse(d, n=20_000):
    # each param names the next one: evaluating in file order needs n passes (quadratic)
    lines = ["plan: hostile", "params:"] + [f"  p{i}: 'p{i + 1} + 1'" for i in range(n)] + [f"  p{n}: 1"]
    return _write(d, "params_reverse", "\n".join(lines) + "\n" + HEAD.split("\n", 1)[1])


def params_many(d, n=60_000):
    lines = ["plan: hostile", "params:"] + [f"  p{i}: {i}" for i in range(n)]
    return _write(d, "params_many", "\n".join(lines) + "\n" + HEAD.split("\n", 1)[1])


def _param(d, name, expr):
    return _write(d, name, f"plan: hostile\nparams:\n  n: {expr!r}\n" + HEAD.split("\n", 1)[1])


def comprehension_1e12(d):
    return _param(d, "comprehension_1e12", "[[y for y in range(1000000)] for x in range(1000000)]")


def comprehension_flat_1e12(d):
    return _param(d, "comprehension_flat_1e12", "[x for x in range(1000000000000)]")


def range_1e20(d):
    return _param(d, "range_1e20", "range(100000000000000000000)")


def range_1e20_len(d):
    return _param(d, "range_1e20_len", "len(range(1, 100000000000000000000, 3))")


def range_negative_huge(d):
    return _param(d, "range_negative_huge", "range(-100000000000000000000, 0, -1)")


def huge_literal(d):
    return _param(d, "huge_literal", "99999999999999999999999999999999 * 2")


def int_growth(d, n=200):
    # repeated squaring: numbers of 2**n bits if unchecked
    lines = ["plan: hostile", "params:", "  p0: 3"] + [f"  p{i + 1}: 'p{i} * p{i}'" for i in range(n)]
    return _write(d, "int_growth", "\n".join(lines) + "\n" + HEAD.split("\n", 1)[1])


def add_growth(d, n=3000):
    lines = ["plan: hostile", "params:", "  p0: 4611686018427387904"] + [
        f"  p{i + 1}: 'p{i} + p{i}'" for i in range(n)]
    return _write(d, "add_growth", "\n".join(lines) + "\n" + HEAD.split("\n", 1)[1])


def string_doubling(d, n=40):
    lines = ["plan: hostile", "params:", "  s0: \"'abcdefgh'\""] + [f"  s{i + 1}: 's{i} + s{i}'" for i in range(n)]
    return _write(d, "string_doubling", "\n".join(lines) + "\n" + HEAD.split("\n", 1)[1])


def list_doubling(d, n=40):
    lines = ["plan: hostile", "params:", "  l0: '[1, 2, 3, 4]'"] + [f"  l{i + 1}: 'l{i} + l{i}'" for i in range(n)]
    return _write(d, "list_doubling", "\n".join(lines) + "\n" + HEAD.split("\n", 1)[1])


def list_comprehension_doubling(d, n=40):
    lines = ["plan: hostile", "params:", "  l0: '[1, 2, 3, 4]'"] + [
        f"  l{i + 1}: '[v for v in l{i}] + [v + 1 for v in l{i}]'" for i in range(n)]
    return _write(d, "list_comprehension_doubling", "\n".join(lines) + "\n" + HEAD.split("\n", 1)[1])


def nested_for_empty(d):
    text = HEAD + ("ops:\n  - y: copy(x)\n  - for: i in range(1000000)\n    ops:\n"
                   "      - for: j in range(1000000)\n        ops: []\n")
    return _write(d, "nested_for_empty", text)


def nested_for_small_ranges(d):
    # 1e12 iterations from six nested loops of 100 each, every range well inside its own limit
    body = "ops: []"
    for k in reversed(range(6)):
        body = f"- for: i{k} in range(100)\n  ops:\n" + "\n".join("    " + ln for ln in body.split("\n"))
    text = HEAD + "ops:\n  - y: copy(x)\n" + "\n".join("  " + ln for ln in body.split("\n")) + "\n"
    return _write(d, "nested_for_small_ranges", text)


def for_at_old_limit(d):
    text = HEAD + "ops:\n  - for: i in range(1999999)\n    ops:\n      - y{i}: copy(x)\n"
    return _write(d, "for_at_old_limit", text)


def for_just_over_limit(d):
    from planner.lang.expand import MAX_OPS
    text = HEAD + f"ops:\n  - for: i in range({MAX_OPS + 1})\n    ops:\n      - y{{i}}: copy(x)\n"
    return _write(d, "for_just_over_limit", text)


def for_two_levels_over_limit(d):
    # the outer loop's first iteration is small; the total is far over the op budget
    text = HEAD + ("ops:\n  - for: i in range(1000)\n    ops:\n      - for: j in range(1000)\n"
                   "        ops:\n          - y{i}_{j}: copy(x)\n")
    return _write(d, "for_two_levels_over_limit", text)


def input_keys_loop(d):
    text = ("plan: hostile\ndims: {num_tokens: 1..64}\ninputs:\n  x{i} for i in range(1000000): 'bf16[num_tokens, 8]'\n"
            "outputs: [x0]\nops:\n  - y: copy(x0)\n")
    return _write(d, "input_keys_loop", text)


def long_chain_add(d, n=2000):
    return _param(d, "long_chain_add", "+".join(["1"] * n))


def long_chain_sub(d, n=1300):
    return _param(d, "long_chain_sub", " - ".join(["1"] * n))


def long_chain_and(d, n=900):
    return _param(d, "long_chain_and", " and ".join(["true"] * n))


def postfix_index_chain(d, n=1300):
    return _param(d, "postfix_index_chain", "[[1]]" + "[0]" * n)


def nested_parens(d, n=1500):
    return _param(d, "nested_parens", "(" * n + "1" + ")" * n)


def nested_lists(d, n=1500):
    return _param(d, "nested_lists", "[" * n + "1" + "]" * n)


def nested_unary(d, n=2000):
    return _param(d, "nested_unary", "-" * n + "1")


def nested_not(d, n=1000):
    return _param(d, "nested_not", "not " * n + "true")


def gate_chain(d, n=1300):
    when = " and ".join(["num_tokens <= 64"] * n)
    text = HEAD.replace("outputs: [x]\n", "outputs: [y]\n") + (
        "ops:\n  - region: r\n    outputs: [y]\n    variants:\n"
        f"      - name: a\n        when: {when!r}\n        ops:\n          - y: copy(x)\n"
        "      - name: b\n        ops:\n          - y: copy(x)\n")
    return _write(d, "gate_chain", text)


def shape_chain(d, n=1300):
    shape = " + ".join(["num_tokens"] * n)
    text = ("plan: hostile\ndims: {num_tokens: 1..64}\n"
            f"inputs: {{x: 'bf16[{shape}, 8]'}}\noutputs: [x]\nops:\n  - y: copy(x)\n")
    return _write(d, "shape_chain", text)


def long_expression(d):
    return _param(d, "long_expression", "1 + " * 20000 + "1")


def interp_long_name(d):
    text = ("plan: hostile\nparams:\n  s0: \"'abcdefghabcdefgh'\"\n" + "".join(
        f"  s{i + 1}: 's{i} + s{i}'\n" for i in range(12)) + HEAD.split("\n", 1)[1] + "ops:\n  - y{s12}: copy(x)\n")
    return _write(d, "interp_long_name", text)


def yaml_flat_list(d):
    # ~8 MB of YAML: 4M scalars in one list
    text = "plan: hostile\nparams:\n  l: [" + ",".join(["1"] * 4_000_000) + "]\n" + HEAD.split("\n", 1)[1]
    return _write(d, "yaml_flat_list", text)


def yaml_laughs(d):
    lines = ["plan: hostile", "doc: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"d{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]")
    return _write(d, "yaml_laughs", "\n".join(lines) + "\n")


def yaml_deep(d, n=5000):
    return _write(d, "yaml_deep", "plan: hostile\nparams:\n  x: " + "[" * n + "]" * n + "\n")


def sparse_file(d):
    p = d / "sparse_file.yaml"
    with open(p, "wb") as f:
        f.write(b"plan: hostile\n")
        f.truncate(64 * 1024**3)  # 64 GB, sparse: takes no disk
    return p


def includes_fan(d):
    # 60 includes of 1 MB each: each is under the file budget, together they are not
    for i in range(60):
        (d / f"inc{i}.yaml").write_text("doc: '" + "a" * 1_000_000 + "'\n")
    text = "include: [" + ", ".join(f"inc{i}.yaml" for i in range(60)) + "]\n" + HEAD
    return _write(d, "includes_fan", text)


def dim_huge_range(d):
    text = ("plan: hostile\ndims: {num_tokens: '1..100000000000000000000000000000'}\n"
            "inputs: {x: 'bf16[num_tokens, 8]'}\noutputs: [x]\nops:\n  - y: copy(x)\n")
    return _write(d, "dim_huge_range", text)


def cat_many(d, n=20000):
    text = (HEAD + "ops:\n" + "".join(f"  - c{i}: copy(x)\n" for i in range(n))
            + "  - y: cat(" + ", ".join(f"c{i}" for i in range(n)) + ", dim=0)\n")
    return _write(d, "cat_many", text)


HOSTILE = {f.__name__: f for f in [
    blocks_deep, blocks_wide, params_reverse, params_many, comprehension_1e12, comprehension_flat_1e12, range_1e20,
    range_1e20_len, range_negative_huge, huge_literal, int_growth, add_growth, string_doubling, list_doubling,
    list_comprehension_doubling, nested_for_empty, nested_for_small_ranges, for_at_old_limit, for_just_over_limit,
    for_two_levels_over_limit, input_keys_loop, long_chain_add, long_chain_sub, long_chain_and, postfix_index_chain,
    nested_parens, nested_lists, nested_unary, nested_not, gate_chain, shape_chain, long_expression,
    interp_long_name, yaml_flat_list, yaml_laughs, yaml_deep, sparse_file, includes_fan, dim_huge_range, cat_many,
]}

if __name__ == "__main__":  # write them all into a folder, e.g. to time them by hand
    out = Path(os.environ.get("OUT", "hostile_out"))
    out.mkdir(exist_ok=True)
    for f in HOSTILE.values():
        print(f(out))


def chain_deep(d, n=30_000):
    # one long dependency chain: any recursive walk over the graph would overflow
    text = HEAD.replace("outputs: [x]", f"outputs: [t{n}]") + "ops:\n  - t0: copy(x)\n" + "".join(
        f"  - t{i + 1}: copy(t{i})\n" for i in range(n))
    return _write(d, "chain_deep", text)


def many_variants(d, n=5000):
    vs = "".join(f"      - name: v{i}\n        when: num_tokens == {i}\n        ops:\n          - y: copy(x)\n"
                 for i in range(n))
    text = HEAD.replace("outputs: [x]", "outputs: [y]") + (
        "ops:\n  - region: r\n    outputs: [y]\n    variants:\n" + vs
        + "      - name: last\n        ops:\n          - y: copy(x)\n")
    return _write(d, "many_variants", text)


def many_regions(d, n=3000):
    body = "".join(f"  - region: r{i}\n    outputs: [y{i}]\n    variants:\n"
                   f"      - name: a\n        when: num_tokens <= {i % 64}\n        ops:\n          - y{i}: copy(x)\n"
                   f"      - name: b\n        ops:\n          - y{i}: copy(x)\n" for i in range(n))
    return _write(d, "many_regions", HEAD + "ops:\n" + body)


def many_buckets(d):
    text = ("plan: hostile\ndims:\n  num_tokens: {range: '1..1000000', buckets: [" + ", ".join(
        str(i) for i in range(1, 400_001)) + "]}\ninputs: {x: 'bf16[num_tokens, 8]'}\noutputs: [x]\nops:\n  - y: copy(x)\n")
    return _write(d, "many_buckets", text)


def huge_shape_literal(d):
    text = ("plan: hostile\ndims: {num_tokens: 1..64}\ninputs: {x: 'bf16[num_tokens, 99999999999999999999999]'}\n"
            "outputs: [x]\nops:\n  - y: copy(x)\n")
    return _write(d, "huge_shape_literal", text)


def for_nested_deep(d, n=30):
    body = "ops:\n  - y: copy(x)\n"
    inner = "ops: []"
    for k in reversed(range(n)):
        inner = f"- for: i{k} in range(2)\n  ops:\n" + "\n".join("    " + ln for ln in inner.split("\n"))
    return _write(d, "for_nested_deep", HEAD + body + "\n".join("  " + ln for ln in inner.split("\n")) + "\n")


def interp_heavy(d, n=20000):
    body = "".join(f"  - y{{{i} + {i} * 2 - {i}}}: copy(x)\n" for i in range(n))
    return _write(d, "interp_heavy", HEAD + "ops:\n" + body)


HOSTILE.update({f.__name__: f for f in [chain_deep, many_variants, many_regions, many_buckets, huge_shape_literal,
                                         for_nested_deep, interp_heavy]})


def _dim_chain(d, name, line, lo=1, n=1500):
    head = f"plan: hostile\ndims: {{num_tokens: {lo}..{lo + 1000}}}\ninputs: {{x: 'bf16[num_tokens, 8]'}}\n"
    text = head + f"outputs: [t{n}]\nops:\n  - t0: copy(x)\n" + "".join(line(i) for i in range(n))
    return _write(d, name, text)


def pad_chain(d):
    # every pad wraps the dynamic dim in another round_up(...): symbolic dims grow without limit
    return _dim_chain(d, "pad_chain", lambda i: f"  - t{i + 1}: pad(t{i}, {2 + i % 7}, 0)\n")


def slice_chain(d):
    return _dim_chain(d, "slice_chain", lambda i: f"  - t{i + 1}: t{i}[1:]\n", lo=5000)


def cat_chain(d):
    return _dim_chain(d, "cat_chain", lambda i: f"  - t{i + 1}: cat(t{i}, x, dim=0)\n")


HOSTILE.update({f.__name__: f for f in [pad_chain, slice_chain, cat_chain]})
