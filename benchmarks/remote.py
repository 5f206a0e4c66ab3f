"""What --remote costs over local work, against a real sshd on 127.0.0.1 (tests/sshd.py; needs root and
openssh-server). Prints medians and ratios of one run; nothing is asserted (machines are noisy).

    python benchmarks/remote.py [--repeat N]

Measured: one ssh round trip over a warm (multiplexed) connection; `submit --dry-run` locally and with
--remote (each command opens and closes its own connection, as the CLI does); syncing an unchanged
1,000-file project over a warm connection; `status` of a running job on the dev cluster (started here,
loopback): the Slurm edge's status in this process, locally against the same edge with the ssh runner
plugged in (remote_runner.SshRunner) over a warm connection, and the `status` command locally against
`status` of a remote job from the laptop (which opens its own connection).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmlaunch.app import remote  # noqa: E402
from slurmlaunch.app.devcluster import slurm as devcluster  # noqa: E402
from slurmlaunch.app.remote.runner import SshRunner  # noqa: E402
from slurmlaunch.schedulers import JobStatus, slurm  # noqa: E402
from slurmlaunch.schedulers.runner import use_runner  # noqa: E402
from tests import sshd  # noqa: E402


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=7)
    n = p.parse_args().repeat
    why = sshd.missing()
    if why:
        print(f"skipped: {why}")
        return 0
    why = devcluster.missing_requirements()
    if why:
        print(f"skipped: {why}")
        return 0
    here_env = dict(os.environ)
    cluster_root = Path(tempfile.mkdtemp(prefix="slurmlaunch-bench-cluster-"))
    cluster_env = devcluster.up(cluster_root, nodes=1, gpus=0, cpus=2)
    server = sshd.start_sshd()
    try:
        work = Path(tempfile.mkdtemp(prefix="slurmlaunch-bench-remote-"))
        lap = sshd.make_laptop(server, work)
        local_env = {**here_env, **cluster_env, "SLURMLAUNCH_ALLOW_LOOPBACK": "1",
                     "XDG_STATE_HOME": str(work / "local-state")}
        os.environ.update(lap.env)
        project = work / "proj"
        (project / "pkg").mkdir(parents=True)
        for i in range(1000):
            (project / "pkg" / f"m{i:04d}.py").write_text(f"x = {i}\n")
        (project / "train.py").write_text("print('hi')\n")
        target = work / "remote-side"

        def cli(*args: str, env: dict[str, str] = lap.env) -> str:
            return subprocess.run([sys.executable, "-m", "slurmlaunch", *args], cwd=project, env=env, check=True,
                                  capture_output=True, text=True, timeout=120).stdout

        # One sleeping job submitted locally, one from the laptop: status is asked of running jobs.
        (project / "sleeper.py").write_text("import time\ntime.sleep(600)\n")
        setup = ["--remote-setup", f"export SLURM_CONF={cluster_env['SLURM_CONF']}"]
        local_job = cli("submit", "--scheduler", "slurm", "--python", sys.executable, "sleeper.py",
                        env=local_env).strip()
        remote_job = cli("submit", "--remote", f"login:{target}", *setup, "--python", sys.executable,
                         "sleeper.py").strip()
        log_dir = str(project / "slurmlaunch-logs")
        os.environ["SLURM_CONF"] = cluster_env["SLURM_CONF"]
        os.environ["PATH"] = here_env["PATH"]  # the Slurm edge in this process needs squeue
        slurm.status(local_job, log_dir)
        edge = median_s(lambda: slurm.status(local_job, log_dir), n)
        os.environ["PATH"] = lap.env["PATH"]
        del os.environ["SLURM_CONF"]
        with remote.Connection(remote.parse_destination("login"), setup[1::2]) as conn:
            runner = SshRunner(conn)

            def remote_status() -> JobStatus:
                with use_runner(runner):
                    return slurm.EDGE.status(remote_job, str(target / "slurmlaunch-logs"))

            remote_status()
            probed = median_s(remote_status, n)
            state = remote_status().state
            conn.run_argv(["scancel", remote_job])
        status_local = median_s(lambda: cli("status", local_job, env=local_env), n)
        status_remote = median_s(lambda: cli("status", remote_job), n)
        cli("cancel", local_job, env=local_env)

        with remote.Connection(remote.parse_destination("login")) as conn:
            conn.run_argv(["true"])  # the master
            round_trip = median_s(lambda: conn.run_argv(["true"]), n)
            remote.sync(conn, str(project), str(target))
            unchanged = median_s(lambda: remote.sync(conn, str(project), str(target)), n)
            sent = remote.sync(conn, str(project), str(target)).sent_files
        local = median_s(lambda: cli("submit", "--scheduler", "slurm", "--dry-run", "--nodes", "2", "train.py"), n)
        absolute = median_s(lambda: cli("submit", "--remote", f"login:{target}", "--dry-run", "--nodes", "2",
                                        "train.py"), n)
        relative = median_s(lambda: cli("submit", "--remote", "login", "--dry-run", "--nodes", "2", "train.py"), n)
    finally:
        sshd.remove(server)
        devcluster.down(cluster_root)
    ms = 1000.0
    print(f"median of {n}, this machine, sshd on 127.0.0.1")
    print(f"  ssh round trip, warm connection (remote shell start included): {round_trip * ms:7.1f} ms")
    print(f"  submit --dry-run, local:                                       {local * ms:7.1f} ms")
    print(f"  submit --dry-run --remote login:/abs (1 round trip: command -v): {absolute * ms:7.1f} ms "
          f"(x{absolute / local:.2f} of local)")
    print(f"  submit --dry-run --remote login (connect, 2 round trips, close):{relative * ms:7.1f} ms "
          f"(x{relative / local:.2f} of local; +{(relative - local) * ms:.0f} ms)")
    print(f"  sync of an unchanged 1,000-file project, warm connection:      {unchanged * ms:7.1f} ms "
          f"({sent} files sent; x{unchanged / round_trip:.1f} of a round trip)")
    print(f"  status, in process: Slurm edge locally:                       {edge * ms:7.1f} ms")
    print(f"  status, in process: Slurm edge over ssh, warm ({state}):      {probed * ms:7.1f} ms "
          f"(x{probed / edge:.2f} of local; x{probed / round_trip:.2f} of a round trip; "
          f"+{(probed - edge - round_trip) * ms:.0f} ms beyond one round trip)")
    print(f"  status command, local job:                                    {status_local * ms:7.1f} ms")
    print(f"  status command, remote job (connect, 1 round trip, close):    {status_remote * ms:7.1f} ms "
          f"(x{status_remote / status_local:.2f} of local)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
