"""The Python API against plain submitit on a real Slurm cluster (issue 32): the whole time to result of a
trivial function, the same shape through both (2 nodes x 1 task: slurmlaunch.submit(f).result() against
submitit's SlurmExecutor and results()), and of a 20-job map_array (time to all results); contenders
alternate (A B A B ...), every sample in a fresh process (timed from the submission to the result, imports
excluded). Reported: medians, min-max and the median of the paired ratios. Nothing is asserted (the dev
cluster shares a busy machine).

    python benchmarks/api.py [--pairs N] [--jobs N] [--count-queries N] [--cpu-per-job N [--no-compare]]

Every slurmlaunch source tree measured is byte-compiled first (compileall): an installed package has its .pyc
files, while a source tree run with PYTHONDONTWRITEBYTECODE=1 (set on this project's machines) would compile
every module in every rank of every job, about 20 ms of CPU a rank that no user pays.

Uses the cluster that $SLURM_CONF names (with accounting: sacct must answer), else brings up the dev cluster
(root, apt packages of tests/run.sh) for the run. --count-queries N: a map_array of N jobs through the API
with squeue and sacct wrapped by a counting shim on PATH; prints how many of each it made, and per minute.
--cpu-per-job N: where a job's CPU goes, which is what a map_array of short jobs waits on when the machine is
busy (the jobs run at once): an N-job map_array per contender whose function reports, from rank 0, its own
process's CPU before the call (the interpreter, submitit's imports and ours, the unpickling, the environment)
and that of the job's other processes on its node (the batch step, srun; read from /proc by $SLURM_JOB_ID,
which needs root or the same user), medians over the jobs, in clock ticks (10 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# One sample: submit, wait for the result(s), print the seconds between. argv: contender, jobs, folder.
_SAMPLE = r'''
import sys, time
contender, jobs, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def f(x):
    return x + 1

# Both import everything first (slurmlaunch's API loads on first use): the clock starts at the user's call.
import submitit
import slurmlaunch
slurmlaunch.submit

if contender == "slurmlaunch":
    opts = dict(nodes=2, tasks_per_node=1, scheduler="slurm", output_dir=folder, time="5")
    start = time.perf_counter()
    if jobs == 1:
        values = [slurmlaunch.submit(f, 1, **opts).result()]
    else:
        values = [j.result() for j in slurmlaunch.map_array(f, range(jobs), **opts)]
else:
    start = time.perf_counter()
    ex = submitit.SlurmExecutor(folder=folder + "/%j")
    ex.update_parameters(nodes=2, ntasks_per_node=1, time=5)
    if jobs == 1:
        values = [ex.submit(f, 1).results()[0]]
    else:
        values = [j.results()[0] for j in ex.map_array(f, range(jobs))]
took = time.perf_counter() - start
assert values == [x + 1 for x in range(1 if jobs == 1 else jobs)] or values == [2], values
print(took)
'''

# One job of --cpu-per-job: rank 0's CPU before the call, and the CPU of the job's other processes on its node.
_CPU_SAMPLE = r"""
import json, sys
contender, jobs, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def f(x):
    import os, resource
    used = resource.getrusage(resource.RUSAGE_SELF)
    tag, tick, others = f"SLURM_JOB_ID={os.environ['SLURM_JOB_ID']}".encode(), os.sysconf("SC_CLK_TCK"), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) == os.getpid() or tag not in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                continue
            stat = open(f"/proc/{pid}/stat").read()
            fields = stat[stat.rindex(")") + 2:].split()
            words = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            name = " ".join(w.decode(errors="replace") for w in words[1:4]) if b"python" in words[0] else \
                os.path.basename(words[0].decode(errors="replace"))
            others.append((name, (int(fields[11]) + int(fields[12])) / tick))
        except (OSError, ValueError, IndexError):
            pass
    return used.ru_utime + used.ru_stime, others

import submitit
import slurmlaunch
if contender == "slurmlaunch":
    jobs_ = slurmlaunch.map_array(f, range(jobs), nodes=2, tasks_per_node=1, scheduler="slurm", output_dir=folder,
                                  time="5")
    values = [j.result() for j in jobs_]
else:
    ex = submitit.SlurmExecutor(folder=folder + "/%j")
    ex.update_parameters(nodes=2, ntasks_per_node=1, time=5)
    values = [j.results()[0] for j in ex.map_array(f, range(jobs))]
