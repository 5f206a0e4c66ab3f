"""What `slurmlaunch timeline`'s recording costs a rank (issue 42 part 3, target: under 1 ms a rank).

Two views, in one run:
1. The whole rank, end to end: `python -m slurmlaunch launch noop.py` with and without $SLURMLAUNCH_TIMELINE_DIR,
   alternating, in CPU time (user + sys of the rank and what it exec'd: the figure the machine's load does not
   inflate). Both run through the RUNNER ($SLURMLAUNCH_STACKS_DIR set, as every batch step sets it), so the
   difference is the timeline alone: the launcher's moments and the runner's import finder.
2. Each piece, in this process (timeit, in CPU time): the launcher importing allocation/timeline.py (from its .pyc), its
   write (its start from /proc plus one append of two lines), the runner arming its finder, the finder's
   answer for a module that is not torch times the modules a typical script imports before torch (counted in a
   child; torch's own never ask it), the two moments the runner writes (torch, rendezvous), and mark() the
   first time and every later time. Their sum is the rank's cost.

    python benchmarks/timeline.py [--pairs 30]

Nothing is asserted (machines are noisy); tests/real/test_benchmarks.py checks that it runs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import py_compile
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.run import NOOP, PY, base_env, cpu_ok, slurm_env  # noqa: E402
from slurmlaunch.allocation import timeline  # noqa: E402
from slurmlaunch.allocation.script_runner import RUNNER_FILE  # noqa: E402


def per_call(statement: object, number: int) -> float:
    """CPU seconds per call (this process's: the machine's load does not inflate it, where wall time here
    counts the other processes' turns), the best of 5 repeats of ``number`` calls."""
    return min(timeit.repeat(statement, number=number, repeat=5, timer=time.process_time)) / number  # type: ignore[arg-type]


# What a training script typically imports before torch: each module it loads asks the runner's finder (torch's
# own thousand do not: the finder leaves sys.meta_path as torch's import begins).
PRELUDE = "import argparse, dataclasses, json, logging, math, pathlib, random, time"


def modules_before_torch() -> int:
    """How many modules PRELUDE loads in a fresh interpreter (each one a question to the runner's finder)."""
    out = subprocess.run([PY, "-c", f"import sys; n = len(sys.modules); {PRELUDE}; print(len(sys.modules) - n)"],
                         capture_output=True, text=True, timeout=600)
    return int(out.stdout.strip()) if out.returncode == 0 else 0


def pieces(directory: str) -> dict[str, float]:
    environ = {timeline.TIMELINE_DIR: directory, "SLURMD_NODENAME": "node1"}
    namespace: dict[str, object] = {"__name__": "bench"}
    exec(Path(RUNNER_FILE).read_text(), namespace)
    arm = namespace["_slurmlaunch_timeline"]
    saved_path = list(sys.meta_path)
    os.environ["RANK"] = "0"

    def armed() -> None:
        arm(directory)  # type: ignore[operator]
        del sys.meta_path[0]

    armed()  # the finder, once, to time its answer
    arm(directory)  # type: ignore[operator]
    finder = sys.meta_path[0]
    answer = per_call(lambda: finder.find_spec("json.decoder", None, None), 200_000)  # type: ignore[union-attr]
    sys.meta_path[:] = saved_path
    moment = per_call(lambda: timeline.append(directory, "1", timeline.line(1, "node1", "torch")), 2000)
    os.environ[timeline.TIMELINE_DIR] = directory
    first_mark = per_call(lambda: (timeline._marked.clear(), timeline.mark("first step")), 2000)
    later_mark = per_call(lambda: timeline.mark("first step"), 200_000)
    modules = modules_before_torch()
    # its .pyc, as an installed package has it (pip compiles): with PYTHONDONTWRITEBYTECODE set (this machine's
    # shells) an editable checkout has none and every import below would compile the source (~1 ms more)
    py_compile.compile(timeline.__file__, cfile=importlib.util.cache_from_source(timeline.__file__), doraise=True)

    def imported() -> None:
        del sys.modules["slurmlaunch.allocation.timeline"]
        importlib.import_module("slurmlaunch.allocation.timeline")

    load = per_call(imported, 500)
    sys.modules["slurmlaunch.allocation.timeline"] = timeline
    return {
        "import allocation/timeline.py (its .pyc): in the launcher, and again in the script for mark()": 2 * load,
        "launcher: its start from /proc and one append of launch + exec":
            per_call(lambda: timeline.launched(environ, 0, timeline.process_start_ns()), 2000),
        "runner: arm the import finder": per_call(armed, 2000),
        f"runner: the finder's None for each of the {modules} modules `{PRELUDE}` loads": answer * modules,
        "runner: the finder's None for one module (not in the sum)": answer,
        "runner: the two moments it writes (torch, rendezvous)": 2 * moment,
        "mark('first step'), the first call": first_mark,
        "mark('first step'), every later call (not in the sum)": later_mark,
    }


def end_to_end(pairs: int, directory: str) -> tuple[list[float], list[float]]:
    env = dict(base_env(), **slurm_env(0, [1]), SLURMLAUNCH_STACKS_DIR=directory)
    timed = dict(env, **{timeline.TIMELINE_DIR: directory})
    cmd = [PY, "-m", "slurmlaunch", "launch", NOOP]
    without, with_ = [], []
    for _ in range(pairs):
        without.append(cpu_ok(cmd, env))
        with_.append(cpu_ok(cmd, timed))
    return without, with_


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=30)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        costs = pieces(directory)
        without, with_ = end_to_end(a.pairs, directory)
    print("\n## The timeline's own cost on one rank, piece by piece (this process, best of 5)\n")
    print("| piece | microseconds |\n| --- | ---: |")
    for name, seconds in costs.items():
        print(f"| {name} | {seconds * 1e6:.1f} |")
    total = sum(v for k, v in costs.items() if "not in the sum" not in k)
    print(f"| **sum: a rank's cost (target < 1000)** | **{total * 1e6:.1f}** |")
    ratios = [w / b for w, b in zip(with_, without, strict=True) if b > 0]
    diffs = [(w - b) * 1e3 for w, b in zip(with_, without, strict=True)]
    print(f"\n## A no-op rank end to end, CPU time (user + sys), {a.pairs} alternations\n")
    print("| contender | median ms | min-max ms |\n| --- | ---: | ---: |")
    print(f"| launch noop.py (the RUNNER, no timeline) | {statistics.median(without) * 1e3:.1f} | "
          f"{min(without) * 1e3:.1f}-{max(without) * 1e3:.1f} |")
    print(f"| launch noop.py with $SLURMLAUNCH_TIMELINE_DIR | {statistics.median(with_) * 1e3:.1f} | "
          f"{min(with_) * 1e3:.1f}-{max(with_) * 1e3:.1f} |")
    print(f"\npaired ratio (with / without): {statistics.median(ratios):.3f}x; paired difference: median "
          f"{statistics.median(diffs):+.2f} ms" + (f" (quartiles {statistics.quantiles(diffs, n=4)[0]:+.2f} to "
                                                   f"{statistics.quantiles(diffs, n=4)[2]:+.2f})"
                                                   if len(diffs) > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
