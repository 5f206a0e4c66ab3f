"""The client matrix: scripts written the way Lightning (its Trainer and Fabric), accelerate, pytorch-ignite,
idr-torch and PyTorch's multi-node DDP tutorial teach (tests/clients/, nothing in them about slurmlaunch) run
unchanged through every way slurmlaunch starts a world: the local default, real Slurm in srun mode and in
--mode torchrun, `slurmlaunch run` with two "nodes", the Python API, and real PBS (mpiexec). The oracle is
each library's own view of the world it joined (its rank, its world size, the cluster environment it
detected) and the trained parameters, which must be the same on every rank (each rank trained on its own
shard, so only working gradient averaging makes them equal).

Cost: one job per client and way, 2 steps each, the jobs of one way concurrently. Every rank is a Python
that imports torch (and Lightning or accelerate: 2-6 s of CPU a rank), so the worlds are 2 nodes x 1 rank:
still a job of several tasks, where Lightning's refusal of SLURM_NTASKS without SLURM_NTASKS_PER_NODE, the
bug this matrix was made for, shows. 2 x 2 in the real srun step (several ranks per node, SLURM_LOCALID)
measured 50 s of CPU against 24 s; the launcher's per-node mapping is tested elsewhere. The Python API runs
on real Slurm (submitit's sbatch and srun); its local executor gives the ranks the local scheduler's
variables, which the local default covers. The whole matrix alone on this 2-core machine kind: 375 s of CPU and
241 s of wall (docs/reference/works-with.md), about a fifth of the suite's CPU."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import no_slurm_env, skip_or_fail, teardown_abort_only
from tests.ports import port as free_port

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
ROOT = CLIENTS.parent.parent
NODES = 2
PER_NODE = {"local": 1, "srun": 1, "torchrun": 1, "run": 1, "api": 1, "pbs": 1}  # ranks per node, by way
NAMES = ("lightning", "fabric", "accelerate", "ddp", "ignite-parallel", "ignite-initialize", "idr")
# What each library says it detected, by the way the world was started. Lightning reads Slurm's variables
# when a Slurm step (real or emulated) started the task, torchrun's when its agent did, and otherwise its own
# (LOCAL_RANK/NODE_RANK/WORLD_SIZE); accelerate and the tutorial read only torch's variables.
LIGHTNING_ENV = {"local": "SLURMEnvironment", "srun": "SLURMEnvironment", "torchrun": "TorchElasticEnvironment",
                 "run": "TorchElasticEnvironment", "api": "SLURMEnvironment", "pbs": "MPIEnvironment"}
# idr-torch picks Slurm's variables where a Slurm step (real or emulated) started the task, torchrun's where
# torchrun's agent did (--mode torchrun: its workers are no tasks of the step) or `run` says it is torchrun.
IDR_ENV = {"local": "Slurm", "srun": "Slurm", "torchrun": "TorchElastic", "run": "TorchElastic", "api": "Slurm"}
# The ways whose ranks are told torchrun started them (TORCHELASTIC_RUN_ID): torch.distributed's view
ELASTIC = ("torchrun", "run")
# What a user sets, per library, for CPU-only nodes (README: Works with): accelerate's Accelerator() joins a
# world only on an accelerator, or on the CPU when told so (`accelerate launch --cpu` exports the same variable);
# under plain torchrun on a CPU-only machine it stays one process per rank just the same.
SETTINGS = {"accelerate": {"ACCELERATE_USE_CPU": "1"}}
# What this machine needs, not the libraries: every rank of a way's 7 jobs shares this machine's two cores (14
# at once), and torch gives each one thread per core by default (a world of 1 rank per node is no reason for
# slurmlaunch to set it, nor for torchrun). One thread each cut the local default's matrix from 72.5 to 58.1 s
# of CPU (2026-12-07); the ranks' answers are the same.
MACHINE = {"OMP_NUM_THREADS": "1"}
RECORD = re.compile(r"CLIENT ([\w-]+) (.*)$", re.M)


@pytest.fixture(scope="module")
def clients_installed() -> None:
    # found, not imported: the ranks import them (a broken install fails there, loudly); importing all five here
    # cost every worker's test process 8 s of CPU (Lightning alone 3-4 s) for nothing it uses
    from importlib.util import find_spec

    for module in ("torch", "lightning", "accelerate", "ignite", "idr_torch"):
        if find_spec(module) is None:
            skip_or_fail(f"{module} is not installed (pip install -e '.[test]' pins the client versions)")


def argv(name: str, workdir: Path, per_node: int, epochs: int = 2) -> list[str]:
    """The command line a user of that library would write for NODES x per_node ranks."""
    if name in ("lightning", "fabric"):
        script = "lightning_fit.py" if name == "lightning" else "fabric_loop.py"
        return [str(CLIENTS / script), "--devices", str(per_node), "--num-nodes", str(NODES)]
    if name == "accelerate":
        return [str(CLIENTS / "accelerate_loop.py"), "--steps", "2"]
    if name.startswith("ignite-"):
        return [str(CLIENTS / "ignite_train.py"), "--style", name.split("-", 1)[1], "--epochs", "2"]
    if name == "idr":
        return [str(CLIENTS / "idr_torch_train.py"), "--epochs", "2"]
    return [str(CLIENTS / "ddp_snapshot.py"), str(epochs), "1", "--snapshot", str(workdir / "snapshot.pt")]


def settings(name: str) -> dict[str, str]:
    """The variables a job of that client is given: the library's (SETTINGS) and this machine's (MACHINE)."""
    return {**SETTINGS.get(name, {}), **MACHINE}


def env_options(name: str) -> list[str]:
    return [f"--env={k}={v}" for k, v in settings(name).items()]


def records(text: str, name: str) -> list[dict[str, str]]:
    out = []
    for client, rest in RECORD.findall(text):
        if client == name:
            fields = rest.split(" state=[", 1)  # accelerate's own description of its state, printed whole
            out.append(dict(re.findall(r"(\w+)=(\S+)", fields[0])))
    return out


def check(text: str, name: str, way: str) -> list[dict[str, str]]:
    """Every rank reported once, with the library's own rank and world size, and the same trained
    parameters (changed by training) on every rank; the library's view of its environment is printed."""
    got = records(text, name)
    per_node = PER_NODE[way.split("-")[0]]
    world = NODES * per_node
    for line in RECORD.findall(text):  # the library's view, in the test's output
        print(way, *line)
    assert sorted(int(r["rank"]) for r in got) == list(range(world)), text[-4000:]
    assert {r["world"] for r in got} == {str(world)}, got
    assert sorted(int(r["local_rank"]) for r in got) == sorted(list(range(per_node)) * NODES), got
    assert len({r["params"] for r in got}) == 1, f"parameters differ between ranks: {got}"
    assert got[0]["params"] != got[0]["before"], f"training changed nothing: {got}"
    if name in ("lightning", "fabric"):  # Fabric chooses its cluster environment as the Trainer does
        assert {r["env"] for r in got} == {LIGHTNING_ENV[way.split("-")[0]]}, got
        # the cluster environment's own answers agree with the trainer's
        assert all(r["env_rank"] == r["rank"] and r["env_world"] == str(world) for r in got), got
        assert {r["steps"] for r in got} == {"2"}, got
    elif name == "accelerate":
        assert {(r["env"], r["backend"]) for r in got} == {("DistributedType.MULTI_CPU", "gloo")}, got
        assert {r["steps"] for r in got} == {"2"}, got
    elif name.startswith("ignite-"):
        assert {(r["env"], r["backend"], r["nodes"], r["epochs"]) for r in got} == {
            ("native-dist", "gloo", str(NODES), "2")}, got
        assert sorted(int(r["node"]) for r in got) == sorted(list(range(NODES)) * per_node), got
    elif name == "idr":
        assert {r["env"] for r in got} == {IDR_ENV[way.split("-")[0]]}, got
        assert all(r["torch_rank"] == r["rank"] and r["torch_world"] == str(world) for r in got), got
        assert {r["nodes"] for r in got} == {str(NODES)}, got
    else:  # the ranks of torchrun and of `run` are told torchrun started them; every other way is env:// alone
        expected = "torchelastic" if way in ELASTIC else "env://"
        assert {r["env"] for r in got} == {f"torch.distributed:{expected}"}, got
    return got


