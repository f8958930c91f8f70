"""The CLI fuzzer: N cases over mutated configs, odd flags, check files, GGUF metadata and names, each run
in-process with a 20 s bound and judged by tests/fuzzing.py (the classes of ../shared/reviews/fuzz.md).

    python bench/fuzz.py -n 10000 --seed 1        # prints the table; --show 3 prints examples per class

A case is reproduced by its seed: `python bench/fuzz.py --case SEED`.
"""

from __future__ import annotations

import argparse
import collections
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fuzzing  # noqa: E402

CLASSES = ("traceback", "hang", "bad-exit", "spew", "suspicious")
WEIGHTS = {"config": 30, "quantfile": 6, "flags": 24, "check": 16, "gguf": 17, "names": 7}


def case_for(seed: int) -> fuzzing.Case:
    rng = random.Random(seed)
    category = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    return fuzzing.GENERATORS[category](rng)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--show", type=int, default=2)
    ap.add_argument("--case", type=int)
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # a runaway case fails with MemoryError, not the machine
    seeds = [args.case] if args.case is not None else [args.seed * 1_000_003 + i for i in range(args.n)]
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    examples: dict[str, list[tuple[int, list[str], str]]] = collections.defaultdict(list)
    start = time.monotonic()
    for seed in seeds:
        case = case_for(seed)
        with tempfile.TemporaryDirectory() as tmp:
            outcome = fuzzing.run_case(case, Path(tmp))
        found = fuzzing.classify(case, outcome)
        table[case.category]["cases"] += 1
        table[case.category]["clean"] += not found
        for c in found:
            table[case.category][c] += 1
            if len(examples[c]) < args.show:
                examples[c].append((seed, case.argv, (outcome.err or outcome.out)[-300:]))
        if args.case is not None:
            print(case.argv, outcome.code, outcome.err or outcome.out[-2000:], found)
    took = time.monotonic() - start
    print(f"| category | cases | {' | '.join(CLASSES)} | clean |")
    print("|---|" + "---:|" * (len(CLASSES) + 2))
    total: collections.Counter = collections.Counter()
    for cat in WEIGHTS:
        row = table.get(cat, collections.Counter())
        total.update(row)
        print(f"| {cat} | {row['cases']} | " + " | ".join(str(row[c]) for c in CLASSES) + f" | {row['clean']} |")
    print(f"| **total** | {total['cases']} | " + " | ".join(str(total[c]) for c in CLASSES) + f" | {total['clean']} |")
    print(f"{total['cases']} cases in {took:.0f} s")
    for c, items in examples.items():
        for seed, argv, tail in items:
            print(f"\n[{c}] seed {seed}: {' '.join(argv)[:200]}\n{tail}")
    return 0 if all(total[c] == 0 for c in CLASSES) else 1


if __name__ == "__main__":
    sys.exit(main())
