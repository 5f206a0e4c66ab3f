"""What --remote costs over local work, against a real sshd on 127.0.0.1 (tests/sshd.py; needs root and
openssh-server). Prints medians and ratios of one run; nothing is asserted (machines are noisy).

    python benchmarks/remote.py [--repeat N]

Measured: one ssh round trip over a warm (multiplexed) connection; `submit --dry-run` locally and with
--remote (each command opens and closes its own connection, as the CLI does); syncing an unchanged
1,000-file project over a warm connection.
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
    server = sshd.start_sshd()
    try:
        work = Path(tempfile.mkdtemp(prefix="slurmlaunch-bench-remote-"))
        lap = sshd.make_laptop(server, work)
        os.environ.update(lap.env)
        project = work / "proj"
        (project / "pkg").mkdir(parents=True)
        for i in range(1000):
            (project / "pkg" / f"m{i:04d}.py").write_text(f"x = {i}\n")
        (project / "train.py").write_text("print('hi')\n")
        target = work / "remote-side"

        def cli(*args: str) -> None:
            subprocess.run([sys.executable, "-m", "slurmlaunch", *args], cwd=project, env=lap.env, check=True,
                           capture_output=True, timeout=120)

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
    ms = 1000.0
    print(f"median of {n}, this machine, sshd on 127.0.0.1")
    print(f"  ssh round trip, warm connection (remote shell start included): {round_trip * ms:7.1f} ms")
    print(f"  submit --dry-run, local:                                       {local * ms:7.1f} ms")
    print(f"  submit --dry-run --remote login:/abs (no ssh needed):          {absolute * ms:7.1f} ms "
          f"(x{absolute / local:.2f} of local)")
    print(f"  submit --dry-run --remote login (connect, 1 round trip, close): {relative * ms:7.1f} ms "
          f"(x{relative / local:.2f} of local; +{(relative - local) * ms:.0f} ms)")
    print(f"  sync of an unchanged 1,000-file project, warm connection:      {unchanged * ms:7.1f} ms "
          f"({sent} files sent; x{unchanged / round_trip:.1f} of a round trip)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
