"""More of PBS against the real OpenPBS 23.06 of the session (tests/conftest.py pbs_cluster): job arrays
(-J) with their status, list and cancel read from the real qstat; hostile --env values, --setup and -k doe
through the real qsub and Open MPI to ranks on two hosts; the job name rule of the real qsub; what the real
server does at the walltime; the shipped site profiles' directives accepted by a server that defines the
sites' custom resources and queues (created with qmgr, as those sites do).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import run_cli, wait_for_files
from tests.real.test_pbs_real import AS_ROOT, _raw, _until, submitted

pytestmark = pytest.mark.pbs

# Each array element writes its index and world as the launcher gave them, one line to its output (-k doe:
# in place while it runs), then waits for its release file.
ELEMENT = """
import os, sys, time
d, i = sys.argv[1], os.environ["PBS_ARRAY_INDEX"]
os.write(1, ("ELEMENT " + i + "\\n").encode())
with open(os.path.join(d, ".idx-" + i), "w") as f:  # written whole, then named: the test reads it once it shows
    f.write(" ".join([i, os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["PBS_JOBID"]]))
os.replace(os.path.join(d, ".idx-" + i), os.path.join(d, "idx-" + i))
deadline = time.monotonic() + 300
while not os.path.exists(os.path.join(d, "release-" + i)) and time.monotonic() < deadline:
    time.sleep(0.2)
