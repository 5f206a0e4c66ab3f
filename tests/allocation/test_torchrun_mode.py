"""--mode torchrun: the per-node torchrun command (pure), validation, a local run, and the real cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurmlaunch.allocation.torchrun_mode import RELAY, parse, torchrun_command
from slurmlaunch.core.errors import SlurmLaunchError, SpecError
from slurmlaunch.core.rdzv import parse_rendezvous_timeout
from slurmlaunch.core.spec import JobSpec, parse_nodes, validate
from tests import ports
from tests.helpers import EXAMPLES, assert_refused, launch_job_id, no_slurm_env, run_cli, step_env, teardown_abort_only

# The task srun starts on the first of two nodes for --mode torchrun (one task per node).
STEP = step_env("gpu[07-08]", [1, 1], 0, job=4242, SLURM_CPUS_PER_TASK="32")

# Under torchrun: rank 1 fails in the first attempt only, once rank 0 is surely running (a node whose ranks all
# finished has left the job, and a restart needs every node back).
FLAKY = """
import os, sys, time
rank = os.environ["RANK"]
first = not os.path.exists("failed-once")
print(f"rank={rank} world={os.environ['WORLD_SIZE']} first={first} "
      f"group_rank={os.environ['GROUP_RANK']} run_id={os.environ['TORCHELASTIC_RUN_ID']}", flush=True)
if first and rank == "0":
    open("rank0-running", "w").close()
    time.sleep(90)  # stopped by the restart long before
elif first:
    deadline = time.monotonic() + 60
    while not os.path.exists("rank0-running") and time.monotonic() < deadline:
        time.sleep(0.1)
    open("failed-once", "w").close()
    sys.exit(3)
