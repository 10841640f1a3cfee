"""Generate the shipped math data sets, deterministically from a seed.

Writes, under ``--out`` (default: the repo's ``data/``):

- ``math_arith/{train,test}.jsonl``: arithmetic word problems in the RLVR format
  (``prompt``, ``ground_truth``, ``tag="math"``); templates: shopping totals, equal sharing, rates,
  differences, multi-step, and lengths that divide into decimals or fractions.
- ``gsm8k_sample/{train,test}.jsonl``: the same kind of problems in GSM8K's format (``question``, and an
  ``answer`` with worked steps ending in ``#### N``). Written here, not copied from GSM8K.
- ``math_tiny/{train,test}.jsonl``: one-step sums and differences of digits ("What is 3 + 4?"), the only
  math a tiny CPU model can learn in minutes.

Run: ``python scripts/make_math_data.py [--out data] [--seed 0]``. Re-running reproduces the files byte for
byte (``tests/data/test_make_math_data.py`` checks the shipped copies).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

NAMES = ["Ava", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena", "Milo", "Nia"]
ITEMS = [("pencil", 2), ("notebook", 4), ("apple", 1), ("sandwich", 6), ("ticket", 9), ("plant", 7), ("mug", 5)]
THINGS = ["stickers", "marbles", "cards", "beads", "stamps", "shells"]

Problem = tuple[str, Fraction, list[str]]  # (question, answer, worked steps)


def fmt(x: Fraction) -> str:
    """Integer, terminating decimal, or ``a/b`` text for an exact value."""
    if x.denominator == 1:
        return str(x.numerator)
    d = x.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    return str(float(x)) if d == 1 else f"{x.numerator}/{x.denominator}"


def shopping(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    (item1, p1), (item2, p2) = r.sample(ITEMS, 2)
    a, b = r.randint(2, 9), r.randint(2, 9)
    p1, p2 = p1 + r.randint(0, 3), p2 + r.randint(0, 3)
    total = a * p1 + b * p2
    q = f"{name} buys {a} {item1}s at ${p1} each and {b} {item2}s at ${p2} each. How many dollars does {name} spend?"
    return q, Fraction(total), [f"{a} * {p1} = {a * p1}", f"{b} * {p2} = {b * p2}", f"{a * p1} + {b * p2} = {total}"]


def sharing(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    k, each = r.randint(2, 8), r.randint(3, 15)
    q = (
        f"{name} has {k * each} {thing} and shares them equally among {k} friends. "
        f"How many {thing} does each friend get?"
    )
    return q, Fraction(each), [f"{k * each} / {k} = {each}"]


def rate(r: random.Random) -> Problem:
    name, speed, hours = r.choice(NAMES), r.randint(3, 12) * 5, r.randint(2, 7)
    if r.random() < 0.3:
        hours_f = Fraction(2 * hours + 1, 2)  # a half hour more: 2.5 hours, ...
        dist = speed * hours_f
        q = (
            f"{name} cycles at {speed} kilometers per hour for {fmt(hours_f)} hours. "
            f"How many kilometers does {name} cover?"
        )
        return q, dist, [f"{speed} * {fmt(hours_f)} = {fmt(dist)}"]
    q = f"A machine fills {speed} bottles per hour. How many bottles does it fill in {hours} hours?"
    return q, Fraction(speed * hours), [f"{speed} * {hours} = {speed * hours}"]


def difference(r: random.Random) -> Problem:
    n1, n2 = r.sample(NAMES, 2)
    thing, a, b = r.choice(THINGS), r.randint(20, 90), r.randint(3, 19)
    q = f"{n1} has {a} {thing}. {n2} has {b} fewer {thing} than {n1}. How many {thing} do they have together?"
    return q, Fraction(2 * a - b), [f"{a} - {b} = {a - b}", f"{a} + {a - b} = {2 * a - b}"]


def multi_step(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    start, packs, per, given = r.randint(5, 30), r.randint(2, 6), r.randint(4, 12), r.randint(1, 10)
    left = start + packs * per - given
    q = (
        f"{name} has {start} {thing}, buys {packs} packs of {per} {thing} each, then gives {given} {thing} "
        f"to a friend. How many {thing} does {name} have now?"
    )
    return (
        q,
        Fraction(left),
        [
            f"{packs} * {per} = {packs * per}",
            f"{start} + {packs * per} = {start + packs * per}",
            f"{start + packs * per} - {given} = {left}",
        ],
    )


def cut_rope(r: random.Random) -> Problem:
    length, pieces = r.randint(5, 40), r.choice([2, 3, 4, 5, 8])
    each = Fraction(length, pieces)
    q = f"A rope {length} meters long is cut into {pieces} equal pieces. How many meters long is each piece?"
    return q, each, [f"{length} / {pieces} = {fmt(each)}"]


TEMPLATES: list[Callable[[random.Random], Problem]] = [shopping, sharing, rate, difference, multi_step, cut_rope]


def problems(seed: int, n: int, exclude: set[str] = frozenset()) -> list[Problem]:
    """``n`` distinct problems from ``seed``, none whose question is in ``exclude``."""
    r, out, seen = random.Random(seed), [], set(exclude)
    while len(out) < n:
        prob = r.choice(TEMPLATES)(r)
        if prob[0] not in seen:
            seen.add(prob[0])
            out.append(prob)
    return out


def tiny_problems(seed: int) -> tuple[list[dict], list[dict]]:
    """All one-digit sums and non-negative differences, shuffled; 30 for test, the rest for train."""
    rows = [
        {"prompt": f"What is {a} + {b}?", "ground_truth": str(a + b), "tag": "math"}
        for a in range(10)
        for b in range(10)
    ]
    rows += [
        {"prompt": f"What is {a} - {b}?", "ground_truth": str(a - b), "tag": "math"}
        for a in range(10)
        for b in range(a + 1)
    ]
    random.Random(seed).shuffle(rows)
    return rows[30:], rows[:30]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data"), help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="base seed; each split derives its own")
    args = parser.parse_args(argv)
    out = Path(args.out)

    arith_test = problems(args.seed * 1000 + 1, 100)
    arith_train = problems(args.seed * 1000 + 2, 400, exclude={q for q, _, _ in arith_test})
    for split, probs in (("train", arith_train), ("test", arith_test)):
        write_jsonl(
            out / "math_arith" / f"{split}.jsonl",
            [{"prompt": q, "ground_truth": fmt(a), "tag": "math"} for q, a, _ in probs],
        )

    gsm_test = problems(args.seed * 1000 + 3, 40)
    gsm_train = problems(args.seed * 1000 + 4, 160, exclude={q for q, _, _ in gsm_test})
    for split, probs in (("train", gsm_train), ("test", gsm_test)):
        write_jsonl(
            out / "gsm8k_sample" / f"{split}.jsonl",
            [{"question": q, "answer": "\n".join(steps + [f"#### {fmt(a)}"])} for q, a, steps in probs],
        )

    tiny_train, tiny_test = tiny_problems(args.seed * 1000 + 5)
    write_jsonl(out / "math_tiny" / "train.jsonl", tiny_train)
    write_jsonl(out / "math_tiny" / "test.jsonl", tiny_test)


if __name__ == "__main__":
    main()