def job_text(workdir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((workdir / "slurmlaunch-logs").glob("*.log")))


def succeeded(code: int, console: str, workdir: Path) -> bool:
    """Exit 0, or a failure that is only torch's teardown abort (README: Teardown aborts); the training's
    output is checked in full either way."""
    batch = "".join(p.read_text(errors="replace") for p in (workdir / "slurmlaunch-logs").glob("*.batch.log"))
    return code == 0 or teardown_abort_only(console + batch)


def run_together(commands: dict[str, tuple[list[str], dict[str, str], Path]],
                 timeout: float = 300) -> dict[str, tuple[int, str]]:
    """Starts every command at once (one job per client: their start-ups and waits overlap), each with its
    output in a file (no pipe to fill up while another is waited for); exit code and output by name. A
    command still running at the deadline is interrupted and reported as such."""
    started = {}
    for key, (cmd, env, cwd) in commands.items():
        out = (cwd / f"console-{key}.txt").open("w")
        started[key] = (subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True),
                        out, cwd / f"console-{key}.txt")
    deadline = time.monotonic() + timeout
    results = {}
    for key, (proc, out, path) in started.items():
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            # Ctrl-C: the local scheduler and `run` stop their ranks, `submit --wait --cancel-on-interrupt`
            # cancels the Slurm job; SIGKILL only if that did not end it
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            code = -9999  # not a code any process returns: the deadline passed
        out.close()
        results[key] = (code, path.read_text(errors="replace"))
    return results


