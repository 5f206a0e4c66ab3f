"""--stage-env against a shared file system with latency (issue 42's targets): the networked dev cluster's nodes
read this checkout's venv from the latency file system of slurmlaunch.app.devcluster.sharedfs (sshfs per
node, in the node's own network and mount namespaces, served from the hub namespace, each chunk held
DELAY ms each way), and jobs of RANKS ranks per node run `import torch, torch.distributed` from it, unstaged
and with --stage-env on, on each node count of --nodes (one cluster of the largest count, one run).

What it prints, per job: the time from the batch step's start to every rank past `import torch` (the job's
timeline, allocation/timeline.py), split into the staging (the batch log's staged line: content key, space
check, sbcast, unpack), the ranks' task start and their import; each rank's import split by
/proc/self/schedstat into time on a CPU, waiting for a CPU (the emulated nodes share this machine's cores)
and the rest (waiting on the file system); and the requests and file bytes the shared file system served
(counted on the server side). Then the first pack of the environment (time, size), a second job's cache
hit (the content key over the shared copy: requests, time), and :func:`model`'s start-up at 512 nodes from
the counts measured here.

    python benchmarks/stage_env_fs.py [--nodes 1,2,4,8] [--ranks 4] [--delay-ms 1]
    python benchmarks/stage_env_fs.py --model-only        # the 512-node model from the last run's counts

Needs root, Slurm, sshfs and /dev/fuse. One run, numbers printed; not a timed test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurmlaunch.allocation.stage import content_key, ensure_pack, pack_path
from slurmlaunch.allocation.timeline import read as read_timeline
from slurmlaunch.app.devcluster import sharedfs
from slurmlaunch.app.devcluster import slurm as devcluster
from slurmlaunch.app.devcluster.netns import load_network
from slurmlaunch.core.timeline import build

# /proc/self/schedstat: ns on a CPU, ns runnable but waiting for one; the rest of the wall time the rank slept,
# here on the file system (the import does nothing else that blocks)
RANK = """
import json, os, sys, time
def sched():
    with open("/proc/self/schedstat") as f:
        return [int(x) / 1e9 for x in f.read().split()[:2]]
t0, (c0, q0) = time.time(), sched()
import torch, torch.distributed
t1, (c1, q1) = time.time(), sched()
out = {"done": t1, "import_s": t1 - t0, "cpu_s": c1 - c0, "cpu_wait_s": q1 - q0,
       "fs_wait_s": (t1 - t0) - (c1 - c0) - (q1 - q0), "prefix": sys.prefix}
with open(os.path.join(sys.argv[1], f"rank-{os.environ['RANK']}.json"), "w") as f:
    json.dump(out, f)
