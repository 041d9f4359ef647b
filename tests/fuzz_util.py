"""Mutations of shipped plans, for fuzz tests: every mutant must load or fail with a PlanError."""

from __future__ import annotations

import random

TOKENS = ["[", "]", "{", "}", ":", ",", "-", "(", ")", "'", '"', "#", "&a", "*a", "!!python/object:os.system",
          "__import__('os')", "0", "-1", "99999999999999999999", "tp_size", "num_tokens", "bf16", "fp8",
          "gemm(", "split(", "all_gather(x, tp)", "[:", "..", "\n", "\n  ", "  ", "for: L in ", "variants:",
          "when: ", "ops:", "include: [../../etc/passwd]", "x", "_", "/", "//", "ceil_div(", "true", "null", "~"]


def mutate(text: str, rng: random.Random, n: int = 3) -> str:
    for _ in range(n):
        kind = rng.randrange(6)
        i = rng.randrange(len(text) + 1)
        if kind == 0 and text:  # delete a span
            j = min(len(text), i + rng.randrange(1, 12))
            text = text[:i] + text[j:]
        elif kind == 1:  # insert a token
            text = text[:i] + rng.choice(TOKENS) + text[i:]
        elif kind == 2 and text:  # replace a character
            text = text[:i] + rng.choice(TOKENS)[:1] + text[i + 1:]
        elif kind == 3:  # duplicate a line
            lines = text.split("\n")
            k = rng.randrange(len(lines))
            lines.insert(k, lines[k])
            text = "\n".join(lines)
        elif kind == 4:  # swap two lines
            lines = text.split("\n")
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
        else:  # change a number
            import re
            nums = list(re.finditer(r"\d+", text))
            if nums:
                m = rng.choice(nums)
                text = text[:m.start()] + str(rng.choice([0, 1, 3, 7, 13, 144, 6289, -5])) + text[m.end():]
    return text