def submit(*options: str) -> list[str]:
    return [sys.executable, "-m", "slurmlaunch", "submit", *options]


# --- the local default --------------------------------------------------------------------------------------

def test_local_default(tmp_path: Path, clients_installed: None) -> None:
    per_node = PER_NODE["local"]
    shape = ["--nodes", str(NODES), "--tasks-per-node", str(per_node)]
    # idr-torch takes MASTER_ADDR from the node list itself: the local nodes' names resolve (127.0.0.1 + I)
    dirs = {name: workdir_for(tmp_path, name) for name in NAMES}
    # no sbatch on PATH: --scheduler auto picks the local scheduler, as on a laptop
    done = run_together({name: (submit(*shape, *env_options(name), *argv(name, d, per_node)), no_slurm_env(d), d)
                         for name, d in dirs.items()})
    for name, (code, console) in done.items():
        assert "local job" in console and succeeded(code, console, dirs[name]), f"{name}: {console[-4000:]}"
        check(job_text(dirs[name]), name, "local")
    # the tutorial's snapshot resume: a second job with one more epoch starts from the first job's weights
    d = dirs["ddp"]
    first = records(job_text(d), "ddp")
    for log in (d / "slurmlaunch-logs").glob("*.log"):
        log.unlink()
    again_cmd = submit(*shape, *env_options("ddp"), *argv("ddp", d, per_node, 3))
    code, console = run_together({"again": (again_cmd, no_slurm_env(d), d)})["again"]
    assert succeeded(code, console, d), console[-4000:]
    text = job_text(d)
    again = check(text, "ddp", "local")
    assert text.count("resuming training from snapshot at epoch 2") == NODES * per_node, text[-3000:]
    assert {r["epochs"] for r in again} == {"2->3"} and again[0]["before"] == first[0]["params"], again


