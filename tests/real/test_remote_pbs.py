"""`submit --remote` to a PBS cluster, against an EMULATION of PBS on the login node: no PBS server can be
installed here, so stand-in qsub/qstat/qdel (small scripts, tests/sshd.py's login_bin) are the whole PATH of
the login node that the REAL sshd (tests/sshd.py) serves to the "laptop". They record what they are given
(qsub: its argv and the script on its stdin) and answer as PBS Pro's qstat -f [-F json] does (the JSON's shape
as a real OpenPBS 23.06 prints it, tests/real/test_pbs_real.py), from a file of states
the test writes. The script is rendered on the laptop; status, logs, cancel and list go through the PBS
edge (schedulers/pbs.py) with the ssh runner plugged in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import sshd
from tests.sshd import masters_left, on_laptop

# qsub: argv and stdin into files, the job id out. qstat: the first line of STATES is this call's answer
# (the next call gets the next line; the last stays), "LETTER [EXIT_STATUS]". qdel: argv into a file.
RECORD = "import json, os, sys\nopen(os.path.join({where!r}, sys.argv[0].rsplit('/', 1)[-1] + '.calls'), 'a')" \
         ".write(json.dumps(sys.argv[1:]) + '\\n')\n"
QSUB = "open({where!r} + '/qsub.stdin', 'w').write(sys.stdin.read())\nprint('77.pbs-server')\n"
QSTAT = """
path = {where!r} + '/states'
lines = [line for line in open(path).read().split('\\n') if line]
if len(lines) > 1:
    open(path, 'w').write('\\n'.join(lines[1:]) + '\\n')
state, _, code = lines[0].partition(' ')
job = {{'job_state': state, 'substate': 92 if state == 'F' else 42, 'exec_host': 'n1/0*4+n2/0*4'}}
if code:
    job['Exit_status'] = int(code)
print(json.dumps({{'timestamp': 1, 'pbs_version': '23.06.06', 'pbs_server': 'pbs-server',
                  'Jobs': {{'77.pbs-server': job}}}}, indent=4) if '-F' in sys.argv else
      'Job Id: 77.pbs-server\\n    job_state = ' + state + '\\n    exec_host = n1/0*4+n2/0*4'
      + ('\\n    Exit_status = ' + code if code else ''))