"""

LAST = Path(__file__).resolve().parent / "stage_env_fs-last.json"  # the last run's counts, for --model-only
GIB = 2**30


def _served(root: Path) -> tuple[int, int]:
    time.sleep(0.5)  # the server rewrites its counts every 0.2 s
    c = sharedfs.counts(root)
    return c.total, c.data_bytes


def _staged_line(log: str) -> dict[str, float]:
    """The staging's seconds by step, from the batch log's 'environment staged on ...' line."""
    m = re.search(r"environment staged on \d+ node\(s\) in \S+ \(([\d.]+)s: ([^)]*)\)", log)
    if not m:
        return {}
    steps = {"staging": float(m[1])}
    for part in m[2].split(", "):
        name, _, secs = part.rpartition(" ")
        steps[name] = float(secs.rstrip("s"))
    return steps


def _job(env: dict[str, str], root: Path, work: Path, python: str, nodes: int, ranks: int,
         stage: str) -> dict[str, object]:
    out = work / f"out-{nodes}-{stage}"
    out.mkdir()
    ops0, bytes0 = _served(root)
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "submit", "--nodes", str(nodes), "--tasks-per-node",
                        str(ranks), *([f"--stage-env={stage}"] if stage != "off" else []), "--python", python,
                        "--env", f"SLURMLAUNCH_STAGE_CACHE={work / 'cache'}",
                        "--env", f"SLURMLAUNCH_STAGE_DIR={work / 'node-local'}", "--wait",
                        str(work / "rank.py"), str(out)], env=env, cwd=work, capture_output=True, text=True,
                       timeout=1800)
    end = time.time()
    ops1, bytes1 = _served(root)
    recs = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    if r.returncode != 0 or len(recs) != nodes * ranks:
        print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"the {stage} job on {nodes} node(s) failed (exit {r.returncode}, {len(recs)} ranks)")
    job = re.search(r"submitted job (\d+)", r.stderr)
    assert job, r.stderr
    logs = work / "slurmlaunch-logs"
    tl = build(job[1], read_timeline(str(logs / f"job-{job[1]}.timeline")), nodes * ranks)
    torch_at = [m.time_ns for rank in tl.ranks for m in rank.moments if m.kind == "torch"]
    launch_at = [m.time_ns for rank in tl.ranks for m in rank.moments if m.kind == "launch"]
    batch_log = (logs / f"job-{job[1]}.batch.log").read_text(errors="replace")
    n = len(recs)
    return {"nodes": nodes, "ranks": n, "stage": stage, "job": job[1],
            "batch_to_imported_s": (max(torch_at) - tl.start_ns) / 1e9 if len(torch_at) == n else None,
            "batch_to_first_launch_s": (min(launch_at) - tl.start_ns) / 1e9 if launch_at else None,
            "submit_to_imported_s": max(x["done"] for x in recs) - t, "job_s": end - t,
            "import_s_max": max(x["import_s"] for x in recs),
            **{f"{k}_mean": sum(x[k] for x in recs) / n for k in ("import_s", "cpu_s", "cpu_wait_s", "fs_wait_s")},
            "cpu_s_sum": sum(x["cpu_s"] for x in recs),
            "requests": ops1 - ops0, "requests_per_node": (ops1 - ops0) / nodes, "bytes": bytes1 - bytes0,
            "staging": _staged_line(batch_log), "prefix": recs[0]["prefix"]}


def model(nodes: int, ranks: int, delay_ms: float, unstaged_requests_per_rank: float, key_requests: int,
          staged_requests_per_node: float, pack_bytes: int, unpack_s: float, import_cpu_s: float,
          server_requests_per_s: float = 50_000.0,
          link_bytes_per_s: float = 1.25e9, fanout: int = 16) -> dict[str, float]:
    """Start-up to every rank past `import torch`, modelled for ``nodes`` x ``ranks`` from measured counts.

    Unstaged: each rank's import is a chain of ``unstaged_requests_per_rank`` round trips (one import waits for
    each answer before the next request: 2 x ``delay_ms`` each), and the shared file system's servers answer
    at most ``server_requests_per_s`` for all the ranks together (50,000/s: an assumed metadata rate, a
    site's own figure belongs here); the slower of the two bounds it, plus the import's CPU.
    Staged: the content key's ``key_requests`` round trips once per job, ``staged_requests_per_node`` (the
    interpreter that checks the space and holds the copy on each node starts from the shared prefix); the
    pack (``pack_bytes``) read once from the shared file system and sent by sbcast down a tree of ``fanout``
    children per node (Slurm's TreeWidth; each level forwards the whole pack: a depth of ceil(log_fanout(nodes))
    levels, at ``link_bytes_per_s`` per link, 10 Gb/s by default); the unpack on every node at once (``unpack_s``,
    measured); then the import from the node-local copy (its CPU only). The shared file system serves the
    staged job ``key_requests`` + the pack's reads + ``staged_requests_per_node`` per node, whatever
    ``ranks``."""
    rt = 2 * delay_ms / 1000.0
    total_requests = nodes * ranks * unstaged_requests_per_rank
    chain_s = unstaged_requests_per_rank * rt
    server_s = total_requests / server_requests_per_s
    depth = max(1, math.ceil(math.log(nodes, fanout))) if nodes > 1 else 1
    pack_read_s = pack_bytes / link_bytes_per_s
    sbcast_s = depth * pack_bytes / link_bytes_per_s
    staged = key_requests * rt + pack_read_s + sbcast_s + unpack_s + import_cpu_s
    return {"nodes": nodes, "ranks": nodes * ranks,
            "unstaged_requests": total_requests, "unstaged_round_trip_chain_s": chain_s,
            "unstaged_server_s": server_s, "unstaged_s": max(chain_s, server_s) + import_cpu_s,
            "unstaged_requests_per_node": ranks * unstaged_requests_per_rank,
            "staged_requests": key_requests + nodes * staged_requests_per_node + pack_bytes / 65536,
            "staged_requests_per_node": staged_requests_per_node + key_requests / nodes,
            "staged_key_s": key_requests * rt,
            "staged_sbcast_depth": depth, "staged_sbcast_s": sbcast_s, "staged_s": staged}


def print_model(counts: dict[str, float], delay_ms: float) -> None:
    print(f"\nmodel (benchmarks/stage_env_fs.py model()), {delay_ms} ms each way, from the measured counts: "
          f"{counts['requests_per_rank']:.0f} requests per unstaged rank, {counts['key_requests']:.0f} for the "
          f"content key, {counts['staged_requests_per_node']:.0f} per node of a staged job, a pack of "
          f"{counts['pack_bytes'] / GIB:.2f} GiB, unpack {counts['unpack_s']:.1f} s, "
          f"import CPU {counts['import_cpu_s']:.1f} s; assumed 50,000 requests/s for the servers, 10 Gb/s "
          "links, sbcast fan-out 16")
    for nodes in (1, 8, 64, 512):
        m = model(nodes, 4, delay_ms, counts["requests_per_rank"], int(counts["key_requests"]),
                  counts["staged_requests_per_node"], int(counts["pack_bytes"]), counts["unpack_s"],
                  counts["import_cpu_s"])
        print(f"  {nodes:4d} nodes x 4: unstaged {m['unstaged_requests']:>12,.0f} requests "
              f"({m['unstaged_requests_per_node']:,.0f} a node), "
              f"{m['unstaged_s']:6.1f} s (round-trip chain {m['unstaged_round_trip_chain_s']:.1f} s, servers "
              f"{m['unstaged_server_s']:.1f} s); staged {m['staged_requests']:>8,.0f} requests "
              f"({m['staged_requests_per_node']:,.0f} a node, the pack's reads apart), {m['staged_s']:5.1f} s "
              f"(key {m['staged_key_s']:.2f} s, sbcast depth {m['staged_sbcast_depth']} {m['staged_sbcast_s']:.1f} s)")
    for nodes in (1, 512):
        fast = model(nodes, 4, delay_ms, counts["requests_per_rank"], int(counts["key_requests"]),
                     counts["staged_requests_per_node"], int(counts["pack_bytes"]), counts["pack_bytes"] / 1e9,
                     counts["import_cpu_s"])
        print(f"  {nodes:4d} nodes x 4, the unpack at 1 GB/s (a node's own NVMe, assumed; here "
              f"{counts['unpack_s']:.1f} s on this loaded machine): staged {fast['staged_s']:.1f} s against "
              f"unstaged {fast['unstaged_s']:.1f} s ({fast['staged_s'] / fast['unstaged_s']:.2f}x)")


def _node_local(root: Path, slurmd: int, where: Path, node: int, tmpfs: bool) -> None:
    """Each node's own node-local directory at the same path, in its slurmd's mount namespace."""
    if tmpfs:
        cmd = ["mount", "-t", "tmpfs", "-o", "size=3g", "tmpfs", str(where)]
    else:
        own = root / f"disk-node{node}"
        own.mkdir()
        cmd = ["mount", "--bind", str(own), str(where)]
    subprocess.run(["nsenter", "-t", str(slurmd), "-m", *cmd], check=True, timeout=30)


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for ln in f:
            if ln.startswith("MemAvailable:"):
                return int(ln.split()[1]) * 1024
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", default="1", help="node counts, comma-separated (1,2,4,8)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--delay-ms", type=float, default=1.0)
    p.add_argument("--node-local", choices=("auto", "tmpfs", "disk"), default="auto",
                   help="each node's node-local directory: a tmpfs, or a directory of this machine's disk (auto: "
                        "a tmpfs when memory holds 2.6 GiB per node and 4 GiB to spare)")
    p.add_argument("--model-only", action="store_true")
    a = p.parse_args()
    try:
        counts_list = sorted({int(x) for x in a.nodes.split(",")})
        assert counts_list and counts_list[0] > 0
    except (ValueError, AssertionError):
        print(f"--nodes {a.nodes!r}: expected node counts, comma-separated, such as 1,2,4,8", file=sys.stderr)
        return 2
    if a.model_only:
        print_model(json.loads(LAST.read_text()), a.delay_ms)
        return 0
    print(f"uptime: {os.popen('uptime').read().strip()}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped (SIGTERM): the cluster and the mounts go"))
    venv = os.path.realpath(sys.prefix)
    root = Path(tempfile.mkdtemp(prefix="stage-fs-"))
    work = root / "work"
    work.mkdir()
    (work / "rank.py").write_text(RANK)
    (work / "node-local").mkdir()
    shared = root / "shared" / os.path.basename(venv)
    most = counts_list[-1]
    # a tmpfs per node holds the pack and its copy (2 x 1.2 GiB at the peak): only when memory allows
    tmpfs = a.node_local == "tmpfs" or a.node_local == "auto" and most * 2.6 * GIB < _mem_available() - 4 * GIB
    env = {**os.environ, **devcluster.up(root / "cluster", nodes=most, gpus=a.ranks, cpus=max(8, a.ranks),
                                         netns=True)}
    env.pop("SLURMLAUNCH_ALLOW_LOOPBACK", None)
    results: list[dict[str, object]] = []
    try:
        net = load_network(root / "cluster")
        assert net is not None
        sharedfs.serve(root / "cluster", net, a.delay_ms)
        for i in range(1, most + 1):
            slurmd = int((root / "cluster" / f"slurmd-node{i}.pid").read_text())
            sharedfs.mount(root / "cluster", net, i, venv, shared, mount_ns_of=slurmd)
            _node_local(root, slurmd, work / "node-local", i, tmpfs)
        print(f"node-local directories: {'a tmpfs' if tmpfs else 'a directory of the shared disk'} per node")
        sharedfs.mount(root / "cluster", net, 1, venv, shared)  # this client's view, for the cache's key

        # the first pack (from the local venv: over 1 ms sshfs it would be the walk and read of 38,000 files)
        t = time.monotonic()
        pack, size, made = ensure_pack(venv, str(root / "first-pack"),
                                       lambda cmd: subprocess.run(cmd, stdin=subprocess.DEVNULL).returncode)
        first_s = time.monotonic() - t
        assert made
        # a second job's cache hit: the content key over the shared copy (what the batch step computes)
        r0 = _served(root / "cluster")[0]
        t = time.monotonic()
        key = content_key(str(shared))
        key_s = time.monotonic() - t
        key_requests = _served(root / "cluster")[0] - r0
        (work / "cache").mkdir()
        os.rename(pack, pack_path(str(shared), str(work / "cache"), key))
        print(f"first pack: {size / GIB:.2f} GiB in {first_s:.1f} s (tar of {venv}, this machine's disk); "
              f"a second job's cache hit: the content key over the shared copy, {key_requests} requests, "
              f"{key_s:.2f} s")

        python = str(shared / "bin" / "python")
        for nodes in counts_list:
            for stage in ("off", "on"):
                res = _job(env, root / "cluster", work, python, nodes, a.ranks, stage)
                print(json.dumps(res), flush=True)
                results.append(res)
    finally:
        sharedfs.stop(root / "cluster")
        for i in range(1, most + 1):
            pid = root / "cluster" / f"slurmd-node{i}.pid"
            if pid.exists():
                subprocess.run(["nsenter", "-t", pid.read_text().strip(), "-m", "umount", "-l",
                                str(work / "node-local")], capture_output=True)
        devcluster.down(root / "cluster")
        shutil.rmtree(root, ignore_errors=True)

    print(f"\n{a.ranks} ranks per node, {a.delay_ms} ms each way; times from the batch step's start to every "
          "rank past `import torch` (the job's timeline)")
    print("nodes | unstaged s | staged s | staged/unstaged | staging (key, check, sbcast, unpack) | "
          "rank import: fs wait / CPU / CPU wait, unstaged vs staged | requests per node | round trips x "
          "latency per rank")
    rt = 2 * a.delay_ms / 1000
    for nodes in counts_list:
        off, on = (next(r for r in results if r["nodes"] == nodes and r["stage"] == s) for s in ("off", "on"))
        uo, so = float(off["batch_to_imported_s"]), float(on["batch_to_imported_s"])  # type: ignore[arg-type]
        st = on["staging"]
        assert isinstance(st, dict)
        per_rank = float(off["requests"]) / float(off["ranks"])  # type: ignore[arg-type]
        print(f"{nodes} | {uo:.1f} | {so:.1f} | {so / uo:.2f} | {st.get('staging', 0):.1f} "
              f"({', '.join(f'{v:.1f}' for k, v in st.items() if k != 'staging')}) | "
              f"{off['fs_wait_s_mean']:.1f}/{off['cpu_s_mean']:.1f}/{off['cpu_wait_s_mean']:.1f} vs "
              f"{on['fs_wait_s_mean']:.2f}/{on['cpu_s_mean']:.1f}/{on['cpu_wait_s_mean']:.1f} | "
              f"{off['requests_per_node']:.0f} vs {on['requests_per_node']:.0f} | "
              f"{per_rank * rt:.1f} s vs 0")
    one_off = next(r for r in results if r["nodes"] == counts_list[0] and r["stage"] == "off")
    one_on = next(r for r in results if r["nodes"] == counts_list[0] and r["stage"] == "on")
    st = one_on["staging"]
    assert isinstance(st, dict)
    staged = [(int(str(r["nodes"])), float(str(r["requests"]))) for r in results if r["stage"] == "on"]
    (n0, q0), (n1, q1) = staged[0], staged[-1]
    # what each further node adds (its space check's and holder's interpreters), or with one count the rest
    per_node = (q1 - q0) / (n1 - n0) if n1 > n0 else max(0.0, q0 - key_requests) / n0
    counts = {"requests_per_rank": float(one_off["requests"]) / float(one_off["ranks"]),  # type: ignore[arg-type]
              "key_requests": key_requests, "staged_requests_per_node": per_node, "pack_bytes": size,
              "unpack_s": st.get("unpack", 0.0),
              "import_cpu_s": float(one_on["cpu_s_mean"])}  # type: ignore[arg-type]
    LAST.write_text(json.dumps(counts))
    print_model(counts, a.delay_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