def workdir_for(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    return d


# --- real Slurm: srun mode and --mode torchrun --------------------------------------------------------------

@pytest.mark.slurm
@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_real_slurm(mode: str, netns_cluster_env: dict[str, str], tmp_path: Path, clients_installed: None) -> None:
    # on the networked cluster: node1 and node2 are different hosts to the libraries (MASTER_ADDR is node1's
    # own address, reached over the bridge), and no port is shared with another cluster on this machine
    per_node = PER_NODE[mode]
    shape = ["--nodes", str(NODES), "--time", "5", "--wait", "--wait-timeout", "280", "--cancel-on-interrupt"]
    shape += (["--tasks-per-node", str(per_node)] if mode == "srun"
              else ["--mode", "torchrun", "--nproc-per-node", str(per_node)])
    dirs = {name: workdir_for(tmp_path, name) for name in NAMES}
    done = run_together({name: (submit(*shape, *env_options(name), *argv(name, d, per_node)), netns_cluster_env,
                                d) for name, d in dirs.items()}, timeout=320)
    for name, (code, console) in done.items():
        d = dirs[name]
        assert succeeded(code, console, d), f"{name}: {console[-3000:]}\n{job_text(d)[-3000:]}"
        check(job_text(d), name, mode)


# --- `slurmlaunch run`, two "nodes" on this machine -------------------------------------------------------

def test_run_two_nodes(tmp_path: Path, clients_installed: None) -> None:
    per_node = PER_NODE["run"]
    commands = {}
    for name in NAMES:
        d = workdir_for(tmp_path, name)
        port = str(free_port())
        for node in range(NODES):
            commands[f"{name}-{node}"] = (
                [sys.executable, "-m", "slurmlaunch", "run", "--nnodes", str(NODES), "--node-rank", str(node),
                 "--master-addr", "127.0.0.1", "--master-port", port, "--allow-loopback", "--cpu",
                 "--nproc-per-node", str(per_node), *argv(name, d, per_node)],
                dict(no_slurm_env(d), **settings(name)), d)
    done = run_together(commands)
    for name in NAMES:
        text = ""
        for node in range(NODES):
            code, console = done[f"{name}-{node}"]
            assert code == 0 or teardown_abort_only(console), f"{name} node {node}: {console[-3000:]}"
            text += console
        check(text, name, "run")


# --- the Python API (submitit underneath) ---------------------------------------------------------------------

API_CODE = """
import json, sys
import slurmlaunch
from tests.real.test_clients import NAMES, NODES, PER_NODE, argv, settings
per_node = PER_NODE["api"]
from pathlib import Path
scheduler, root = sys.argv[1], Path(sys.argv[2])
jobs = {}
for name in NAMES:
    d = root / name
    d.mkdir()
    script, *args = argv(name, d, per_node)
    jobs[name] = slurmlaunch.submit_script(script, args, scheduler=scheduler, nodes=NODES, tasks_per_node=per_node,
                                           time="5", output_dir=str(d / "logs"), env=settings(name))
out = {}
for name, job in jobs.items():
    try:
        codes = job.results()
    except slurmlaunch.RankFailed as e:
        codes = [str(e)]
    out[name] = [codes, "".join(job.logs(rank) for rank in range(NODES * per_node))]
print("API " + json.dumps(out))
"""


def api_run(scheduler: str, env: dict[str, str], tmp_path: Path) -> None:
    # Each client's settings (settings()) go as submit_script(env=...): the batch script's export lines, on every
    # scheduler, as `submit --env` (not through the caller's environment, which once hid that the API dropped them)
    env = dict(env, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", API_CODE, scheduler, str(tmp_path)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0 and "API " in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads(r.stdout.split("API ", 1)[1])
    for name in NAMES:
        codes, text = results[name]
        ok = codes == [0] * NODES * PER_NODE["api"] or teardown_abort_only(str(codes))
        assert ok, f"{name}: {codes}\n{text[-3000:]}"
        check(text, name, f"api-{scheduler}")


@pytest.mark.slurm
def test_python_api_real_slurm(netns_cluster_env: dict[str, str], tmp_path: Path, clients_installed: None) -> None:
    api_run("slurm", netns_cluster_env, tmp_path)


# --- the docs' table is this matrix's ---------------------------------------------------------------------------

def test_works_with_table_matches_the_pins_and_what_runs() -> None:
    """The versions in "Works with" (README and docs) are the test extras' pins and the installed ones; the
    environments it names are the ones the matrix asserts."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    pins = dict(req.split("==") for req in
                tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
                if "==" in req)
    for page, detailed in (("README.md", False), ("docs/reference/works-with.md", True)):  # short, and in full
        check_works_with_table((ROOT / page).read_text().split("# Works with", 1)[1].split("\n## ", 1)[0], pins,
                               detailed)


def check_works_with_table(table: str, pins: dict[str, str], detailed: bool = True) -> None:
    """The versions in a Works-with table; with ``detailed``, the environments and settings each row names."""
    from importlib.metadata import version

    rows = {row.split("|")[1].strip().split()[0].rstrip(","): row for row in table.splitlines()
            if row.startswith("| ")}
    for package, row_name in (("lightning", "Lightning"), ("lightning", "Fabric"), ("accelerate", "Hugging"),
                              ("pytorch-ignite", "pytorch-ignite"), ("idr-torch", "idr-torch")):
        assert f"| {pins[package]} |" in rows[row_name], (package, pins[package], rows[row_name])
        assert version(package) == pins[package], f"{package} {version(package)} installed, {pins[package]} pinned"
    if not detailed:
        return
    for env in set(LIGHTNING_ENV.values()):
        assert f"`{env}`" in rows["Lightning"] and f"`{env}`" in rows["Fabric"], env
    for env in set(IDR_ENV.values()):
        assert f"`{env}`" in rows["idr-torch"], env
    for name, values in SETTINGS.items():
        for key, value in values.items():
            assert f"{key}={value}" in table, (name, key)


# --- PBS: the ranks started by Open MPI's mpiexec ------------------------------------------------------------

def pbs_text(workdir: Path) -> str:
    """The job's one output (PBS Pro's name for qsub -o DIR/), without mpiexec --tag-output's tags (it tags
    what it reads in one go, which may be part of a line)."""
    text = "".join(p.read_text(errors="replace") for p in sorted((workdir / "slurmlaunch-logs").glob("*.OU")))
    return re.sub(r"\[\d+,\d+\]<std(?:out|err)>:", "", text)


@pytest.mark.pbs
def test_pbs(pbs_env: dict[str, str], tmp_path: Path, clients_installed: None) -> None:
    """The real OpenPBS dev cluster, ranks started by Open MPI's mpiexec: no Slurm variable and no torchrun's.
    Lightning and Fabric find MPIEnvironment there (mpi4py, a test extra, is installed; it asks MPI for rank
    and size, and rank 0's host and a free port there for its rendezvous); the others torch's variables.
    idr-torch knows only Slurm and torchrun: every rank falls back to a world of one and trains alone, and
    the job ends 0; submit says so before (app/clients.py client_notes)."""
    per_node = PER_NODE["pbs"]
    # the tests run as root: Open MPI's two run-as-root variables (PBS passes nothing else from this shell)
    shape = ["--scheduler", "pbs", "--nodes", str(NODES), "--tasks-per-node", str(per_node), "--wait",
             "--wait-timeout", "280", "--env", "OMPI_ALLOW_RUN_AS_ROOT=1", "--env", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]
    dirs = {name: workdir_for(tmp_path, name) for name in NAMES}
    done = run_together({name: (submit(*shape, *env_options(name), *argv(name, d, per_node)), pbs_env, d)
                         for name, d in dirs.items()}, timeout=320)
    for name, (code, console) in done.items():
        text = pbs_text(dirs[name])
        assert succeeded(code, console, dirs[name]), f"{name}: {console[-3000:]}\n{text[-3000:]}"
        if name != "idr":
            check(text, name, "pbs")
            continue
        alone = records(text, "idr")
        for line in RECORD.findall(text):
            print("pbs", *line)
        assert len(alone) == NODES * per_node, text[-3000:]
        assert {(r["env"], r["rank"], r["world"], r["torch_world"]) for r in alone} == {("Sequential", "0", "1", "1")}
        assert "idr_torch only makes sense within a distributed execution" in text, text[-3000:]
        assert "uses idr-torch, which finds its world only in a Slurm step's or torchrun's variables" in console