"""


def command(env: dict[str, str], *argv: str) -> tuple[list[str], dict[str, str]]:
    values, flags, script = parse(list(argv))
    return torchrun_command(env, values, flags, script, "/py")


def test_first_node_hosts_the_c10d_store() -> None:
    cmd, extra = command(STEP, "--nproc-per-node=4", "--max-restarts", "2", "--forward-signal=USR2", "t.py", "--x")
    assert cmd == ["/py", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                   "--rdzv-endpoint=gpu07:19250", "--rdzv-id=4242", "--rdzv-conf=is_host=1", "--max-restarts=2",
                   "--no-python", "/py", "-c", RELAY, "-u", "t.py", "--x"]  # 4 workers: each behind the line relay
    # torchrun passes the warning on to its workers (torch >= 2.9); CPUs are shared among the node's ranks
    assert extra == {"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2", "OMP_NUM_THREADS": "8"}


def test_other_nodes_connect_and_given_values_win() -> None:
    env = dict(step_env("gpu[07-08]", [1, 1], 1, job=4242, SLURM_CPUS_PER_TASK="32"), MASTER_ADDR="10.0.0.7",
               MASTER_PORT="29500", OMP_NUM_THREADS="2", SLURMLAUNCH_RDZV_TIMEOUT="60")
    cmd, extra = command(env, "--nproc-per-node", "4", "--nnodes", "1:2", "-m", "pkg.train")
    assert "--rdzv-conf=is_host=0,join_timeout=60" in cmd and "--rdzv-endpoint=10.0.0.7:29500" in cmd
    assert "--nnodes=1:2" in cmd
    assert cmd[-2:] == ["-m", "pkg.train"] and extra == {}


@pytest.mark.parametrize("value", ["eight", "-1", "70000", "4 4"])
def test_a_bad_cpus_per_task_is_one_line_not_ignored(value: str) -> None:
    # ignored, it would leave every worker's thread pool at all of the node's cores
    from slurmlaunch.core.errors import EnvironmentMappingError

    with pytest.raises(EnvironmentMappingError, match="SLURM_CPUS_PER_TASK"):
        command(dict(STEP, SLURM_CPUS_PER_TASK=value), "--nproc-per-node=4", "t.py")


@pytest.mark.parametrize(("value", "conf"), [
    (None, "is_host=1"), ("", "is_host=1"), ("0", "is_host=1"), ("60", "is_host=1,join_timeout=60"),
    ("1e3", "is_host=1,join_timeout=1000"), (" 90.5 ", "is_host=1,join_timeout=90.5"),
])
def test_rdzv_timeout_is_read_as_the_launcher_reads_it(value: str | None, conf: str) -> None:
    env = dict(STEP) if value is None else dict(STEP, SLURMLAUNCH_RDZV_TIMEOUT=value)
    cmd, _ = command(env, "--nproc-per-node=1", "t.py")
    assert f"--rdzv-conf={conf}" in cmd


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "²"])
def test_a_bad_rdzv_timeout_is_the_launchers_one_line_error(value: str) -> None:
    with pytest.raises(SlurmLaunchError) as caught:
        command(dict(STEP, SLURMLAUNCH_RDZV_TIMEOUT=value), "--nproc-per-node=1", "t.py")
    with pytest.raises(SlurmLaunchError) as launcher:
        parse_rendezvous_timeout(value)
    assert str(caught.value) == str(launcher.value)


def test_a_bad_rdzv_timeout_at_the_cli_is_one_line_exit_2(tmp_path: Path) -> None:
    env = dict(no_slurm_env(tmp_path), **STEP, SLURMLAUNCH_RDZV_TIMEOUT="soon")
    r = run_cli("torchrun-node", "--nproc-per-node=1", "t.py", env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "slurmlaunch: error: SLURMLAUNCH_RDZV_TIMEOUT='soon' is not valid (expected seconds >= 0; " \
                       "0 = off)\n"


@pytest.mark.parametrize(("var", "value"), [("MASTER_PORT", "70000"), ("MASTER_PORT", "http"),
                                            ("SLURM_JOB_ID", "12x"), ("SLURM_STEP_ID", "-1")])
def test_step_variables_are_read_as_the_launcher_reads_them(var: str, value: str) -> None:
    with pytest.raises(SlurmLaunchError, match=re.escape(var)):
        command(dict(STEP, **{var: value}), "--nproc-per-node=1", "t.py")


@pytest.mark.parametrize(("argv", "expect"), [
    (["t.py"], "--nproc-per-node is required"), (["--nproc-per-node=1"], "no SCRIPT given"),
    (["--nproc-per-node=1", "--standalone", "t.py"], "unknown option '--standalone'"),
])
def test_bad_node_arguments(argv: list[str], expect: str) -> None:
    with pytest.raises(SlurmLaunchError, match=re.escape(expect)):
        parse(argv)


def test_outside_slurm_says_so() -> None:
    with pytest.raises(SlurmLaunchError, match="not inside a Slurm step"):
        command({}, "--nproc-per-node=1", "t.py")
    batch = {k: v for k, v in STEP.items() if k not in ("SLURM_STEP_ID", "SLURM_STEPID")}  # the batch step
    with pytest.raises(SlurmLaunchError, match="not inside a Slurm step"):
        command(dict(batch, SLURM_NTASKS="1"), "--nproc-per-node=1", "t.py")


def test_node_list_precedence_is_the_launchers() -> None:
    """Without the step's own list, the job's by its name: SLURM_JOB_NODELIST, then SLURM_NODELIST, the
    backwards-compatible name Slurm documents for the same list (sbatch(1)). Torchrun mode and the launcher
    once read these in different orders; both read them with core.detect.read_slurm now."""
    from slurmlaunch.core.detect import Context, read_slurm

    env = {k: v for k, v in STEP.items() if k != "SLURM_STEP_NODELIST"}
    env.update(SLURM_JOB_NODELIST="gpu[07-08]", SLURM_NODELIST="cpu[01-02]", SLURMD_NODENAME="gpu07")
    cmd, _ = command(env, "--nproc-per-node=1", "t.py")
    assert "--rdzv-endpoint=gpu07:19250" in cmd and "--rdzv-conf=is_host=1" in cmd
    assert read_slurm(env, Context()).master_addr == "gpu07"  # type: ignore[union-attr]
    # a step on a subset of the job's nodes: the step's list wins over both
    sub = dict(env, SLURM_STEP_NODELIST="gpu08", SLURM_STEP_NUM_NODES="1", SLURM_NNODES="1", SLURM_NTASKS="1",
               SLURM_STEP_NUM_TASKS="1", SLURM_STEP_TASKS_PER_NODE="1", SLURMD_NODENAME="gpu08")
    cmd, _ = command(sub, "--nproc-per-node=1", "t.py")
    assert "--rdzv-endpoint=gpu08:19250" in cmd and "--nnodes=1" in cmd and "--rdzv-conf=is_host=1" in cmd


@pytest.mark.parametrize(("kw", "expect"), [
    (dict(mode="torchrun", tasks_per_node=2), "--tasks-per-node 2 is not valid with --mode torchrun"),
    (dict(max_restarts=2), "--max-restarts 2 needs --mode torchrun"),
    (dict(nodes=4, min_nodes=2), "--nodes 2:4 needs --mode torchrun"),
    (dict(mode="torchrun", nodes=2, min_nodes=3), "--nodes 3:2 is not valid"),
    (dict(mode="torchrun", gpus_per_node=4, nproc_per_node=2),
     "--nproc-per-node 2 is not valid with --gpus-per-node 4"),
    (dict(mode="mpirun"), "--mode 'mpirun' is not valid (expected srun or torchrun)"),
    (dict(mode="torchrun", max_restarts=-1), "--max-restarts -1 is not valid"),
])
def test_bad_requests(kw: dict[str, object], expect: str, tmp_path: Path) -> None:
    assert_refused(tmp_path, expect, **kw)


def test_nodes_spellings() -> None:
    assert parse_nodes("3") == (3, None) and parse_nodes(2) == (2, None) and parse_nodes("1:4") == (4, 1)
    with pytest.raises(SpecError, match=r"--nodes 'two' is not valid \(expected a number of nodes, or MIN:MAX"):
        parse_nodes("two")


def test_elastic_range_reaches_sbatch_and_torchrun(tmp_path: Path) -> None:
    spec = validate(JobSpec.of(script="t.py", workdir=str(tmp_path), mode="torchrun", nodes=4, min_nodes=2,
                               nproc_per_node=3, cpus_per_task=2)) if (tmp_path / "t.py").write_text("") == 0 else None
    assert spec is not None and spec.world_size == 12
    from slurmlaunch.render import launch, slurm_script

    assert "--nodes=2-4" in slurm_script.directives(spec) and "--cpus-per-task=6" in slurm_script.directives(spec)
    assert "--nodes=4" not in slurm_script.srun_args(spec)  # the step spans what the allocation got
    assert "--nnodes=2:4" in launch.launch_command(spec)


def test_torchrun_mode_on_the_local_scheduler(tmp_path: Path, torch_available: None) -> None:
    env = no_slurm_env(tmp_path)
    r = run_cli("submit", "--mode", "torchrun", "--nodes", "2", "--nproc-per-node", "2", str(EXAMPLES / "train_ddp.py"),
                "--epochs", "1", env=env, cwd=tmp_path, timeout=180)
    assert r.returncode == 0 or teardown_abort_only(r.stderr), r.stderr
    logs = sorted((tmp_path / "slurmlaunch-logs").glob("*.node-*.log"))
    assert len(logs) == 2
    text = "".join(p.read_text() for p in logs)
    assert sorted(re.findall(r"rank=(\d) local_rank=(\d) node_rank=(\d) world_size=4", text)) == [
        ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")]
    assert "done: world_size=4 sum_of_ranks=6" in text
    assert "[node 1] " in r.stdout and "[rank " not in r.stdout  # the console prefix names the node


@pytest.mark.slurm
def test_torchrun_mode_on_the_real_cluster(netns_cluster_env: dict[str, str], tmp_path: Path,
                                           torch_available: None) -> None:
    # on the networked cluster: node1's c10d store is reached over the bridge at node1's own address
    r = run_cli("submit", "--mode", "torchrun", "--nodes", "2", "--gpus-per-node", "2", "--cpus-per-gpu", "1",
                "--wait", "--wait-timeout", "200", str(EXAMPLES / "train_ddp.py"), "--epochs", "1",
                env=dict(netns_cluster_env, SLURMLAUNCH_DEVICE="cpu"), cwd=tmp_path, timeout=240)
    job = r.stdout.split()[0]
    logs = tmp_path / "slurmlaunch-logs"
    assert r.returncode == 0 or teardown_abort_only((logs / f"job-{job}.batch.log").read_text()), \
        r.stdout + r.stderr
    places = {}
    for node, host in ((0, "node1"), (1, "node2")):  # node-N.log is Slurm's node N: its torchrun's ranks
        text = (logs / f"job-{job}.node-{node}.log").read_text()
        for rank, local, group in re.findall(rf"rank=(\d) local_rank=(\d) node_rank=(\d) world_size=4 host={host}",
                                             text):
            places[int(rank)] = (int(local), int(group), host)
    # torchrun numbers the nodes in rendezvous order (its sort of the agents' names), not Slurm's, so
    # either node may be group 0
    assert sorted(places) == [0, 1, 2, 3], places
    assert [(places[r][0], places[r][1]) for r in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert places[0][2] == places[1][2] != places[2][2] == places[3][2]
    assert "done: world_size=4 sum_of_ranks=6" in "".join(p.read_text() for p in logs.glob(f"job-{job}.node-*"))
    script = (logs / f"job-{job}.sbatch").read_text()
    assert "--ntasks-per-node=1" in script and "torchrun-node --nproc-per-node=2" in script


@pytest.mark.slurm
@pytest.mark.parametrize(("restarts", "code"), [(1, 0), (0, 1)])
def test_max_restarts_on_the_real_cluster(restarts: int, code: int, cluster_env: dict[str, str], tmp_path: Path,
                                          torch_available: None) -> None:
    (tmp_path / "flaky.py").write_text(FLAKY)
    r = run_cli("submit", "--mode", "torchrun", "--nodes", "2", "--nproc-per-node", "1", "--max-restarts",
                str(restarts), "--rdzv-timeout", "60", "--wait", "--wait-timeout", "150", "--cancel-on-interrupt",
                "flaky.py", env=cluster_env, cwd=tmp_path, timeout=200)
    assert r.returncode == code, r.stdout + r.stderr
    job = r.stdout.split()[0]
    text = "".join(p.read_text() for p in (tmp_path / "slurmlaunch-logs").glob(f"job-{job}.node-*.log"))
    assert "rank=1 world=2 first=True" in text and f"run_id={job}" in text
    # with a restart allowed, the whole world ran again (both ranks), after rank 1's failure
    assert ("rank=0 world=2 first=False" in text and "rank=1 world=2 first=False" in text) == (restarts == 1), text
    if restarts == 0:
        batch = (tmp_path / f"slurmlaunch-logs/job-{job}.batch.log").read_text()
        assert re.search(r"torchrun on node\d \(node task \d\) failed first with exit code 1", batch), batch


@pytest.mark.slurm
def test_elastic_range_on_the_real_cluster(cluster_env: dict[str, str], tmp_path: Path,
                                           torch_available: None) -> None:
    # one write per line: the node's ranks share its output file
    (tmp_path / "who.py").write_text("import os\nos.write(1, f\"world {os.environ['WORLD_SIZE']} nodes "
                                     "{os.environ['GROUP_WORLD_SIZE']}\\n\".encode())\n")
    r = run_cli("submit", "--mode", "torchrun", "--nodes", "1:2", "--nproc-per-node", "2", "--wait",
                "--wait-timeout", "150", "who.py", env=cluster_env, cwd=tmp_path, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split()[0]
    logs = tmp_path / "slurmlaunch-logs"
    assert "#SBATCH --nodes=1-2" in (logs / f"job-{job}.sbatch").read_text()
    node_logs = list(logs.glob(f"job-{job}.node-*.log"))
    got = len(node_logs)  # Slurm gives anything in the range (this one gives the minimum when it can)
    text = "".join(p.read_text() for p in node_logs)
    # torchrun ran on what came: one world of every rank of every node the allocation got
    assert 1 <= got <= 2 and text.count(f"world {2 * got} nodes {got}") == 2 * got, text


# --- what a worker sees of Slurm (issue 27 part 2) ------------------------------------------------------------

NODE_TASK = dict({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[07-08]",
                  "SLURM_STEP_NUM_NODES": "2", "SLURMD_NODENAME": "gpu07", "SLURM_NODEID": "0",
                  "SLURM_CPUS_PER_TASK": "32"}, SLURM_PROCID="1", SLURM_LOCALID="0", SLURM_NTASKS="2", SLURM_NPROCS="2",
                 SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS_PER_NODE="1", SLURM_TASKS_PER_NODE="1(x2)",
                 SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_GTIDS="1", SLURM_STEPID="0", SLURM_JOB_NODELIST="gpu[07-08]",
                 SLURM_JOB_NUM_NODES="2")
WORKER = {"TORCHELASTIC_RUN_ID": "4242", "RANK": "5", "LOCAL_RANK": "1", "GROUP_RANK": "1", "WORLD_SIZE": "8",
          "LOCAL_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2"}


def test_a_worker_sees_the_task_srun_would_have_started() -> None:
    from slurmlaunch.core.workerenv import torchrun_worker_slurm

    assert torchrun_worker_slurm(dict(NODE_TASK, **WORKER)) == {
        "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "8", "SLURM_NPROCS": "8",
        "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_GTIDS": "4,5,6,7",
        "SLURM_STEP_ID": None, "SLURM_STEPID": None}
    one = torchrun_worker_slurm(dict(NODE_TASK, **dict(WORKER, RANK="0", LOCAL_RANK="0", GROUP_RANK="0",
                                                         WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_WORLD_SIZE="1")))
    assert one["SLURM_TASKS_PER_NODE"] == "1" and one["SLURM_GTIDS"] == "0"


@pytest.mark.parametrize("change", [
    {"TORCHELASTIC_RUN_ID": None}, {"SLURM_JOB_ID": None}, {"RANK": "x"}, {"WORLD_SIZE": ""}, {"GROUP_RANK": None},
    {"LOCAL_RANK": "6"},  # more than RANK: not torchrun's numbering
])
def test_outside_torchrun_or_slurm_nothing_changes(change: dict[str, str | None]) -> None:
    from slurmlaunch.core.workerenv import torchrun_worker_slurm

    env = dict(NODE_TASK, **WORKER)
    for k, v in change.items():
        if v is None:
            env.pop(k)
        else:
            env[k] = v
    assert torchrun_worker_slurm(env) == {}


def test_one_worker_per_node_goes_through_the_same_start() -> None:
    from slurmlaunch.allocation.torchrun_worker import AS_WORKER

    cmd, _ = command(STEP, "--nproc-per-node=1", "-m", "pkg.train", "--x")
    assert cmd[cmd.index("--no-python"):] == ["--no-python", "/py", "-c", AS_WORKER, "-u", "-m", "pkg.train", "--x"]
    cmd, _ = command(STEP, "--nproc-per-node=1", "--no-python", "./prog", "--x")
    assert cmd[cmd.index("--no-python"):] == ["--no-python", "/py", "-c", AS_WORKER, "./prog", "--x"]


WORKER_VIEW = """
import json, os, sys
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID",
        "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_ID", "SLURM_JOB_ID")