"""


def _status(env: dict[str, str], cwd: Path, job: str) -> dict[str, object]:
    r = run_cli("status", job, "--json", env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out


def _status_until(env: dict[str, str], cwd: Path, job: str, done: object, what: str,
                  timeout: float = 120) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        st = _status(env, cwd, job)
        if done(st):  # type: ignore[operator]
            return st
        assert time.monotonic() < deadline, f"{job}: waited {timeout:.0f} s for {what}; last {st}"
        time.sleep(0.5)


def test_an_array_runs_reads_and_cancels_through_the_real_server(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """--array 0-3 is one -J 0-3 job; each element sees its PBS_ARRAY_INDEX (a world of its own), writes its
    output in place while it runs (-k doe); status and list read the array (job_state B) and its subjobs
    from the real qstat; one element cancelled, one ended by itself, the rest cancelled with the array: the
    qdel'd ones read CANCELLED (PBS says Exit_status 0, substate 91), never COMPLETED."""
    script = tmp_path / "element.py"
    script.write_text(ELEMENT)
    r = run_cli("submit", "--scheduler", "pbs", "--array", "0-3", *AS_ROOT, str(script), str(tmp_path),
                env=pbs_env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    printed = submitted(r.stderr)
    assert re.fullmatch(r"\d+\[\]\.head", printed), printed
    job = printed.split("[", 1)[0]
    assert f"({job}[INDEX].head in slurmlaunch status/logs)" in r.stderr, r.stderr  # named as qstat names them
    try:
        seen = sorted(p.read_text().split() for p in wait_for_files(tmp_path, "idx-*", 4, timeout=180))
        assert [s[:3] for s in seen] == [[str(i), "0", "1"] for i in range(4)], seen
        assert [s[3] for s in seen] == [f"{job}[{i}].head" for i in range(4)], seen
        assert _raw(pbs_env, printed)["job_state"] == "B"
        st = _status(pbs_env, tmp_path, job)
        assert st["state"] == "RUNNING" and st["elements"] == {str(i): "RUNNING" for i in range(4)}, st
        listed = {row["job_id"]: row for row in json.loads(run_cli("list", "--json", env=pbs_env,
                                                                    cwd=tmp_path).stdout)}
        assert listed[printed]["state"] == "RUNNING", listed
        for i in range(4):  # -k doe: the element's output is in place while it runs
            out = tmp_path / "slurmlaunch-logs" / f"{job}[{i}].head.OU"
            assert f"ELEMENT {i}" in out.read_text(), out

        c = run_cli("cancel", f"{job}[2]", env=pbs_env, cwd=tmp_path)  # qstat's spelling names it too
        assert c.returncode == 0 and c.stdout == f"cancelled job {job}[2].head\n", c
        (tmp_path / "release-0").touch()
        st = _status_until(pbs_env, tmp_path, job, lambda s: s["elements"]["0"] == "COMPLETED 0"  # type: ignore
                           and s["elements"]["2"] == "CANCELLED 1", "element 0 done and 2 cancelled")
        assert st["state"] == "RUNNING" and st["elements"]["1"] == st["elements"]["3"] == "RUNNING", st
        assert _raw(pbs_env, f"{job}[2].head")["job_state"] == "X"  # a finished subjob of a running array
        assert _status(pbs_env, tmp_path, f"{job}_2")["state"] == "CANCELLED"
        assert _status(pbs_env, tmp_path, f"{job}[2].head")["job_id"] == f"{job}[2].head"
    finally:
        subprocess.run(["qdel", f"{job}[]"], env=pbs_env, capture_output=True, timeout=60)
    _until(pbs_env, printed, lambda raw: raw["job_state"] == "F")
    st = _status(pbs_env, tmp_path, job)
    assert (st["state"], st["exit_code"], st["elements"]) == (
        "CANCELLED", 1, {"0": "COMPLETED 0", "1": "CANCELLED 1", "2": "CANCELLED 1", "3": "CANCELLED 1"}), st
    text = run_cli("status", job, env=pbs_env, cwd=tmp_path).stdout
    assert text.startswith(f"job {printed} (pbs): CANCELLED") and f"\n  {job}[0].head: COMPLETED 0\n" in text, text
    listed = {row["job_id"]: row for row in json.loads(run_cli("list", "--json", env=pbs_env, cwd=tmp_path).stdout)}
    assert listed[printed]["state"] == "CANCELLED", listed


ECHO = """
import os, sys
line = " ".join(["ENV", os.environ["RANK"], repr(os.environ.get("HOSTILE")), repr(os.environ.get("FROM_SETUP")),
                 repr(sys.argv[1:])])
os.write(1, (line + "\\n").encode())
"""
HOSTILE = "a b 'q' \"d\" $(touch PWNED) `touch PWNED2` ; | & * \\ \ttab\nnewline ${HOME} %s"


def test_hostile_env_and_arguments_reach_both_hosts_byte_for_byte(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """--env and script arguments with quotes, $(...), backquotes, a tab and a newline reach the ranks on
    two hosts (through qsub, the script, mpiexec -x and pbs_tmrsh) unchanged and never run; a --setup line
    sees the --env value and exports its own variable to every rank (export A="x y" names A only)."""
    script = tmp_path / "echo.py"
    script.write_text(ECHO)
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "1", *AS_ROOT, "--env",
                f"HOSTILE={HOSTILE}", "--setup", 'export FROM_SETUP="set up: $HOSTILE"', "--wait", "--wait-timeout",
                "200", str(script), HOSTILE, env=pbs_env, cwd=tmp_path, timeout=300)
    job = submitted(r.stderr)
    assert r.returncode == 0, r.stderr
    out = (tmp_path / "slurmlaunch-logs" / f"{job}.OU").read_text()
    untagged = re.sub(r"\[\d+,\d+\]<std(?:out|err)>:", "", out)
    got = sorted(ln for ln in untagged.splitlines() if ln.startswith("ENV "))
    want = [f"ENV {rank} {HOSTILE!r} {'set up: ' + HOSTILE!r} {[HOSTILE]!r}" for rank in (0, 1)]
    assert got == want, out
    assert "could not find environment variable" not in out, out  # mpiexec -x named no stray word
    assert not list(tmp_path.rglob("PWNED*"))


@pytest.mark.parametrize("name", ["x$(id)", "a=b", "a,b", "a" * 231])
def test_a_name_the_real_qsub_refuses_is_refused_before_it(pbs_env: dict[str, str], tmp_path: Path,
                                                          name: str) -> None:
    """What OpenPBS's qsub refuses as -N ("illegal -N value", "Job name is too long") is one line here, exit 2,
    nothing submitted; the boundary of each is what the real qsub takes."""
    real = subprocess.run(["qsub", "-h", "-N", name, "--", "/bin/true"], env=pbs_env, capture_output=True,
                          text=True, timeout=60)
    assert real.returncode != 0, real.stdout  # the oracle: the real qsub refuses it
    ok = subprocess.run(["qsub", "-h", "-N", "a" * 230 if len(name) > 230 else "a.b-c_d+1", "--", "/bin/true"],
                        env=pbs_env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    subprocess.run(["qdel", ok.stdout.strip()], env=pbs_env, timeout=60)
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--scheduler", "pbs", "--job-name", name, "t.py", env=pbs_env, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--job-name" in r.stderr, r.stderr
    assert not (tmp_path / "slurmlaunch-logs").exists() or not list((tmp_path / "slurmlaunch-logs").glob("job-*"))


STUBBORN = """
import os, signal, sys, time
out = os.path.join(sys.argv[1], "sig-" + os.environ["RANK"])
def note(what):
    with open(out, "a") as f:
        f.write(what + "\\n")
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP, signal.SIGCONT):
    signal.signal(s, lambda n, _: note(signal.Signals(n).name))
note("START")
while True:
    time.sleep(0.2)
"""


def test_at_the_walltime_pbs_sends_no_warning(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """Ranks that ignore every signal, past a 10 s walltime: the MoM stops the job after the limit (when it
    next polls), with SIGCONT and SIGTERM to what it started, and no warning before; mpiexec, stopped by
    that SIGTERM, takes its ranks with it (the other host's rank sees no signal at all). The job reads
    TIMEOUT (Exit_status -29). So no checkpoint can be taken on a signal at the walltime under PBS."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "1", "--time", "0:00:10",
                "--signal", "none",  # what PBS itself sends (slurmlaunch's own warning: the test below)
                *AS_ROOT, "--wait", "--wait-timeout", "300", str(script), str(tmp_path), env=pbs_env, cwd=tmp_path,
                timeout=400)
    job = submitted(r.stderr)
    assert f"job {job} ended TIMEOUT" in r.stderr, r.stderr
    raw = _raw(pbs_env, job)
    assert raw["Exit_status"] == -29 and raw["substate"] == 93, raw
    seen = {p.name: p.read_text().split() for p in tmp_path.glob("sig-*")}
    assert sorted(seen) == ["sig-0", "sig-1"], seen
    signals = {s for names in seen.values() for s in names} - {"START"}
    assert signals <= {"SIGCONT", "SIGTERM"}, seen  # never a warning signal (USR1/USR2)
    assert "SIGTERM" in seen["sig-0"], seen


# Each rank waits (at most 240 s) for the warning signal, says which it got, and exits 0: the job ends long
# before its walltime only if the warning came.
WARNED = """
import os, signal, sys, time
got = []
for s in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, lambda n, _: got.append(signal.Signals(n).name))
deadline = time.monotonic() + 240
while not got and time.monotonic() < deadline:
    time.sleep(0.1)
with open(os.path.join(sys.argv[1], "warned-" + os.environ["RANK"]), "w") as f:
    f.write(" ".join(got))
sys.exit(0 if got else 3)
"""


def test_the_batch_step_sends_the_warning_before_the_walltime(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """PBS sends nothing before the walltime (above), so the batch step sends --signal itself: USR1 50 s
    before a 1-minute walltime reaches both hosts' ranks, which then end by themselves (COMPLETED, not
    TIMEOUT); the batch log says it was passed on."""
    script = tmp_path / "warned.py"
    script.write_text(WARNED)
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "1", "--time", "0:01:00",
                "--signal", "USR1@50", *AS_ROOT, "--wait", "--wait-timeout", "280", str(script), str(tmp_path),
                env=pbs_env, cwd=tmp_path, timeout=400)
    job = submitted(r.stderr)
    assert r.returncode == 0 and f"job {job} ended COMPLETED" in r.stderr, r.stderr
    seen = {p.name: p.read_text() for p in tmp_path.glob("warned-*")}
    assert seen == {"warned-0": "SIGUSR1", "warned-1": "SIGUSR1"}, seen
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "slurmlaunch-logs").iterdir() if p.is_file())
    assert "slurmlaunch: SIGUSR1, the time limit's warning: sent to ranks 0-1 (a handler for it)" in logs, logs


# The custom resources and queues the shipped profiles use, as the sites define them (qmgr).
SITE_SERVER = ["create resource filesystems type=string", "create resource system type=string, flag=h",
               "create resource storage type=string", "create resource jobfs type=size",
               "create resource wd type=boolean",
               *(f"create queue {q} queue_type=execution, enabled=true, started=true"
                 for q in ("debug", "debug-scaling", "prod", "normal", "gpuvolta"))]


@pytest.mark.parametrize("args", [
    ["--profile", "polaris", "--nodes", "2", "--account", "MyProj"],
    ["--profile", "polaris", "--nodes", "12", "--account", "MyProj"],
    ["--profile", "aurora", "--nodes", "2", "--account", "MyProj"],
    ["--profile", "gadi", "--nodes", "2", "--project", "ab12", "--pbs-resource", "storage=gdata/ab12+scratch/ab12",
     "--pbs-resource", "jobfs=100GB"],
    ["--profile", "gadi-gpuvolta", "--nodes", "1", "--project", "ab12", "--pbs-resource", "storage=gdata/ab12"],
    ["--profile", "torque", "--nodes", "2", "--account", "MyProj"],
], ids=["polaris", "polaris-prod", "aurora", "gadi", "gadi-gpuvolta", "torque"])
def test_site_profiles_are_accepted_by_the_real_qsub(pbs_env: dict[str, str], tmp_path: Path,
                                                     args: list[str]) -> None:
    """Each shipped profile's script is taken by the real qsub (held, then deleted: only acceptance is
    checked) once the server defines what the site defines; the job's Resource_List is what the profile
    asked for."""
    for line in SITE_SERVER:
        done = subprocess.run(["qmgr", "-c", line], env=pbs_env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 or re.search("Duplicate|already exists", done.stderr), (line, done.stderr)
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--scheduler", "pbs", *args, "--sbatch-arg=-h", "t.py", env=pbs_env, cwd=tmp_path,
                timeout=120)
    assert r.returncode == 0, r.stderr
    job = submitted(r.stderr)
    try:
        raw = _raw(pbs_env, job)
        assert raw["job_state"] == "H", raw
        directives = re.findall(r"^#PBS -l (\w+)=(\S+)$", (tmp_path / "slurmlaunch-logs" /
                                                            f"job-{job.split('.')[0]}.qsub").read_text(), re.M)
        listed = raw["Resource_List"]
        assert isinstance(listed, dict)
        for key, value in directives:
            if key not in ("select", "nodes", "place", "walltime", "mem", "jobfs"):  # the server rewrites these
                assert str(listed[key]) == value, (key, value, listed)
    finally:
        subprocess.run(["qdel", job], env=pbs_env, capture_output=True, timeout=60)
