"""Every slurmlaunch benchmark in one run: contenders alternate (A B C A B C ...), medians, min-max and
paired ratios. Nothing here is asserted: machines are noisy; the tests only check that this runs.

    python benchmarks/run.py            # the full run (about 15 minutes on 2 cores)
    python benchmarks/run.py --quick    # a short run (about a minute)

Measure from a regular install (pip install .), not an editable one: an editable install's import hook
adds start-up cost that users of a wheel never pay. The header says which one ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
NOOP = str(HERE / "noop.py")
FLOOR = str(HERE / "floor_launcher.py")
BARRIER = str(HERE / "barrier.py")


def slurm_env(rank: int, counts: list[int], job: int = 4242) -> dict[str, str]:
    """What srun sets for task ``rank`` of a block-distributed one-host step (names resolve: localhost)."""
    node, before = 0, 0
    while rank >= before + counts[node]:
        before += counts[node]
        node += 1
    nodelist = ",".join(["localhost"] * len(counts))
    total = str(sum(counts))
    return {"SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank - before), "SLURM_NODEID": str(node), "SLURM_STEP_NUM_TASKS": total,
            "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_NUM_NODES": str(len(counts)),
            "SLURM_STEP_TASKS_PER_NODE": ",".join(map(str, counts)), "SLURMD_NODENAME": "localhost",
            "SLURMLAUNCH_ALLOW_LOOPBACK": "1"}


def base_env() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM", "MASTER_", "RANK", "WORLD_", "LOCAL_", "TORCHELASTIC", "PET_"))}
    keep["OMP_NUM_THREADS"] = "1"
    return keep


_given_ports: list[int] = []


def free_port() -> int:
    """A port nothing listens on now: the next of SLURMLAUNCH_TEST_PORTS ("LO-HI", ports of their own that the
    tests hand this run, tests/ports.py), else one the kernel picks."""
    import socket

    if not _given_ports and os.environ.get("SLURMLAUNCH_TEST_PORTS"):
        lo, hi = (int(x) for x in os.environ["SLURMLAUNCH_TEST_PORTS"].split("-"))
        _given_ports.extend(range(lo, hi + 1))
    while _given_ports:
        port = _given_ports.pop(0)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ok(cmd: list[str], env: dict[str, str], cwd: str | None = None) -> float:
    start = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    took = time.perf_counter() - start
    if r.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {r.stderr.decode()[-2000:]}")
    return took


def run_many(cmds: list[tuple[list[str], dict[str, str]]]) -> float:
    """Start every command at once (the ranks of one job), return when all have ended."""
    start = time.perf_counter()
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c, e in cmds]
    errors = [p.communicate(timeout=600)[1] for p in procs]
    took = time.perf_counter() - start
    for p, err in zip(procs, errors, strict=True):
        if p.returncode != 0:
            raise RuntimeError(f"{p.args} failed: {err.decode()[-2000:]}")
    return took


def alternate(contenders: dict[str, Callable[[], float]], pairs: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(pairs):
        for name, fn in contenders.items():
            samples[name].append(fn())
    return samples


def table(title: str, samples: dict[str, list[float]], baseline: str, unit: str = "ms",
          scale: float = 1000.0) -> list[dict[str, object]]:
    """Median, min-max, and the median of the paired ratios (sample i / baseline sample i)."""
    print(f"\n## {title}\n")
    print(f"| contender | median {unit} | min-max {unit} | paired ratio vs {baseline} |")
    print("| --- | ---: | ---: | ---: |")
    rows = []
    base = samples[baseline]
    for name, xs in samples.items():
        ratios = [x / b for x, b in zip(xs, base, strict=True) if b > 0]
        ratio = statistics.median(ratios) if ratios else float("nan")
        med = statistics.median(xs)
        print(f"| {name} | {med * scale:.1f} | {min(xs) * scale:.1f}-{max(xs) * scale:.1f} | {ratio:.2f}x |")
        rows.append({"title": title, "contender": name, "median": med, "min": min(xs), "max": max(xs),
                     "ratio": ratio, "n": len(xs)})
    return rows


# --- 1. start-up -------------------------------------------------------------------------------------

def bench_startup(pairs: int) -> list[dict[str, object]]:
    env = base_env()
    one = dict(env, **slurm_env(0, [1]))
    preset = dict(env, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT="29500")
    slurmlaunch = shutil.which("slurmlaunch") or ""
    # as the batch scripts run it: the script through the RUNNER (returned marks), with the stacks armed or not
    marks = tempfile.mkdtemp(prefix="slurmlaunch-bench-")
    returned = dict(one, SLURMLAUNCH_RETURNED_DIR=marks)
    stacks = dict(returned, SLURMLAUNCH_STACKS_DIR=marks)
    contenders = {
        "python -S -I -c pass": lambda: run_ok([PY, "-S", "-I", "-c", "pass"], env),
        "python -c pass": lambda: run_ok([PY, "-c", "pass"], env),
        "direct: python noop.py (variables preset)": lambda: run_ok([PY, "-u", NOOP], preset),
        "slurmlaunch launch noop.py (Slurm step variables)": lambda: run_ok([slurmlaunch, "launch", NOOP], one),
        # what the generated batch scripts run: no console-script wrapper (pip's imports `re`)
        "python -m slurmlaunch launch noop.py": lambda: run_ok([PY, "-m", "slurmlaunch", "launch", NOOP], one),
        "the same through the RUNNER": lambda: run_ok([PY, "-m", "slurmlaunch", "launch", NOOP], returned),
        "the same through the RUNNER, stacks armed": lambda: run_ok([PY, "-m", "slurmlaunch", "launch", NOOP],
                                                                   stacks),
        "torchrun --standalone --nproc_per_node 1 noop.py": lambda: run_ok(
            [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", NOOP], env),
    }
    rows = table("Launcher start-up: one no-op rank", alternate(contenders, pairs),
                 "direct: python noop.py (variables preset)")
    med = {str(r["contender"]): float(r["median"]) for r in rows}  # type: ignore[arg-type]
    cost = med["slurmlaunch launch noop.py (Slurm step variables)"] - med["direct: python noop.py (variables preset)"]
    print(f"\nlauncher cost over a direct start: {cost * 1000:.1f} ms = "
          f"{cost / med['python -c pass']:.2f} x `python -c pass` (target <= 1.5)")
    cost_m = med["python -m slurmlaunch launch noop.py"] - med["direct: python noop.py (variables preset)"]
    print(f"the same through `python -m slurmlaunch launch` (as the batch scripts run it): {cost_m * 1000:.1f} ms = "
          f"{cost_m / med['python -c pass']:.2f} x `python -c pass`")
    rows.append({"title": "launcher cost", "contender": "launch - direct", "median": cost,
                 "ratio": cost / med["python -c pass"]})
    armed = med["the same through the RUNNER, stacks armed"] - med["the same through the RUNNER"]
    print(f"arming the stacks (faulthandler, RANK.pid; `slurmlaunch stacks`): {armed * 1000:+.1f} ms per rank")
    shutil.rmtree(marks, ignore_errors=True)

    two = [([slurmlaunch, "launch", NOOP], dict(env, **slurm_env(r, [2], job=7000))) for r in range(2)]
    direct2 = [([PY, "-u", NOOP], dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT="29500")) for r in range(2)]
    contenders = {
        "direct: 2 x python noop.py": lambda: run_many(direct2),
        "slurmlaunch launch x 2": lambda: run_many(two),
        "slurmlaunch run --nproc-per-node 2": lambda: run_ok(
            [slurmlaunch, "run", "--standalone", "--nproc-per-node", "2", NOOP], env),
        "torchrun --standalone --nproc_per_node 2": lambda: run_ok(
            [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", NOOP], env),
    }
    rows += table("A no-op job of 2 ranks (whole job)", alternate(contenders, pairs), "slurmlaunch launch x 2")
    return rows


def cpu_ok(cmd: list[str], env: dict[str, str]) -> float:
    """The CPU time (user + sys, seconds) of ``cmd``'s process and what it waited for: on a shared machine, the
    figure its load does not inflate as it inflates wall time."""
    pid = os.posix_spawn(cmd[0], cmd, env, file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd} failed ({os.waitstatus_to_exitcode(status)})")
    return usage.ru_utime + usage.ru_stime


def bench_startup_cpu(pairs: int) -> list[dict[str, object]]:
    """The launcher's start in CPU time, for each way a rank could start it (issue 30 part 6: the goal is
    (launch - direct) <= 1.5 x a bare interpreter's start): `python -m slurmlaunch` (what the batch scripts
    run), `python -c` importing the same entry (no runpy), and the console script pip writes; and the floor of
    any launcher, one that only execs the script (floor_launcher.py), as a file and under -m."""
    env = base_env()
    one = dict(env, **slurm_env(0, [1]))
    preset = dict(env, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT="29500")
    script = shutil.which("slurmlaunch") or ""
    bare = "python -c pass"
    direct = "direct: python noop.py (variables preset)"
    contenders = {
        bare: lambda: cpu_ok([PY, "-c", "pass"], env),
        direct: lambda: cpu_ok([PY, "-u", NOOP], preset),
        # the floor of any launcher: one that only execs the script, started as a file and with -m (runpy's imports)
        "python floor_launcher.py noop.py (exec, nothing else)": lambda: cpu_ok([PY, FLOOR, NOOP], env),
        "python -m floor_launcher noop.py (the same under -m)": lambda: cpu_ok(
            [PY, "-m", "floor_launcher", NOOP], dict(env, PYTHONPATH=str(HERE))),
        "python -m slurmlaunch launch noop.py": lambda: cpu_ok([PY, "-m", "slurmlaunch", "launch", NOOP], one),
        "python -c 'import slurmlaunch.__main__' launch noop.py": lambda: cpu_ok(
            [PY, "-c", "import slurmlaunch.__main__", "launch", NOOP], one),
        "slurmlaunch launch noop.py (pip's console script)": lambda: cpu_ok([script, "launch", NOOP], one),
    }
    samples = alternate(contenders, pairs)
    rows = table("Launcher start-up in CPU time (user + sys): one no-op rank", samples, direct)
    print(f"\n(X - direct) / `{bare}`, the median of the {pairs} alternations (target <= 1.5):")
    for name, xs in samples.items():
        if name in (bare, direct):
            continue
        ratios = [(x - d) / b for x, d, b in zip(xs, samples[direct], samples[bare], strict=True) if b > 0]
        print(f"- {name}: {statistics.median(ratios):.2f}x (quartiles "
              f"{statistics.quantiles(ratios, n=4)[0]:.2f}-{statistics.quantiles(ratios, n=4)[2]:.2f})"
              if len(ratios) > 1 else f"- {name}: {ratios[0] if ratios else float('nan'):.2f}x")
        rows.append({"title": "launcher cost in CPU", "contender": name,
                     "ratio": statistics.median(ratios) if ratios else float("nan")})
    return rows


# --- 1b. what runs beside the ranks: the rendezvous watchdog ------------------------------------------

def bench_watchdog(pairs: int, seconds: float = 2.0) -> list[dict[str, object]]:
    """The CPU that the launcher's watchdog (forked beside every rank but 0) takes while its rank imports
    torch: rank 1 of 2 sleeps ``seconds`` with nothing listening at MASTER_PORT, then reads its watchdog's
    CPU time from /proc. On 2 cores that CPU comes out of the ranks' imports, and the later rank 0 is
    ready, the likelier rank 1 sits out TCPStore's connect back-off (issue 30)."""
    env = base_env()
    slurmlaunch = shutil.which("slurmlaunch") or ""
    rank = str(HERE / "watchdog_rank.py")
    used: list[float] = []
    for _ in range(pairs):
        e = dict(env, **slurm_env(1, [2], job=7100), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        r = subprocess.run([slurmlaunch, "launch", rank, str(seconds)], env=e, capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"the watchdog benchmark's rank failed: {r.stderr[-2000:]}")
        used.append(float(r.stdout.strip().splitlines()[-1]))
    med = statistics.median(used)
    print(f"\n## The rendezvous watchdog beside a rank\n\nCPU the watchdog of rank 1 used while its rank ran "
          f"{seconds:g} s with nothing listening at MASTER_PORT: median {med * 1000:.0f} ms "
          f"({med / seconds * 100:.1f}% of a core; min-max {min(used) * 1000:.0f}-{max(used) * 1000:.0f} ms, "
          f"{len(used)} runs, clock ticks of {1000 / os.sysconf('SC_CLK_TCK'):.0f} ms)")
    return [{"title": "watchdog cpu", "contender": "slurmlaunch launch, rank 1", "median": med, "min": min(used),
             "max": max(used), "seconds": seconds, "n": len(used)}]


# --- 2. time to first barrier, whole job, rendezvous --------------------------------------------------

def _submitit_rank(out: str, t0: float) -> None:
    import json as _json
    import os as _os
    import time as _time

    import submitit
    import torch.distributed as tdist

    ready = _time.time()
    submitit.helpers.TorchDistributedEnvironment().export()
    tdist.init_process_group("gloo")
    tdist.barrier()
    done = _time.time()
    with open(out, "a") as f:
        f.write(_json.dumps({"rank": tdist.get_rank(), "ready": ready, "done": done}) + "\n")
    tdist.destroy_process_group()
    _os.environ.pop("MASTER_PORT", None)


def bench_barrier(ranks: list[int], pairs: int, workdir: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for n in ranks:
        rows += bench_barrier_n(n, pairs, workdir)
    return rows


def bench_barrier_n(n: int, pairs: int, workdir: Path) -> list[dict[str, object]]:
    env = base_env()
    slurmlaunch = shutil.which("slurmlaunch") or ""
    rows: list[dict[str, object]] = []
    results: dict[str, dict[str, list[float]]] = {}

    def measure(name: str, start_job: Callable[[dict[str, str]], None]) -> float:
        out = workdir / f"{name.replace(' ', '_').replace('/', '_')}-{n}.jsonl"
        out.unlink(missing_ok=True)
        job_env = dict(env, BENCH_OUT=str(out))
        t0 = time.time()
        start = time.perf_counter()
        start_job(job_env)
        whole = time.perf_counter() - start
        recs = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(recs) == n, (name, recs)
        first_barrier = max(r["done"] for r in recs) - t0
        rendezvous = max(r["done"] for r in recs) - max(r["ready"] for r in recs)
        res = results.setdefault(name, {"whole": [], "rdzv": [], "rank0_lag": []})
        res["whole"].append(whole)
        res["rdzv"].append(rendezvous)
        # rank 0 ready (torch imported) after every other rank: they reach its TCPStore before it listens
        zero = next(r["ready"] for r in recs if r["rank"] == 0)
        res["rank0_lag"].append(zero - max(r["ready"] for r in recs if r["rank"] != 0))
        return first_barrier

    def direct(e: dict[str, str], helper: bool = False) -> None:
        port = str(free_port())
        run_many([([PY, "-u", BARRIER, *(["--helper"] if helper else [])],
                   dict(e, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=port)) for r in range(n)])

    def launch(e: dict[str, str], helper: bool = False) -> None:
        job, port = 20000 + free_port() % 10000, str(free_port())
        run_many([([slurmlaunch, "launch", BARRIER, *(["--helper"] if helper else [])],
                   dict(e, **slurm_env(r, [n], job=job), MASTER_PORT=port)) for r in range(n)])

    def local(e: dict[str, str]) -> None:
        run_ok([slurmlaunch, "submit", "--scheduler", "local", "--tasks-per-node", str(n), "--output-dir",
                str(workdir / "logs"), BARRIER], e, cwd=str(workdir))

    def torchrun(e: dict[str, str]) -> None:
        run_ok([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), BARRIER], e)

    def submitit_local(e: dict[str, str]) -> None:
        import submitit

        ex = submitit.LocalExecutor(folder=str(workdir / "submitit"))
        ex.update_parameters(tasks_per_node=n, nodes=1, timeout_min=10)
        job = ex.submit(_submitit_rank, e["BENCH_OUT"], time.time())
        job.results()

    contenders = {
        "direct (env preset, floor)": lambda: measure("direct", direct),
        "slurmlaunch launch": lambda: measure("launch", launch),
        "slurmlaunch launch + helper": lambda: measure("launch+helper", lambda e: launch(e, helper=True)),
        "slurmlaunch submit --scheduler local": lambda: measure("local", local),
        "torchrun --standalone": lambda: measure("torchrun", torchrun),
        "submitit LocalExecutor": lambda: measure("submitit", submitit_local),
    }
    firsts = alternate(contenders, pairs)
    rows += table(f"{n} ranks: time to first barrier (from the command's start)", firsts,
                  "slurmlaunch launch", unit="s", scale=1.0)
    names = list(contenders)
    keys = ["direct", "launch", "launch+helper", "local", "torchrun", "submitit"]
    rows += table(f"{n} ranks: whole job", {nm: results[k]["whole"] for nm, k in zip(names, keys, strict=True)},
                  "slurmlaunch launch", unit="s", scale=1.0)
    rows += table(f"{n} ranks: rendezvous after the last rank is ready",
                  {nm: results[k]["rdzv"] for nm, k in zip(names, keys, strict=True)}, "torchrun --standalone")
    print(f"\nrank 0 the last of the {n} ranks to finish importing torch (its lag behind the last other rank):")
    for nm, k in zip(names, keys, strict=True):
        lags = results[k]["rank0_lag"]
        late = [x for x in lags if x > 0]
        print(f"- {nm}: {len(late)} of {len(lags)} runs" +
              (f" (lag median {statistics.median(late) * 1000:.0f} ms)" if late else ""))
    return rows


# --- 3. node lists ----------------------------------------------------------------------------------

def bench_hostlist(sizes: list[int], repeat: int) -> list[dict[str, object]]:
    sys.path.insert(0, str(HERE.parent))
    from slurmlaunch.core import hostlist

    try:
        import hostlist as python_hostlist  # the python-hostlist package
    except ImportError:
        python_hostlist = None
    print("\n## Node lists (in-process, best of several timeit runs)\n")
    print("| hosts | expression | first_host us | slurmlaunch expand ms | python-hostlist expand ms | ratio | "
          "scontrol show hostnames ms (process) |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    rows: list[dict[str, object]] = []
    for n in sizes:
        racks = max(1, n // 1000)
        expr = ",".join(f"rack{r:02d}-gpu[{0:04d}-{n // racks - 1:04d}]" for r in range(racks))
        assert hostlist.count(expr) == n

        def best(fn: Callable[[], object], number: int) -> float:
            return min(timeit.repeat(fn, number=number, repeat=repeat)) / number

        first = best(lambda e=expr: hostlist.first_host(e), 2000)  # type: ignore[misc]
        ours = best(lambda e=expr: hostlist.expand(e), 3)  # type: ignore[misc]
        theirs = (best(lambda e=expr: python_hostlist.expand_hostlist(e), 3)  # type: ignore[misc]
                  if python_hostlist else float("nan"))
        if python_hostlist:
            assert python_hostlist.expand_hostlist(expr) == hostlist.expand(expr)
        sc = float("nan")
        if shutil.which("scontrol") and os.environ.get("SLURM_CONF"):
            sc = min(run_ok(["scontrol", "show", "hostnames", expr], dict(os.environ)) for _ in range(repeat))
        short = expr if len(expr) < 40 else expr[:37] + "..."
        print(f"| {n} | `{short}` | {first * 1e6:.1f} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | "
              f"{theirs / ours:.1f}x | {sc * 1e3:.1f} |")
        rows.append({"title": "hostlist", "hosts": n, "first_host_s": first, "expand_s": ours,
                     "python_hostlist_s": theirs, "scontrol_s": sc})
    return rows


# --- 4. submit --dry-run and import cost -----------------------------------------------------------

def bench_cli(pairs: int, workdir: Path) -> list[dict[str, object]]:
    fake = workdir / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "sbatch").write_text("#!/bin/sh\nexit 0\n")
    (fake / "sbatch").chmod(0o755)
    env = dict(base_env(), PATH=f"{fake}:{os.environ['PATH']}")
    slurmlaunch = shutil.which("slurmlaunch") or ""
    contenders = {
        "python -c pass": lambda: run_ok([PY, "-c", "pass"], env),
        "python -c 'import jinja2'": lambda: run_ok([PY, "-c", "import jinja2"], env),
        "python -c 'import slurmlaunch'": lambda: run_ok([PY, "-c", "import slurmlaunch"], env),
        "slurmlaunch submit --dry-run": lambda: run_ok(
            [slurmlaunch, "submit", "--scheduler", "slurm", "--dry-run", "--nodes", "2", "--gpus-per-node", "4",
             NOOP], env, cwd=str(workdir)),
    }
    rows = table("CLI: submit --dry-run and import cost (whole processes)", alternate(contenders, pairs),
                 "python -c pass")
    med = {str(r["contender"]): float(r["median"]) for r in rows}  # type: ignore[arg-type]
    jinja = med["python -c 'import jinja2'"] - med["python -c pass"]
    budget = 2 * med["python -c pass"] + jinja
    import_cost = med["python -c 'import slurmlaunch'"] - med["python -c pass"]
    print(f"\n`submit --dry-run` {med['slurmlaunch submit --dry-run'] * 1000:.1f} ms vs target "
          f"2 x python -c pass + jinja2 import = {budget * 1000:.1f} ms; `import slurmlaunch` costs "
          f"{import_cost * 1000:.1f} ms over `python -c pass` (target <= 30)")
    return rows


# --- 5. scale on paper ------------------------------------------------------------------------------

def bench_scale(nodes: int, gpus: int) -> list[dict[str, object]]:
    sys.path.insert(0, str(HERE.parent))
    from slurmlaunch.core.detect import detect

    nodelist = f"gpu[{1:05d}-{nodes:05d}]"
    common = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": str(nodes * gpus),
              "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_NUM_NODES": str(nodes),
              "SLURM_STEP_TASKS_PER_NODE": f"{gpus}(x{nodes})", "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus)))}
    start = time.perf_counter()
    seen = set()
    masters = set()
    for rank in range(nodes * gpus):
        node, local = divmod(rank, gpus)
        env = dict(common, SLURM_PROCID=str(rank), SLURM_NODEID=str(node), SLURM_LOCALID=str(local),
                   SLURMD_NODENAME=f"gpu{node + 1:05d}")
        d = detect(env)
        seen.add((d.rank, d.node_rank, d.local_rank, d.local_device))
        masters.add((d.master_addr, d.master_port))
    took = time.perf_counter() - start
    ok = len(seen) == nodes * gpus and {r[0] for r in seen} == set(range(nodes * gpus)) and len(masters) == 1
    print(f"\n## Scale on paper\n\nthe mapping for every rank of a {nodes}-node x {gpus}-GPU job ({nodes * gpus} "
          f"ranks): {took:.2f} s in all, {took / (nodes * gpus) * 1e6:.0f} us per rank; bijection and one master: "
          f"{'yes' if ok else 'NO'}")
    return [{"title": "scale", "ranks": nodes * gpus, "seconds": took, "bijection": ok}]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a short run that checks every benchmark works: 2 pairs, "
                   "2 ranks, small node lists, the watchdog's rank 0.5 s")
    p.add_argument("--pairs", type=int, help="alternations per comparison (default 10, --quick 2)")
    p.add_argument("--ranks", default=None, help="rank counts for the barrier benchmark (default 2,4,8)")
    p.add_argument("--json", help="also write every row to this file")
    p.add_argument("--only", help="comma-separated sections: startup,startup-cpu,cli,hostlist,scale,watchdog,barrier "
                   "(default all)")
    a = p.parse_args()
    sections = set((a.only or "startup,startup-cpu,cli,hostlist,scale,watchdog,barrier").split(","))
    pairs = a.pairs or (2 if a.quick else 10)
    ranks = [int(x) for x in (a.ranks or ("2" if a.quick else "2,4,8")).split(",")]
    if not shutil.which("slurmlaunch"):
        print("slurmlaunch is not on PATH: pip install . first", file=sys.stderr)
        return 2
    editable = any("__editable__" in str(f) for f in Path(sys.prefix).glob("lib/python*/site-packages/*"))
    print(f"# slurmlaunch benchmarks, {time.strftime('%Y-%m-%d %H:%M')}\n")
    from importlib.metadata import version  # torch's version without importing it here (1.5 s of CPU)

    print(f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, torch {version('torch')}, "
          f"{'EDITABLE install (start-up numbers pessimistic)' if editable else 'regular install'}, "
          f"{pairs} alternations per comparison")
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="slurmlaunch-bench-") as tmp:
        work = Path(tmp)
        if "startup" in sections:
            rows += bench_startup(pairs)
        if "startup-cpu" in sections:
            rows += bench_startup_cpu(pairs if a.quick or a.pairs else 30)  # CPU ratios: more alternations
        if "cli" in sections:
            rows += bench_cli(pairs, work)
        if "hostlist" in sections:
            rows += bench_hostlist([1000, 10000] if a.quick else [1000, 10000, 100000], 3)
        if "scale" in sections:
            rows += bench_scale(64 if a.quick else 4096, 8)
        if "watchdog" in sections:
            rows += bench_watchdog(pairs, 0.5 if a.quick else 2.0)
        if "barrier" in sections:
            rows += bench_barrier(ranks, pairs, work)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