print(json.dumps(values))
"""


def cpu_per_job(env: dict[str, str], jobs: int, pairs: int, work: Path, also: list[str]) -> dict[str, object]:
    """Where a job's CPU goes, per contender (see the module's docstring: --cpu-per-job)."""
    contenders = ["slurmlaunch", "submitit", *(f"slurmlaunch at {a}" for a in also)]
    found: dict[str, dict[str, list[float]]] = {c: {} for c in contenders}
    for _ in range(pairs):
        for name in contenders:
            kind, _, source = name.partition(" at ")
            folder = tempfile.mkdtemp(dir=work)
            r = subprocess.run([sys.executable, "-c", _CPU_SAMPLE, kind, str(jobs), folder], cwd=folder, timeout=900,
                               env={**env, "PYTHONPATH": source} if source else env, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{name}: {r.stderr[-3000:]}")
            for own, others in json.loads(r.stdout.strip().splitlines()[-1]):
                found[name].setdefault("rank 0 before the call", []).append(own)
                for process, cpu in others:
                    if "srun" not in process:  # srun's own: the same for both, and not where they differ
                        found[name].setdefault(process, []).append(cpu)
    print(f"\n## CPU per job, {jobs}-job map_array x {pairs} per contender ({load()} after)\n")
    print("| contender | process | median ms | jobs |")
    print("| --- | --- | ---: | ---: |")
    for name, processes in found.items():
        for process, xs in sorted(processes.items()):
            print(f"| {name} | {process} | {statistics.median(xs) * 1000:.0f} | {len(xs)} |")
    return {name: {p: statistics.median(xs) for p, xs in ps.items()} for name, ps in found.items()}


# The counting shim: every call of the wrapped client appends its name to $COUNT_FILE, then runs it.
_SHIM = '#!/bin/sh\necho "{name}" >> "$COUNT_FILE"\nexec {real} "$@"\n'


@contextmanager
def cluster(first_job_id: int = 1) -> Iterator[dict[str, str]]:
    """The cluster $SLURM_CONF names, or a dev cluster with accounting brought up for the run (its job ids
    from ``first_job_id``: a job's MASTER_PORT follows its id, so clusters side by side keep apart)."""
    if os.environ.get("SLURM_CONF"):
        yield dict(os.environ)
        return
    sys.path.insert(0, str(ROOT))
    from slurmlaunch.app.devcluster import slurm as devcluster

    root = Path(tempfile.mkdtemp(prefix="slurmlaunch-bench-cluster-"))
    try:
        env = devcluster.up(root, nodes=4, gpus=0, cpus=8, accounting=True, first_job_id=first_job_id)
        yield {**os.environ, **env}
    finally:
        devcluster.down(root)
        shutil.rmtree(root, ignore_errors=True)


def byte_compile(trees: list[Path]) -> None:
    """The .pyc files an installed slurmlaunch has (see the module's docstring)."""
    import compileall

    for tree in trees:
        compileall.compile_dir(str(tree / "slurmlaunch"), quiet=1)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def sample(env: dict[str, str], contender: str, jobs: int, work: Path) -> float:
    folder = tempfile.mkdtemp(dir=work)
    kind, _, source = contender.partition(" at ")  # "slurmlaunch at DIR": that source tree's slurmlaunch
    if source:
        env = {**env, "PYTHONPATH": source}
    for attempt in range(3):  # a job the busy dev cluster failed (no output at all) is run again, and said
        r = subprocess.run([sys.executable, "-c", _SAMPLE, kind, str(jobs), folder], env=env, cwd=folder,
                           capture_output=True, text=True, timeout=900)
        if r.returncode == 0:
            return float(r.stdout.strip().splitlines()[-1])
        last = r.stderr.strip().splitlines()[-1:] or ["(no output)"]
        print(f"(a sample of {contender} x {jobs} failed, attempt {attempt + 1} of 3: {last[0][:300]})")
        folder = tempfile.mkdtemp(dir=work)
    raise RuntimeError(f"{contender} x {jobs} failed 3 times: {r.stderr[-3000:]}")


def compare(env: dict[str, str], jobs: int, pairs: int, work: Path, also: list[str]) -> dict[str, object]:
    samples: dict[str, list[float]] = {"slurmlaunch": [], "submitit": [], **{f"slurmlaunch at {a}": [] for a in also}}
    before = load()
    for _ in range(pairs):
        for name in samples:
            samples[name].append(sample(env, name, jobs, work))
    ratios = [a / b for a, b in zip(samples["slurmlaunch"], samples["submitit"], strict=True)]
    what = "one 2x1 function" if jobs == 1 else f"map_array of {jobs} 2x1 functions (all results)"
    print(f"\n## API vs submitit: {what}, whole time to result\n\n{before} before, {load()} after\n")
    print("| contender | median s | min-max s |")
    print("| --- | ---: | ---: |")
    for name, xs in samples.items():
        print(f"| {name} | {statistics.median(xs):.2f} | {min(xs):.2f}-{max(xs):.2f} |")
    ratio = statistics.median(ratios)
    print(f"\npaired ratio slurmlaunch / submitit: median {ratio:.2f}x (min-max {min(ratios):.2f}-{max(ratios):.2f}; "
          f"below 1: slurmlaunch first)")
    for name in samples:
        if name.startswith("slurmlaunch at "):
            theirs = [a / b for a, b in zip(samples[name], samples["submitit"], strict=True)]
            print(f"paired ratio {name} / submitit: median {statistics.median(theirs):.2f}x")
    return {"jobs": jobs, "samples": samples, "ratio": ratio}


def count_queries(env: dict[str, str], jobs: int, work: Path, label: str = "") -> dict[str, float]:
    """A map_array of ``jobs`` through the API with squeue and sacct counted (a shim first on PATH)."""
    shims = work / "shims"
    shims.mkdir(exist_ok=True)  # the shims pass PYTHONPATH on: a --also tree's slurmlaunch is counted too
    for name in ("squeue", "sacct"):
        real = shutil.which(name, path=env["PATH"])
        if real is None:
            raise RuntimeError(f"{name} is not on PATH")
        (shims / name).write_text(_SHIM.format(name=name, real=real))
        (shims / name).chmod(0o755)
    count_file = work / "queries"
    count_file.write_text("")
    took = sample({**env, "PATH": f"{shims}:{env['PATH']}", "COUNT_FILE": str(count_file)}, "slurmlaunch", jobs,
                  work)
    calls = count_file.read_text().split()
    counts = {name: float(calls.count(name)) for name in ("squeue", "sacct")}
    print(f"\n## Scheduler queries of a {jobs}-job map_array through the API{label} (time to all results "
          f"{took:.1f} s)\n")
    for name, n in counts.items():
        print(f"- {name}: {n:.0f} ({n / took * 60:.1f} per minute)")
    return {**counts, "seconds": took}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=5, help="alternations per comparison (default 5)")
    p.add_argument("--jobs", type=int, default=20, help="map_array size (default 20; 0: skip)")
    p.add_argument("--count-queries", type=int, default=0, metavar="N", help="count the queries of an N-job map_array")
    p.add_argument("--cpu-per-job", type=int, default=0, metavar="N",
                   help="where a job's CPU goes: an N-job map_array per contender and pair (0: skip)")
    p.add_argument("--no-compare", action="store_true", help="skip the time-to-result comparisons")
    p.add_argument("--json", help="also write the samples to this file")
    p.add_argument("--first-job-id", type=int, default=1, metavar="N",
                   help="the dev cluster's first job id (default 1; apart from other clusters on the machine)")
    p.add_argument("--also", action="append", default=[], metavar="DIR",
                   help="another slurmlaunch source tree as a third contender (e.g. a checkout before a change)")
    a = p.parse_args()
    out: dict[str, object] = {}
    byte_compile([ROOT, *map(Path, a.also)])
    # ignore_cleanup_errors: a job whose values came early (every rank left its value) may still be ending, its
    # batch step writing its last files into the folder being removed
    with tempfile.TemporaryDirectory(prefix="slurmlaunch-bench-api-", ignore_cleanup_errors=True) as tmp, \
            cluster(a.first_job_id) as env:
        work = Path(tmp)
        if not a.no_compare:
            out["one"] = compare(env, 1, a.pairs, work, a.also)
        if a.jobs and not a.no_compare:
            out["map"] = compare(env, a.jobs, a.pairs, work, a.also)
        if a.cpu_per_job:
            out["cpu"] = cpu_per_job(env, a.cpu_per_job, a.pairs, work, a.also)
        if a.count_queries:
            out["queries"] = count_queries(env, a.count_queries, work)
            for source in a.also:
                out[f"queries at {source}"] = count_queries({**env, "PYTHONPATH": source}, a.count_queries, work,
                                                            f" (slurmlaunch at {source})")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
