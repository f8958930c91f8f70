"""The console script `kvplan` and `python -m kvplan`: kvplan.cli.main for this process's arguments, without the
cyclic garbage collector, which is off before anything heavy is imported.

Why: a run is short and makes almost no reference cycles, but importing typer, rich and kvplan creates tens of
thousands of objects and `fit` over the catalog builds as many weight parts; the collector kept rescanning them (a
fifth of `kvplan fit --gpu 24GB`'s run, some 5% of the imports). On the way out the objects still alive are frozen
out of the collector, so the interpreter's exit does not run full collections over all of them (about 35 ms of a
cold `kvplan size`) to free memory the operating system takes back anyway. atexit handlers, flushes, and the
finalizers of objects freed by reference counting still run; explicit gc.collect() calls (verify's allocation
checks) still collect. Library callers (tests call kvplan.cli.main) keep the collector as it is.
"""

import gc


def run() -> None:
    gc.disable()
    from kvplan.cli import main

    try:
        main()
    finally:
        gc.freeze()
