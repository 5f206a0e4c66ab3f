"""Against the real local Slurm cluster (4 slurmd nodes x 4 fake GPUs on this machine). The end-to-end
submit and the fail-fast test run on the networked one (netns_cluster_env: each node its own address, no
SLURMLAUNCH_ALLOW_LOOPBACK), so that the launcher's address checks run as on a real cluster.

These skip without root or Slurm's packages, and fail instead under CI=true.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, HOSTILE, SLEEPER, alive, run_cli, teardown_abort_only

pytestmark = pytest.mark.slurm

DUMP = """
import json, os, socket, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "SLURMLAUNCH_LOCAL_DEVICE", "OMP_NUM_THREADS", "HOSTILE"]
rec = {"tag": sys.argv[1], "host": socket.gethostname(), "pid": os.getpid(), "argv": sys.argv[2:],
       **{k: os.environ.get(k) for k in keys}}
with open(os.path.join(os.environ["OUT_DIR"], f"{sys.argv[1]}-{os.environ['RANK']}.json"), "w") as f:
    json.dump(rec, f)
"""


def records(d: Path, tag: str) -> list[dict[str, object]]:
    return sorted((json.loads(p.read_text()) for p in d.glob(f"{tag}-*.json")), key=lambda r: int(str(r["RANK"])))


def test_example_trains_across_two_nodes(netns_cluster_env: dict[str, str], tmp_path: Path,
                                         torch_available: None) -> None:
    r = run_cli("submit", "--nodes", "2", "--gpus-per-node", "2", "--cpus-per-task", "1", "--wait",
                str(EXAMPLES / "train_ddp.py"), "--epochs", "2", env=netns_cluster_env, cwd=tmp_path, timeout=300)
    # torch's teardown abort after the training (docs: Teardown aborts) is torch's; the rest is checked in full
    assert r.returncode == 0 or teardown_abort_only(r.stderr), r.stdout + r.stderr
    assert "auto chose slurm" in r.stderr and re.search(r"job \d+ RUNNING on node\[1-2\]", r.stderr)
    assert "done: world_size=4 sum_of_ranks=6" in r.stdout  # rank 0's output, followed live
    job = re.search(r"submitted job (\d+)", r.stderr).group(1)  # type: ignore[union-attr]
    logs = tmp_path / "slurmlaunch-logs"
    seen = []
    for rank in range(4):
        text = (logs / f"job-{job}.rank-{rank}.log").read_text()
        m = re.search(r"rank=(\d) local_rank=(\d) node_rank=(\d) world_size=(\d) host=(\S+)", text)
        assert m, text
        seen.append(m.groups())
    assert seen == [("0", "0", "0", "4", "node1"), ("1", "1", "0", "4", "node1"),
                    ("2", "0", "1", "4", "node2"), ("3", "1", "1", "4", "node2")]
    assert (logs / f"job-{job}.sbatch").is_file() and (logs / f"job-{job}.batch.log").is_file()
    record = json.loads((logs / f"job-{job}.json").read_text())
    assert record["job_id"] == job and record["command"][0] == "sbatch"


def test_failing_rank_ends_the_job_with_its_code(netns_cluster_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    start = time.monotonic()
    r = run_cli("submit", "--nodes", "2", "--tasks-per-node", "2", "--wait", str(script), str(tmp_path), "2", "7",
                env=netns_cluster_env, cwd=tmp_path, timeout=120)
    assert r.returncode == 7, r.stdout + r.stderr
    assert time.monotonic() - start < 60
    batch_log = next((tmp_path / "slurmlaunch-logs").glob("*.batch.log")).read_text()
    assert "rank(s) 2 on node2 failed first with exit code 7" in batch_log
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    assert len(pids) == 4 and not any(alive(p) for p in pids)  # the nodes share this machine's pid space


@pytest.mark.parametrize(("args", "expect"), [
    (["--partition", "nosuchpartition"], "invalid partition"),
    (["--gpus-per-node", "8"], "Requested node configuration is not available"),
])
def test_slurm_refusals_shown_with_the_command(args: list[str], expect: str, cluster_env: dict[str, str],
                                               tmp_path: Path) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('ok')")
    r = run_cli("submit", *args, str(script), env=cluster_env, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("slurmlaunch: error: sbatch --parsable") and "failed (exit 1)" in line
    assert expect in line.lower() or expect in line
    assert "Traceback" not in r.stderr


def test_hostile_job_name_args_and_env_arrive_byte_for_byte(cluster_env: dict[str, str], tmp_path: Path) -> None:

    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    name = "job $(touch PWNED) `x` it's\n#SBATCH --nodes=4"
    env_value = "v $(touch PWNED) 'q' \"d\"\nline2 `x` %j"
    r = run_cli("submit", "--nodes", "2", "--wait", "--job-name", name, "--env", f"HOSTILE={env_value}",
                "--env", f"OUT_DIR={tmp_path}", str(script), "hostile", *HOSTILE,
                env=cluster_env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    recs = records(tmp_path, "hostile")
    assert len(recs) == 2
    for rec in recs:
        assert rec["argv"] == HOSTILE and rec["HOSTILE"] == env_value
    job = re.search(r"submitted job (\d+)", r.stderr).group(1)  # type: ignore[union-attr]
    info = subprocess.run(["scontrol", "show", "job", job], env=cluster_env, capture_output=True, text=True).stdout
    assert f"JobName={name} " in info or f"JobName={name}\n" in info
    assert not list(tmp_path.rglob("PWNED"))


LAYOUTS = r"""#!/bin/bash
set -u
L="$PY -m slurmlaunch launch"
srun --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 $L "$DUMP" pernode
srun --nodes=2 --ntasks-per-node=2 --gpus-per-task=1 $L "$DUMP" pertask
srun --nodes=2 --ntasks=3 $L "$DUMP" uneven
srun --nodes=1 --ntasks=2 -w node2 $L "$DUMP" subset
printf 'node2\nnode1\n' > "$OUT_DIR/hostfile"
SLURM_HOSTFILE="$OUT_DIR/hostfile" srun --distribution=arbitrary --ntasks=2 $L "$DUMP" arbitrary
srun --nodes=2 --ntasks-per-node=2 --cpus-per-task=2 $L "$DUMP" cpus
$L "$DUMP" batchstep 2> "$OUT_DIR/batchstep.err"; echo $? > "$OUT_DIR/batchstep.rc"
"""


def test_launcher_under_real_srun_layouts(cluster_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "dump.py").write_text(DUMP)
    (tmp_path / "layouts.sh").write_text(LAYOUTS)
    env = dict(cluster_env, PY=sys.executable, DUMP=str(tmp_path / "dump.py"), OUT_DIR=str(tmp_path))
    r = subprocess.run(["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=2",
                        "--cpus-per-task=2", "-o", str(tmp_path / "out.log"), str(tmp_path / "layouts.sh")],
                       env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    out = (tmp_path / "out.log").read_text() if (tmp_path / "out.log").exists() else ""
    assert r.returncode == 0, r.stderr + out

    def view(tag: str, *keys: str) -> list[tuple[object, ...]]:
        return [tuple(rec[k] for k in keys) for rec in records(tmp_path, tag)]

    # --gpus-per-node: every task sees the node's GPUs and uses GPU LOCAL_RANK
    assert view("pernode", "RANK", "LOCAL_RANK", "NODE_RANK", "host", "CUDA_VISIBLE_DEVICES",
                "SLURMLAUNCH_LOCAL_DEVICE", "MASTER_ADDR") == [
        ("0", "0", "0", "node1", "0,1", "0", "node1"), ("1", "1", "0", "node1", "0,1", "1", "node1"),
        ("2", "0", "1", "node2", "0,1", "0", "node1"), ("3", "1", "1", "node2", "0,1", "1", "node1")]
    # --gpus-per-task=1: Slurm narrowed CUDA_VISIBLE_DEVICES per task; each uses its own, index 0
    pertask = view("pertask", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "SLURMLAUNCH_LOCAL_DEVICE")
    assert [p[2] for p in pertask] == ["0"] * 4 and {p[1] for p in pertask[:2]} == {"0", "1"}
    # uneven: 3 tasks on 2 nodes
    assert view("uneven", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE") == [
        ("0", "0", "0", "2", "3"), ("1", "1", "0", "2", "3"), ("2", "0", "1", "1", "3")]
    # a step on a subset of the allocation: the step's node list, not the job's
    assert view("subset", "RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "host") == [
        ("0", "2", "0", "1", "node2", "node2"), ("1", "2", "0", "1", "node2", "node2")]
    # arbitrary distribution: rank 0 runs on node2, the hostfile's first line, which is not the list's first
    assert view("arbitrary", "RANK", "host", "MASTER_ADDR") == [("0", "node2", "node2"), ("1", "node1", "node2")]
    assert {r[0] for r in view("cpus", "OMP_NUM_THREADS")} == {"2"}
    # every rank of a step computed the same port
    assert len({r[0] for r in view("pernode", "MASTER_PORT")}) == 1
    # the batch step pretending to be rank 0 of 4 is refused
    assert (tmp_path / "batchstep.rc").read_text().strip() == "65"  # the launcher's code for a mapping refusal
    assert "batch step" in (tmp_path / "batchstep.err").read_text()
    assert not list(tmp_path.glob("batchstep-*.json"))


def test_gloo_world_over_srun_arbitrary_distribution(cluster_env: dict[str, str], tmp_path: Path,
                                                     torch_available: None) -> None:
    """MASTER_ADDR = the host of rank 0 even when that is not the node list's first: gloo must connect."""
    script = tmp_path / "ar.py"
    script.write_text("import socket, torch, torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "t = torch.ones(1); dist.all_reduce(t)\n"
                      "print(dist.get_rank(), socket.gethostname(), int(t.item()), flush=True)\n"
                      # leaving without this lets one rank's gloo teardown abort while rank 0 is gone
                      "dist.barrier(); dist.destroy_process_group()\n")
    (tmp_path / "hf").write_text("node2\nnode1\nnode1\n")
    batch = (f"#!/bin/bash\nSLURM_HOSTFILE={tmp_path}/hf srun --distribution=arbitrary --ntasks=3 "
             f"{sys.executable} -m slurmlaunch launch {script}\n")
    (tmp_path / "b.sh").write_text(batch)
    r = subprocess.run(["sbatch", "--wait", "--nodes=2", "--ntasks=3", "-o", str(tmp_path / "o.log"),
                        str(tmp_path / "b.sh")], env=cluster_env, capture_output=True, text=True, timeout=180)
    out = (tmp_path / "o.log").read_text()
    assert r.returncode == 0, out
    lines = [ln for ln in out.splitlines() if re.fullmatch(r"\d node\d \d", ln)]
    assert sorted(lines) == ["0 node2 3", "1 node1 3", "2 node1 3"]