json.dump({k: os.environ.get(k) for k in keys}, open(os.path.join(sys.argv[1], os.environ["RANK"]), "w"))
"""


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_real_torchrun_workers_see_their_own_task_variables(nproc: str, tmp_path: Path, torch_available: None) -> None:
    """The command torchrun-node builds, run by the real torchrun on this machine in a Slurm-like node task:
    every worker's Slurm variables agree with torch's (alone, through AS_WORKER; several, through RELAY)."""
    import subprocess
    import sys

    from slurmlaunch.allocation.torchrun_mode import torchrun_command

    port = str(ports.port())
    (tmp_path / "view.py").write_text(WORKER_VIEW)
    env = dict(no_slurm_env(tmp_path), **NODE_TASK)
    job = launch_job_id(3)
    env.update(step_env("gpu07", [1], 0, job=job), SLURM_NPROCS="1", SLURM_NTASKS_PER_NODE="1",
               SLURM_GTIDS="0", SLURM_JOB_NUM_NODES="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    values, flags, script = parse([f"--nproc-per-node={nproc}", "view.py", str(tmp_path)])
    cmd, extra = torchrun_command(env, values, flags, script, sys.executable)
    r = subprocess.run(cmd, env=dict(env, **extra), cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in range(int(nproc)):
        seen = json.loads((tmp_path / str(rank)).read_text())
        assert seen == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": nproc, "SLURM_PROCID": str(rank),
                        "SLURM_LOCALID": str(rank), "SLURM_NTASKS": nproc, "SLURM_NODEID": "0",
                        "SLURM_STEP_TASKS_PER_NODE": nproc, "SLURM_STEP_ID": None, "SLURM_JOB_ID": str(job)}, seen
