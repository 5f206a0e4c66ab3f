"""The local scheduler under everything at once, in one output directory and one job index: 50 submissions
from PID namespaces of their own (every submitter is pid 1 there, as in containers), a reader that goes away,
HUP/TERM/INT to submitters, a segfaulting rank whose siblings left daemons. Afterwards: no process of any
job alive, no record overwritten, every rank log complete, every job in the index."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.helpers import DAEMONS, SLEEPERS, no_slurm_env, run_cli, skip_or_fail, wait_for_files

LINES = """
import os, sys
rank, tag = int(os.environ["RANK"]), sys.argv[2]
for i in range(int(sys.argv[3])):
    print(f"{tag} rank {rank} line {i}")
"""


def marked_processes(mark: str) -> list[int]:
    """Processes (any pid namespace: /proc here is the root one) whose environment carries ``mark``."""
    needle = f"STRESS_MARK={mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return found


def test_everything_at_once(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("PID namespaces for the stress test need root and unshare (util-linux)")
    mark = uuid.uuid4().hex
    env = no_slurm_env(tmp_path)
    env["PATH"] += ":/usr/bin:/bin"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # an index of its own: `list` must show exactly these jobs
    scripts = {}
    for name, text in (("lines", LINES), ("sleepers", SLEEPERS), ("daemons", DAEMONS)):
        scripts[name] = tmp_path / f"{name}.py"
        scripts[name].write_text(text)
    logs = tmp_path / "logs"

    def submit(script: str, *args: str, ns: bool = False, job_args: tuple[str, ...] = (),
               stdout: int | None = subprocess.DEVNULL, where: Path = tmp_path) -> subprocess.Popen[bytes]:
        where.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "local", "-o", str(logs),
               "--env", f"STRESS_MARK={mark}", *args, str(scripts[script]), str(where), *job_args]
        if ns:  # a PID namespace of its own, with its own /proc: the submitter is pid 1 there
            cmd = ["unshare", "--pid", "--fork", "--mount-proc", *cmd]
        return subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE)

    crowd = [submit("lines", "--tasks-per-node", "2", ns=True, job_args=(f"crowd{i}", "300")) for i in range(50)]
    reader = submit("lines", "--tasks-per-node", "2", job_args=("reader", "20000"), stdout=subprocess.PIPE)
    stopped = {sig: submit("sleepers", "--nodes", "2", where=tmp_path / f"stop-{sig}")
               for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    segv = submit("daemons", "--tasks-per-node", "3", where=tmp_path / "segv")
    everyone = [*crowd, reader, *stopped.values(), segv]
    try:
        assert reader.stdout is not None
        for _ in range(3):
            reader.stdout.readline()
        reader.stdout.close()
        for sig, proc in stopped.items():
            wait_for_files(tmp_path / f"stop-{sig}", "pid-*", 2, timeout=300)  # its ranks are up
            proc.send_signal(sig)
        errors = {id(p): p.communicate(timeout=600)[1].decode() for p in everyone}
    finally:
        for p in everyone:
            p.kill()
    for p in crowd:
        assert p.returncode == 0, errors[id(p)]
    assert reader.returncode == 0, errors[id(reader)]
    for sig, proc in stopped.items():
        assert proc.returncode == 128 + sig, errors[id(proc)]
    assert segv.returncode == 128 + signal.SIGSEGV, errors[id(segv)]
    assert not any("Traceback" in e for e in errors.values())

    assert marked_processes(mark) == [], "a process of a job outlived it"

    records = [json.loads(p.read_text()) for p in logs.glob("job-*.json")]
    ids = [r["job_id"] for r in records]
    assert len(ids) == len(everyone) == len(set(ids)), "a job id was given twice or a record overwritten"
    index = run_cli("list", "--json", env=env, cwd=tmp_path)
    assert sorted(e["job_id"] for e in json.loads(index.stdout)) == sorted(ids)
    by_tag: dict[str, str] = {}
    for record in records:
        args = record["spec"]["args"]
        if record["spec"]["script"].endswith("lines.py"):
            by_tag[args[1]] = record["job_id"]
    assert len(by_tag) == 51
    for tag, job_id in by_tag.items():
        count = 20000 if tag == "reader" else 300
        for rank in (0, 1):
            text = (logs / f"job-{job_id}.rank-{rank}.log").read_text()
            # rank 0 says once why OMP_NUM_THREADS=1 (2 ranks share the node)
            text = "".join(line for line in text.splitlines(keepends=True)
                           if not line.startswith("slurmlaunch: OMP_NUM_THREADS="))
            assert text == "".join(f"{tag} rank {rank} line {i}\n" for i in range(count)), (tag, rank)
        code = (logs / f"job-{job_id}.exitcode").read_text().split()
        assert code == ["0", "COMPLETED"]