def test_scontrol_agrees_on_cluster_node_lists(cluster_env: dict[str, str]) -> None:
    from slurmlaunch.core import hostlist

    out = subprocess.run(["sinfo", "-h", "-p", "debug", "-o", "%N"], env=cluster_env, capture_output=True,
                         text=True).stdout.strip()
    hosts = subprocess.run(["scontrol", "show", "hostnames", out], env=cluster_env, capture_output=True,
                           text=True).stdout.split()
    assert hostlist.expand(out) == hosts == ["node1", "node2", "node3", "node4"]


def test_wait_interrupt_cancels_the_job(cluster_env: dict[str, str], tmp_path: Path) -> None:
    import signal

    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    p = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--nodes", "2", "--wait",
                          "--cancel-on-interrupt", str(script), str(tmp_path), "-1", "0"],
                         env=cluster_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("pid-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    job = re.search(r"submitted job (\d+)", err).group(1)  # type: ignore[union-attr]
    assert f"cancelled job {job}" in err
    deadline = time.monotonic() + 30
    pids = [int(f.read_text()) for f in tmp_path.glob("pid-*")]
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids)


def _final_weights(text: str) -> str:
    m = re.search(r"final weights (.+)", text)
    assert m, text
    return m.group(1)


def test_warning_signal_checkpoint_requeue_resume(cluster_env: dict[str, str], tmp_path: Path,
                                                  torch_available: None) -> None:
    """scancel --signal=USR2 mid-run: the ranks save and exit 140, the batch shell requeues, the next run
    resumes from the checkpoint, and the result equals an uninterrupted run's."""
    example = str(EXAMPLES / "checkpoint_requeue.py")
    # the uninterrupted reference, on the local scheduler while the Slurm job runs
    ref = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "local", "--nodes", "2",
                            "--tasks-per-node", "2", example, "--steps", "40", "--checkpoint",
                            str(tmp_path / "ref.pt")],
                           env=cluster_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--nodes", "2", "--tasks-per-node", "2",
                          "--requeue", "--wait", "--output-dir", "rq-logs", example, "--steps", "40",
                          "--step-seconds", "0.25", "--checkpoint", str(tmp_path / "ck.pt")],
                         env=cluster_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = tmp_path / "rq-logs"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rank0 = list(logs.glob("job-*.rank-0.log"))
        if rank0 and "step 10" in rank0[0].read_text():
            break
        time.sleep(0.2)
    job = rank0[0].name.split(".")[0].removeprefix("job-")
    subprocess.run(["scancel", "--signal=USR2", job], env=cluster_env, check=True)
    out, err = p.communicate(timeout=240)
    ref_out, ref_err = ref.communicate(timeout=300)
    assert ref.returncode == 0, ref_err
    assert p.returncode == 0, out + err
    # requeued: back to PENDING after it ran (whether --wait's first poll saw it PENDING depends on how fast
    # Slurm started it: seen both ways)
    assert re.search(r"job \d+ RUNNING[\s\S]*job \d+ PENDING[\s\S]*job \d+ RUNNING", err), err
    assert "checkpoint saved at step" in out and "resumed from step" in out and "SLURM_RESTART_COUNT=1" in out
    assert "requeueing job" in (logs / f"job-{job}.batch.log").read_text()
    assert _final_weights(out) == _final_weights(ref_out)