"""


def emulated_pbs(where: Path) -> list[str]:
    """The stand-ins, and the --remote-setup line that makes them (and no sbatch) the login node's PATH."""
    w = str(where)
    bin_dir = sshd.login_bin(where, {"qsub": RECORD.format(where=w) + QSUB.format(where=w),
                                     "qstat": RECORD.format(where=w) + QSTAT.format(where=w),
                                     "qdel": RECORD.format(where=w)})
    (where / "states").write_text("R\n")
    # the ranks' python3, which submit checks there (it runs, and is >= 3.10) before qsub
    (bin_dir / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (bin_dir / "python3").chmod(0o755)
    return ["--remote-setup", f"export PATH={bin_dir}"]


def calls(where: Path, tool: str) -> list[list[str]]:
    path = where / f"{tool}.calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_pbs_job_from_the_laptop(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """auto chooses PBS (qsub there, no sbatch: one `command -v`), the qsub script is rendered here and reaches
    qsub on its stdin, byte for byte what --dry-run shows; then status, logs, cancel and list from the laptop,
    the exit code from the file the script wrote, read on the login node."""
    setup = emulated_pbs(tmp_path)
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    remote_dir = tmp_path / "cluster" / "proj"
    name = "pbs-1.x+y_z"  # every kind of character the real qsub takes in a name ("$(" it refuses, as we do)
    args = [*setup, "--nodes", "2", "--gpus-per-node", "4", f"--job-name={name}", "train.py", "--lr", "$(id)"]
    shown = on_laptop(laptop, "submit", "--remote", f"login:{remote_dir}", "--dry-run", *args, cwd=project)
    assert shown.returncode == 0, shown.stderr
    r = on_laptop(laptop, "submit", "--remote", f"login:{remote_dir}", *args, cwd=project)
    assert r.returncode == 0, r.stderr
    assert "auto chose pbs on login (qsub is on its PATH and sbatch is not)" in r.stderr
    assert r.stdout.strip() == "77.pbs-server"
    logs = remote_dir / "slurmlaunch-logs"
    assert calls(tmp_path, "qsub") == [["-N", name, "-o", f"{logs}/"]]  # no script file: it came on stdin
    script = (tmp_path / "qsub.stdin").read_text()
    assert script == shown.stdout
    assert "#PBS -l select=2:ncpus=4:mpiprocs=4:ngpus=4" in script and f"cd {remote_dir} || exit 2" in script
    assert "'$(id)'" in script and (remote_dir / "train.py").is_file() and logs.stat().st_mode & 0o077 == 0

    st = on_laptop(laptop, "status", "77", "--json", cwd=project)
    assert st.returncode == 0, st.stderr
    info = json.loads(st.stdout)
    assert (info["state"], info["scheduler"], info["remote"], info["nodes"]) == \
        ("RUNNING", "pbs", "login", "n1/0*4+n2/0*4")
    assert calls(tmp_path, "qstat")[-1] == ["-x", "-f", "-F", "json", "77.pbs-server"]
    ls = on_laptop(laptop, "list", "--json", cwd=project)
    row = json.loads(ls.stdout)[-1]
    assert (row["job_id"], row["state"], row["directory"]) == ("77.pbs-server", "RUNNING", f"login:{logs}")
    (logs / "77.pbs-server.OU").write_text("0: hello\n1: hello ✓\n")  # as PBS Pro names the job's output
    lg = on_laptop(laptop, "logs", "77", cwd=project)
    assert lg.returncode == 0 and lg.stdout == "0: hello\n1: hello ✓\n", lg.stderr
    c = on_laptop(laptop, "cancel", "77", cwd=project)
    assert c.returncode == 0 and calls(tmp_path, "qdel") == [["77.pbs-server"]], c.stderr
    (tmp_path / "states").write_text("F 0\n")
    (logs / "job-77.exitcode").write_text("4\n")  # the script's own word wins over qstat's
    info = json.loads(on_laptop(laptop, "status", "77", "--json", cwd=project).stdout)
    assert (info["state"], info["exit_code"]) == ("FAILED", 4), info
    assert not list(tmp_path.rglob("PWNED"))
    assert masters_left(laptop) == []


def test_pbs_wait_follows_the_states_and_returns_the_exit_status(laptop: sshd.Laptop, tmp_path: Path) -> None:
    setup = emulated_pbs(tmp_path)
    (tmp_path / "states").write_text("Q\nR\nR\nF 3\n")
    (tmp_path / "train.py").write_text("")
    r = on_laptop(laptop, "submit", "--remote", f"login:{tmp_path / 'cluster'}", "--scheduler", "pbs", *setup,
                  "--wait", "train.py", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "auto chose" not in r.stderr  # named: no `command -v` needed
    for state in ("PENDING", "RUNNING"):
        assert f"job 77.pbs-server {state}" in r.stderr, r.stderr
    assert "job 77.pbs-server ended FAILED, exit code 3" in r.stderr
    assert masters_left(laptop) == []


@pytest.mark.parametrize(("args", "expect"), [
    (["--array", "0-3"], "--array/--sweep"), (["--apptainer", "img.sif"], "--container-image/--apptainer"),
])
def test_what_pbs_over_ssh_does_not_do_yet_is_refused(laptop: sshd.Laptop, tmp_path: Path, args: list[str],
                                                      expect: str) -> None:
    (tmp_path / "train.py").write_text("")
    r = on_laptop(laptop, "submit", "--remote", "login:/abs/dir", "--scheduler", "pbs", "--dry-run", *args,
                  "train.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr


def test_a_login_node_without_sbatch_or_qsub_is_one_line(laptop: sshd.Laptop, tmp_path: Path) -> None:
    bin_dir = sshd.login_bin(tmp_path, {})
    (tmp_path / "train.py").write_text("")
    r = on_laptop(laptop, "submit", "--remote", "login:/abs/dir", "--remote-setup", f"export PATH={bin_dir}",
                  "--dry-run", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "neither sbatch nor qsub" in r.stderr, r.stderr
    assert masters_left(laptop) == []
