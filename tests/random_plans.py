"""Random valid plans over every op kind, for the property tests (tests/test_property.py).

gen_plan(seed, world) -> (YAML text, meta). Tensors are 2-D [rows, cols]: rows are a multiple of one
of num_tokens, round_up(num_tokens, W) or ceil_div(num_tokens, W) (W = the group size), so gathers,
scatters, pads, shards and views change them symbolically; cols are static multiples of 8. Regions
with gated variants (dims, `capturing`, tuned limits) wrap short same-shaped chains; collectives use
one or two groups. Every op kind of planner/ops.py that a user writes appears.
"""

from __future__ import annotations

import random

KINDS = ["gemm", "add", "split", "cat", "slice", "copy", "shard", "pad", "view", "all_gather",
         "reduce_scatter", "all_reduce", "extern"]
BASE = {"T": "num_tokens", "P": "round_up(num_tokens, tp_size)", "S": "ceil_div(num_tokens, tp_size)"}


def rows_expr(rk) -> str:
    base, m = rk
    return BASE[base] if m == 1 else f"{BASE[base]} * {m}"


class _Gen:
    def __init__(self, seed: int, world: int):
        self.rng = random.Random(seed)
        self.W = world
        self.tensors: dict[str, tuple] = {}   # name -> ((base, mult), cols)
        self.weights: dict[str, tuple] = {}
        self.dtype = "fp32" if self.rng.random() < 0.8 else "bf16"
        self.groups = ["tp"] + (["tp2"] if self.rng.random() < 0.5 else [])
        self.k = 0
        self.kinds = set()
        self.contig: set[str] = set()  # tensors known to be contiguous (a view needs one)
        self.dt: dict[str, str] = {}      # tensor -> dtype (plans mix fp32 and bf16 through casting copies)
        self.made_dt: str | None = None   # dtype of what the last op() made

    def new(self, prefix="t"):
        self.k += 1
        return f"{prefix}{self.k}"

    def group(self):
        return self.rng.choice(self.groups)

    def pick(self, pred=lambda n, s: True, pool=None):
        pool = self.tensors if pool is None else pool
        c = [n for n, s in pool.items() if pred(n, s)]
        return self.rng.choice(c) if c else None

    def weight(self, n, k, dt):
        w = f"w{len(self.weights)}"
        self.weights[w] = (n, k, dt)
        return w

    def op(self, kind, pool, out=None):
        """One op of `kind` over tensors of `pool` -> (line, {new name: shape}) or None."""
        rng, W = self.rng, self.W
        o = out or self.new()
        self.made_dt = None  # None: the dtype of the op's first input, set by op_dt()
        if kind == "gemm":
            a = self.pick(pool=pool)
            n = rng.choice([8, 16, 24])
            self.made_dt = self.dt[a]
            return f"{o}: gemm({a}, {self.weight(n, pool[a][1], self.dt[a])})", {o: (pool[a][0], n)}
        if kind == "add":
            a = self.pick(pool=pool)
            b = self.pick(lambda n, s: s == pool[a] and self.dt[n] == self.dt[a], pool)
            self.made_dt = self.dt[a]
            return f"{o}: add({a}, {b})", {o: pool[a]}
        if kind == "split":
            a = self.pick(lambda n, s: s[1] >= 16, pool)
            if a is None:
                return None
            rk, cols = pool[a]
            c1 = 8 * rng.randint(1, cols // 8 - 1)
            o2 = self.new()
            return f"{o}, {o2}: split({a}, [{c1}, {cols - c1}])", {o: (rk, c1), o2: (rk, cols - c1)}
        if kind == "cat":
            a = self.pick(pool=pool)
            b = self.pick(lambda n, s: s[0] == pool[a][0] and s[1] + pool[a][1] <= 64 and self.dt[n] == self.dt[a],
                          pool)
            if b is None:
                return None
            self.made_dt = self.dt[a]
            return f"{o}: cat({a}, {b}, dim=-1)", {o: (pool[a][0], pool[a][1] + pool[b][1])}
        if kind == "slice":
            a = self.pick(lambda n, s: s[1] >= 16 or (s[0][0] == "T" and s[0][1] > 1), pool)
            if a is None:
                return None
            rk, cols = pool[a]
            if rk[0] == "T" and rk[1] > 1 and rng.random() < 0.5:
                return f"{o}: {a}[:num_tokens]", {o: (("T", 1), cols)}
            if cols < 16:
                return None
            s0 = 8 * rng.randint(0, cols // 8 - 1)
            s1 = 8 * rng.randint(s0 // 8 + 1, cols // 8)
            return f"{o}: {a}[:, {s0}:{s1}]", {o: (rk, s1 - s0)}
        if kind == "copy":
            a = self.pick(pool=pool)
            if rng.random() < 0.4:  # a casting copy: fp32 <-> bf16
                self.made_dt = "bf16" if self.dt[a] == "fp32" else "fp32"
                return f"{o}: copy({a}, dtype={self.made_dt})", {o: pool[a]}
            self.made_dt = self.dt[a]
            return f"{o}: copy({a})", {o: pool[a]}
        if kind == "shard":
            if rng.random() < 0.5:
                a = self.pick(lambda n, s: s[0] == ("T", 1), pool)
                if a is None:
                    return None
                return f"{o}: shard({a}, {self.group_sized()}, 0)", {o: (("S", 1), pool[a][1])}
            a = self.pick(lambda n, s: s[1] % (8 * W) == 0, pool)
            if a is None:
                return None
            return f"{o}: shard({a}, {self.group_sized()}, 1)", {o: (pool[a][0], pool[a][1] // W)}
        if kind == "pad":
            if rng.random() < 0.5:
                a = self.pick(lambda n, s: s[0] == ("T", 1), pool)
                if a is None:
                    return None
                return f"{o}: pad({a}, tp_size, 0)", {o: (("P", 1), pool[a][1])}
            a = self.pick(lambda n, s: s[1] < 64, pool)
            if a is None:
                return None
            m = rng.choice([16, 24, 32])
            cols = -(-pool[a][1] // m) * m
            if cols > 64:
                return None
            return f"{o}: pad({a}, {m}, 1)", {o: (pool[a][0], cols)}
        if kind == "view":
            a = self.pick(lambda n, s: s[1] % 16 == 0 and n in self.contig, pool)
            if a is None:
                return None
            (base, m), cols = pool[a]
            if rng.random() < 0.5:
                return (f"{o}: view({a}, [{rows_expr((base, m * 2))}, {cols // 2}])",
                        {o: ((base, m * 2), cols // 2)})
            return f"{o}: view({a}, [{rows_expr((base, m))}, {cols}])", {o: pool[a]}
        if kind == "all_gather":
            if rng.random() < 0.7:
                a = self.pick(pool=pool)
                (base, m), cols = pool[a]
                return f"{o}: all_gather({a}, {self.group()})", {o: ((base, m * self.size_of_last), cols)}
            a = self.pick(lambda n, s: s[1] * W <= 64, pool)
            if a is None:
                return None
            g = self.group()
            return f"{o}: all_gather({a}, {g}, 1)", {o: (pool[a][0], pool[a][1] * self.size_of_last)}
        if kind == "reduce_scatter":
            a = self.pick(lambda n, s: (s[0][0] == "P") or (s[0][0] in "TS" and s[0][1] % W == 0), pool)
            if a is not None and rng.random() < 0.7:
                (base, m), cols = pool[a]
                g = self.group_sized()
                nb = ("S", m) if base == "P" and W > 1 else (base, m // W)
                return f"{o}: reduce_scatter({a}, {g})", {o: (nb, cols)}
            a = self.pick(lambda n, s: s[1] % (8 * W) == 0, pool)
            if a is None:
                return None
            return f"{o}: reduce_scatter({a}, {self.group_sized()}, 1)", {o: (pool[a][0], pool[a][1] // W)}
        if kind == "all_reduce":
            a = self.pick(pool=pool)
            return f"{o}: all_reduce({a}, {self.group()})", {o: pool[a]}
        if kind == "extern":
            a = self.pick(pool=pool)
            b = self.pick(pool=pool)
            rk, _ = pool[a]
            cols = rng.choice([8, 16])
            self.made_dt = rng.choice([self.dtype, self.dt[a]])
            return (f"{o}: extern(mix{rng.randint(0, 2)}, {a}, {b}, shape=[{rows_expr(rk)}, {cols}],"
                    f" dtype={self.made_dt})", {o: (rk, cols)})
        raise ValueError(kind)

    def op_dt(self, line, made):
        """Record the dtype of what op() made: the first input's unless the op set another."""
        if self.made_dt is None:
            import re
            rhs = line.split(":", 1)[1]
            first = (re.search(r"\(([A-Za-z_]\w*)", rhs) or re.match(r"\s*([A-Za-z_]\w*)\[", rhs)).group(1)
            self.made_dt = self.dt[first]
        for n in made:
            self.dt[n] = self.made_dt

    # a collective's group: both groups have size W; size_of_last is the size of the one picked
    size_of_last = property(lambda self: self.W)

    def group_sized(self):
        return self.group()


def gen_plan(seed: int, world: int, n_ops: int | None = None) -> tuple[str, dict]:
    g = _Gen(seed, world)
    rng = g.rng
    n_ops = n_ops or rng.randint(4, 12)
    inputs = []
    for i in range(rng.randint(1, 3)):
        name = f"x{i}"
        g.tensors[name] = (("T", 1), rng.choice([8, 16, 24, 32]))
        g.dt[name] = g.dtype if rng.random() < 0.8 else ("bf16" if g.dtype == "fp32" else "fp32")
        g.contig.add(name)
        inputs.append(name)
    lines: list[str] = []
    n_regions = 0
    kinds = list(KINDS)
    rng.shuffle(kinds)
    want = kinds[:]  # every kind early, then at random
    for _ in range(n_ops):
        kind = want.pop() if want else rng.choice(KINDS)
        if rng.random() < 0.25:
            r = _region(g, n_regions)
            if r is not None:
                lines += r
                n_regions += 1
                continue
        got = g.op(kind, g.tensors)
        if got is None:
            continue
        line, made = got
        g.op_dt(line, made)
        g.kinds.add(kind)
        if kind in _CONTIGUOUS:
            g.contig.update(made)
        lines.append(f"  - {line}")
        g.tensors.update(made)
    produced = [n for n in g.tensors if n not in inputs]
    if not produced:
        line, made = g.op("copy", g.tensors)
        g.op_dt(line, made)
        lines.append(f"  - {line}")
        g.tensors.update(made)
        produced = list(made)
    body = "\n".join(lines)
    unused = [n for n in produced if not _used(n, body)]
    if rng.random() < 0.3:  # leave some results unused: dead code (whole regions too) for dce to remove
        unused = unused[: max(0, len(unused) // 2)]
    outs = sorted(set(unused + rng.sample(produced, min(2, len(produced)))), key=lambda n: int(n[1:]))
    out = [f"plan: rand{seed}_w{world}",
           "params:", f"  tp_size: {world}",
           "dims:", f"  num_tokens: 1..{rng.choice([24, 40])}",
           "groups:"] + [f"  {gr}: tp_size" for gr in g.groups] + [
           "tuned:", f"  lim: {rng.choice([4, 8, 16])}",
           "inputs:"] + [f"  {n}: {g.dt[n]}[num_tokens, {g.tensors[n][1]}]" for n in inputs]
    if g.weights:
        out.append("weights:")
        out += [f"  {w}: {dt}[{n}, {k}]" for w, (n, k, dt) in g.weights.items()]
    out.append(f"outputs: [{', '.join(outs)}]")
    out.append("ops:")
    text = "\n".join(out + lines) + "\n"
    return text, {"kinds": sorted(g.kinds), "regions": n_regions, "dtype": g.dtype, "groups": g.groups}


_CONTIGUOUS = {"gemm", "add", "copy", "cat", "all_gather", "reduce_scatter", "all_reduce", "extern", "pad", "view"}
GATES = ["num_tokens <= {k}", "capturing", "not capturing and num_tokens > {k}", "num_tokens <= tuned.lim",
         "capturing and num_tokens <= tuned.lim", "num_tokens % 2 == 0", "tp_size == {w} and num_tokens >= {k}"]
VARIANT_KINDS = ["add", "copy", "gemm", "all_reduce", "extern", "cat_split", "gather_slice"]


def _region(g: _Gen, idx: int):
    """A region exporting one tensor of the shape of an existing one; 2 or 3 variants."""
    rng = g.rng
    src = g.pick()
    shape = g.tensors[src]
    rid = f"r{idx}"
    out = g.new()
    nv = rng.randint(2, 3)
    lines = [f"  - region: {rid}", f"    outputs: [{out}]", "    variants:"]
    for v in range(nv):
        lines.append(f"      - name: v{v}")
        if v < nv - 1:
            gate = rng.choice(GATES).format(k=rng.choice([3, 8, 12]), w=g.W)
            lines.append(f"        when: {gate}")
        lines.append("        ops:")
        lines += [f"          - {ln}" for ln in _variant_body(g, src, shape, out)]
    g.tensors[out] = shape
    g.dt[out] = g.dt[src]
    g.kinds.add("region")
    return lines


def _variant_body(g: _Gen, src, shape, out):
    rng = g.rng
    rk, cols = shape
    kind = rng.choice(VARIANT_KINDS)
    same = [n for n, s in g.tensors.items() if s == shape and g.dt[n] == g.dt[src]]
    if kind == "add":
        return [f"{out}: add({src}, {rng.choice(same)})"]
    if kind == "gemm":
        return [f"{out}: gemm({src}, {g.weight(cols, cols, g.dt[src])})"]
    if kind == "all_reduce":
        return [f"{out}: all_reduce({src}, {g.group()})"]
    if kind == "extern":
        return [f"{out}: extern(mix3, {src}, shape=[{rows_expr(rk)}, {cols}], dtype={g.dt[src]})"]
    if kind == "cat_split" and cols >= 16:
        c1 = 8 * rng.randint(1, cols // 8 - 1)
        return [f"a, b: split({src}, [{c1}, {cols - c1}])", f"{out}: cat(b, a, dim=-1)"]
    if kind == "gather_slice" and rk == ("T", 1):
        return [f"{out}: all_gather({src}, {g.group()})[:num_tokens]"]
    return [f"{out}: copy({src})"]


def _used(name: str, body: str) -> bool:
    import re
    return re.search(rf"[(, \[]{re.escape(name)}[,)\[]", body) is not None