def test_time_limit_requeues_at_most_max_requeues(cluster_env: dict[str, str], tmp_path: Path,
                                                   torch_available: None) -> None:
    r = run_cli("submit", "--tasks-per-node", "2", "--time", "1", "--signal", "USR2@50", "--requeue",
                "--max-requeues", "1", "--wait", str(EXAMPLES / "checkpoint_requeue.py"), "--steps", "1000000",
                "--step-seconds", "0.5", "--checkpoint", str(tmp_path / "ck.pt"), env=cluster_env, cwd=tmp_path,
                timeout=400)
    assert r.returncode == 140, r.stderr  # the last run's ranks ended on the warning and were not requeued
    batch_log = next((tmp_path / "slurmlaunch-logs").glob("*.batch.log")).read_text()
    assert batch_log.count("requeueing job") == 1
    assert "not requeued: job" in batch_log and "already requeued 1 time(s)" in batch_log
    assert r.stdout.count("checkpoint saved at step") == 2 and "SLURM_RESTART_COUNT=1" in r.stdout


def test_master_that_never_listens_is_a_clear_error_not_a_hang(cluster_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "hung_master.py"
    # Rank 0 hangs before its rendezvous; the others keep retrying to connect, as a TCPStore client does.
    script.write_text("import os, socket, time\nif os.environ['RANK'] == '0':\n    time.sleep(300)\n"
                      "while True:\n    try:\n        socket.create_connection((os.environ['MASTER_ADDR'], "
                      "int(os.environ['MASTER_PORT'])), timeout=5)\n        break\n"
                      "    except OSError:\n        time.sleep(0.5)\n")
    start = time.monotonic()
    r = run_cli("submit", "--nodes", "2", "--tasks-per-node", "2", "--rdzv-timeout", "3", "--wait", str(script),
                env=cluster_env, cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and time.monotonic() - start < 60, r.stderr
    logs = tmp_path / "slurmlaunch-logs"
    text = "".join(p.read_text() for p in logs.glob("*.rank-*.log"))
    assert re.search(r"nothing listened at MASTER_ADDR:MASTER_PORT=node1:\d+ within 3s", text), text


def test_thirty_hostile_job_names_arrive_byte_for_byte(cluster_env: dict[str, str], tmp_path: Path) -> None:

    script = tmp_path / "ok.py"
    script.write_text("pass")
    names = [h for h in HOSTILE if h and h != "\r"] + ["name with ' and \" and $(touch PWNED)", "x" * 200]
    assert len(names) >= 30
    ids = []
    try:
        for name in names:
            r = run_cli("submit", f"--job-name={name}", "--sbatch-arg=--hold", str(script), env=cluster_env,
                        cwd=tmp_path)
            assert r.returncode == 0, (name, r.stderr)
            ids.append(r.stdout.strip())
        for job, name in zip(ids, names, strict=True):
            got = subprocess.run(["squeue", "-h", "-j", job, "-o", "%j"], env=cluster_env, capture_output=True,
                                 text=True).stdout
            assert got == name + "\n", (name, got)
    finally:
        if ids:
            subprocess.run(["scancel", *ids], env=cluster_env)
    assert not list(tmp_path.rglob("PWNED"))


def test_hostile_paths_for_workdir_script_and_output_dir(cluster_env: dict[str, str], tmp_path: Path) -> None:
    work = tmp_path / "a b $(touch PWNED) `x` it's\nnl"
    work.mkdir()
    script = work / "s c'r$(x).py"
    script.write_text("import os, sys; print('ARGS', sys.argv[1:], os.getcwd() == os.environ['EXPECT_CWD'])")
    # A control character in --output-dir is refused (README: Limits); the working directory may hold one.
    refused = run_cli("submit", "--output-dir", "logs\nx", script.name, env=cluster_env, cwd=work, timeout=60)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    out_dir = "logs 'q' $(touch PWNED) `x`"
    r = run_cli("submit", "--nodes", "2", "--wait", "--output-dir", out_dir, "--env", f"EXPECT_CWD={work}",
                script.name, "arg $(y)", env=cluster_env, cwd=work, timeout=120)
    assert r.returncode == 0, r.stderr
    logs = sorted((work / out_dir).glob("job-*.rank-*.log"))
    assert len(logs) == 2 and all("ARGS ['arg $(y)'] True" in p.read_text() for p in logs)
    for f in (work / out_dir).iterdir():
        assert f.stat().st_mode & 0o002 == 0, f  # nothing world-writable
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.slurm
def test_setup_sees_env_and_files_are_not_writable_by_others_under_umask_0(cluster_env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    # --setup runs after the --env exports (README: what runs in the batch script, in order); under the
    # submitter's umask 0, neither the batch shell's files nor Slurm's logs become writable by others.
    (tmp_path / "hi.py").write_text("print('rank says hi')\n")
    r = subprocess.run([sys.executable, "-c", "import os, sys; os.umask(0); from slurmlaunch.cli import main; "
                        "sys.exit(main(sys.argv[1:]))", "submit", "--nodes", "2", "--env", "GREETING=x y",
                        "--setup", 'echo "setup sees $GREETING"', "--wait", "--wait-timeout", "120", "hi.py"],
                       env=cluster_env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    logs = tmp_path / "slurmlaunch-logs"
    job = r.stdout.split()[0]
    assert "setup sees x y" in (logs / f"job-{job}.batch.log").read_text()
    made = sorted(logs.iterdir())
    assert {p.name for p in made} >= {f"job-{job}.batch.log", f"job-{job}.srun.log", f"job-{job}.exitcode",
                                      f"job-{job}.rank-0.log", f"job-{job}.rank-1.log"}
    assert [p.name for p in made if p.stat().st_mode & 0o022] == []
