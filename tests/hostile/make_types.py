"""Write types/*.yaml: base.yaml with one field replaced by a value of a wrong type.

    python tests/hostile/make_types.py     (rewrites the corpus; tests/test_hostile_types.py runs it)
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
# field path in base.yaml -> wrong values for it (each must give exit 2 with a located message)
NOT_INT = [1.5, "a", True, None, [], {}, [1], "1..2"]
NOT_STR = [1.5, 7, True, None, [], {}]
NOT_LIST = [1.5, 7, True, "a", {}, None]
FIELDS = {
    ("plan",): [1.5, [], {}, True],
    ("params",): [1.5, [], "a", 7],
    ("params", "tp_size", "value"): [1.5, None, [], {}, [1.5], ["a"], [True, 2]],
    ("params", "tp_size", "choices"): [1.5, "a", 7, True, None, [], {}, [1.5], [None], [{}], [[1.5]]],
    ("params", "tp_size", "min"): NOT_INT + [3],
    ("params", "tp_size", "max"): NOT_INT + [1],
    ("params", "tp_size", "doc"): [1.5, [], {}, 7],
    ("params", "hidden"): [1.5, None, {}, [1.5], {"value": 1.5}, {"min": 1}, "hidden + 1"],
    ("params", "layers"): [1.5, "[0, 1.5]", "[0, 'a'] + 1", "range('a')", "range(1, 2, 0)", "len(3)"],
    ("dims",): [1.5, [], "a", 7],
    ("dims", "num_tokens"): [1.5, 7, True, None, [], {}, "1..", "..8", "a..b", "8..1", "1..2..3", "-1..4"],
    ("dims", "num_tokens", "range"): [1.5, 7, None, [], {}, "1..1.5", "'1'..'2'"],
    ("dims", "num_tokens", "buckets"): [1.5, "a", 7, True, {}, [1.5], ["a"], [0], [65], [None], [True]],
    ("dims", "num_tokens", "doc"): [1.5, [], 7],
    ("groups",): [1.5, [], "a"],
    ("groups", "tp"): [1.5, None, [], {}, 0, -1, "a", True, "tp_size / 4", {"size": 1.5}],
    ("tuned",): [1.5, [], "a"],
    ("tuned", "lim"): [1.5, "a", None, [], {}, "1.5"],
    ("inputs",): [1.5, [], "a", 7],
    ("inputs", "x"): [1.5, 7, True, None, [], "bf16", "bf16[", "xx16[num_tokens]", "bf16[num_tokens, 1.5]",
                      "bf16[num_tokens] sideways", {"shape": 1.5, "dtype": "bf16"}, {"shape": [1.5], "dtype": "bf16"},
                      {"shape": ["num_tokens"], "dtype": 7}, {"shape": ["num_tokens"]},
                      {"shape": ["num_tokens"], "dtype": "bf16", "contiguous": "yes"},
                      {"shape": [[1]], "dtype": "bf16"}, {"shape": [None], "dtype": "bf16"},
                      {"shape": "[-1]", "dtype": "bf16"}],
    ("weights", "w", "shape"): [1.5, 7, True, None, {}, [1.5, 64], ["a", 64], [[64], 64], "hidden"],
    ("weights", "w", "dtype"): [1.5, 7, True, None, [], {}, "float99"],
    ("weights", "w", "contiguous"): [1.5, 7, "yes", [], {}],
    ("outputs",): [1.5, 7, "y", {}, [1.5], [None], [[]], ["nope"]],
    ("blocks",): [1.5, [], "a"],
    ("blocks", "blk"): [1.5, [], "a", None],
    ("blocks", "blk", "args"): NOT_LIST + [[1.5], [[]]],
    ("blocks", "blk", "outputs"): NOT_LIST + [[1.5], [[]]],
    ("blocks", "blk", "ops"): [1.5, 7, True, "a", [1.5], [None], [[]]],
    ("ops",): [1.5, 7, True, "a", {}, [1.5], [None], [[]], [{}]],
    ("ops", 0, "t"): [1.5, 7, True, None, [], {}, "gemm(x, 1.5)", "gemm(x)", "gemm(x, w, w, w)", "gemm(1, w)"],
    ("ops", 1, "a"): [1.5, 7, True, None, [], {}],
    ("ops", 1, "op"): [1.5, 7, True, None, [], {}, "nope"],
    ("ops", 1, "out"): [1.5, 7, True, {}, [1.5], [[]]],
    ("ops", 2, "sizes"): [1.5, "a", True, None, {}, [1.5, 32], ["a", 32], [[32], 32], [], [64, 64]],
    ("ops", 2, "dim"): [1.5, "a", True, None, [], {}, 7, -7],
    ("ops", 3, "group"): [1.5, 7, True, None, [], {}, "nope"],
    ("ops", 3, "dim"): [1.5, "a", None, [], {}, 9],
    ("ops", 5, "for"): [1.5, 7, True, None, [], {}, "L in 1.5", "L of layers", "L in 'ab'", "L in [1.5]"],
    ("ops", 5, "ops"): [1.5, 7, True, "a", [1.5], [None]],
    ("ops", 6, "region"): [1.5, [], {}],
    ("ops", 6, "outputs"): NOT_LIST + [[1.5], [[]]],
    ("ops", 6, "variants"): [1.5, 7, True, "a", None, {}, [], [1.5], [None], [[]]],
    ("ops", 6, "variants", 0, "name"): NOT_STR + ["with space"],
    ("ops", 6, "variants", 0, "when"): [1.5, 7, [], {}, "num_tokens", "1.5", "num_tokens <= 'a'", "nope",
                                        "tuned.nope > 1", "num_tokens <= tuned.lim +"],
    ("ops", 6, "variants", 0, "ops"): [1.5, 7, True, "a", None, [1.5]],
}


def _set(data, path, value):
    cur = data
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value


def cases():
    base = yaml.safe_load((HERE / "base.yaml").read_text())
    for path, values in FIELDS.items():
        for i, v in enumerate(values):
            data = copy.deepcopy(base)
            _set(data, path, v)
            name = "__".join(str(p) for p in path) + f"__{i}"
            yield name, path, v, yaml.safe_dump(data, sort_keys=False, width=1000)


def main():
    out = HERE / "types"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.yaml"):
        old.unlink()
    n = 0
    for name, path, v, text in cases():
        (out / f"{name}.yaml").write_text(f"# {'.'.join(map(str, path))} = {v!r}\n{text}")
        n += 1
    print(f"wrote {n} cases to {out}")


if __name__ == "__main__":
    main()
