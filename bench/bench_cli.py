"""Wall-clock timings of cold kvplan runs (a fresh interpreter each time), the figures quoted in issue notes.

    python bench/bench_cli.py            # median of 7 runs per command
No timing is asserted anywhere in the tests; this script only reports.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = [
    ["size", "llama-2-7b", "--ctx", "4096"],
    ["size", "llama-2-7b", "--ctx", "4096", "--json"],
    ["size", "deepseek-v3", "--ctx", "32k", "--tp", "8", "--json"],
    ["fit", "--gpu", "24GB", "--json"],
    ["fit", "--gpu", "L4", "--model", "llama-3.1-8b", "--json"],
    ["plan", "llama-3.1-8b", "--gpu", "H100", "--prompt", "500-3000", "--output", "100-800", "--users", "2000", "--json"],
]


def time_once(args: list[str]) -> float:
    exe = shutil.which("kvplan")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "kvplan", *args]
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def main(runs: int = 7) -> None:
    for args in COMMANDS:
        times = [time_once(args) for _ in range(runs)]
        print(f"{statistics.median(times):6.3f} s median ({min(times):.3f}-{max(times):.3f})  kvplan {' '.join(args)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
