"""PBS at real sites: the shipped site profiles against a table of each site's documented directives, every
option PBS cannot carry out refused with one line, the ones it can mapped (requeue, arrays, site resources),
and PBS's job-name rule. There is no PBS server here: scripts are checked as text and with `bash -n`.

The tables below are facts read from the sites' own documents (named per row); they are the oracle the
rendered scripts are held to, line by line: every #PBS line must be one the site documents, and every line
the site makes mandatory must be there.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from slurmlaunch import cli
from slurmlaunch.core.errors import SpecError
from slurmlaunch.render import pbs_script
from slurmlaunch.schedulers import pbs
from tests.helpers import GOLDEN, golden_spec

ALCF_POLARIS = "docs.alcf.anl.gov/polaris/running-jobs/"
ALCF_AURORA = "docs.alcf.anl.gov/aurora/running-jobs-aurora/"
NCI_GADI = "opus.nci.org.au: Gadi User Guide, PBS directives and queue limits"
OPENPBS = "OpenPBS / PBS Professional qsub(1B) and Reference Guide"
TORQUE = "Torque qsub(1B) (e.g. manpages.ubuntu.com torque-client qsub.1B)"

# site -> (profile, extra submit options, {documented directive pattern: source}, mandatory patterns)
SITES: dict[str, tuple[list[str], dict[str, str], list[str]]] = {
    "polaris": (["--nodes", "2", "--account", "MyProj"], {
        r"-l select=\d+:system=polaris": ALCF_POLARIS,
        r"-l place=scatter": ALCF_POLARIS,
        r"-l walltime=\d+:\d\d:\d\d": ALCF_POLARIS,
        r"-l filesystems=home:eagle": ALCF_POLARIS,
        r"-q (debug|debug-scaling|prod)": ALCF_POLARIS,
        r"-A MyProj": ALCF_POLARIS,
        r"-k doe": ALCF_AURORA,  # ALCF's recommended options
        r"-j oe": OPENPBS,
    }, [r"-l select=2:system=polaris", r"-l walltime=", r"-l filesystems=", r"-q debug", r"-A MyProj"]),
    "aurora": (["--nodes", "4", "--account", "MyProj"], {
        r"-l select=\d+": ALCF_AURORA,
        r"-l place=scatter": ALCF_AURORA,
        r"-l walltime=\d+:\d\d:\d\d": ALCF_AURORA,
        r"-l filesystems=flare": ALCF_AURORA,
        r"-k doe": ALCF_AURORA,
        r"-q (debug|debug-scaling|prod)": ALCF_AURORA,
        r"-A MyProj": ALCF_AURORA,
        r"-j oe": OPENPBS,
    }, [r"-l select=4", r"-l place=scatter", r"-l walltime=", r"-l filesystems=", r"-k doe", r"-q debug-scaling",
        r"-A MyProj"]),
    "gadi": (["--nodes", "2", "--project", "ab12", "--pbs-resource", "storage=gdata/ab12+scratch/ab12"], {
        r"-P ab12": NCI_GADI,
        r"-q normal": NCI_GADI,
        r"-l ncpus=96": NCI_GADI,  # whole nodes: 48 cores each
        r"-l mem=380gb": NCI_GADI,
        r"-l walltime=\d+:\d\d:\d\d": NCI_GADI,
        r"-l storage=gdata/ab12\+scratch/ab12": NCI_GADI,
        r"-l wd": NCI_GADI,
        r"-j oe": OPENPBS,
        r"-k doe": OPENPBS,
    }, [r"-P ab12", r"-q normal", r"-l ncpus=96", r"-l mem=", r"-l walltime=", r"-l storage=", r"-l wd"]),
    "gadi-gpuvolta": (["--nodes", "2", "--project", "ab12"], {
        r"-P ab12": NCI_GADI,
        r"-q gpuvolta": NCI_GADI,
        r"-l ncpus=96": NCI_GADI,  # 12 x ngpus
        r"-l ngpus=8": NCI_GADI,
        r"-l mem=764gb": NCI_GADI,
        r"-l walltime=\d+:\d\d:\d\d": NCI_GADI,
        r"-l wd": NCI_GADI,
        r"-j oe": OPENPBS,
        r"-k doe": OPENPBS,
    }, [r"-q gpuvolta", r"-l ncpus=96", r"-l ngpus=8", r"-l mem="]),
    "torque": (["--nodes", "2", "--gpus-per-node", "2", "--time", "30", "--account", "acct", "--partition", "batch",
                "--mem", "8G"], {
        r"-l nodes=2:ppn=2:gpus=2": TORQUE,
        r"-l mem=16gb": TORQUE,
        r"-l walltime=\d+:\d\d:\d\d": TORQUE,
        r"-q batch": TORQUE,
        r"-A acct": TORQUE,
        r"-j oe": TORQUE,
    }, [r"-l nodes=2:ppn=2:gpus=2", r"-l walltime=0:30:00", r"-q batch", r"-A acct"]),
}


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["submit", "--dry-run", *args, "train.py"])
    out, err = capsys.readouterr()
    return code, out, err


def pbs_lines(script: str) -> list[str]:
    return [line[len("#PBS "):] for line in script.splitlines() if line.startswith("#PBS ")]


@pytest.mark.parametrize("name", sorted(SITES))
def test_site_profile_matches_the_sites_documented_directives(site: Path, capsys: pytest.CaptureFixture[str],
                                                             name: str) -> None:
    options, documented, mandatory = SITES[name]
    code, out, err = dry_run(capsys, "--profile", name, *options)
    assert code == 0, err
    lines = pbs_lines(out)
    for line in lines:
        assert any(re.fullmatch(p, line) for p in documented), f"{name}: #PBS {line} is not a documented directive"
    for pattern in mandatory:
        assert any(re.match(pattern, line) for line in lines), f"{name}: no #PBS {pattern} ({lines})"
    assert out.startswith("#!/bin/bash -l\n")  # the sites' examples use a login shell (modules)
    golden = GOLDEN / f"pbs_site_{name}.qsub"
    text = out.replace(str(site), "/home/me/project").replace(cli.sys.executable, "/opt/venv/bin/python")
    if os.environ.get("SLURMLAUNCH_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), f"rendered script differs from {golden} (SLURMLAUNCH_UPDATE_GOLDEN=1)"
    assert subprocess.run(["bash", "-n", str(golden)]).returncode == 0


def test_queue_follows_the_node_count(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # ALCF Polaris: debug takes 1-2 nodes, debug-scaling up to 10, prod (routing) 10-496.
    for nodes, queue in (("1", "debug"), ("2", "debug"), ("3", "debug-scaling"), ("10", "prod"), ("496", "prod")):
        code, out, err = dry_run(capsys, "--profile", "polaris", "--nodes", nodes)
        assert code == 0 and f"#PBS -q {queue}\n" in out, (nodes, err)
    code, out, _ = dry_run(capsys, "--profile", "polaris", "--nodes", "40", "--partition", "preemptable")
    assert code == 0 and "#PBS -q preemptable\n" in out and "-q prod" not in out
    code, _, err = dry_run(capsys, "--profile", "polaris", "--nodes", "600")
    assert code == 2 and "--nodes 600" in err and "--pbs-queues" in err and err.count("\n") == 1, err


def test_aurora_binds_ranks_to_cores_by_list_skipping_reserved_cores(site: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = dry_run(capsys, "--profile", "aurora", "--nodes", "2")
    assert code == 0, err
    mpiexec = next(line for line in out.splitlines() if line.startswith("mpiexec "))
    assert "-n 24 --ppn 12" in mpiexec and "--cpu-bind depth" not in mpiexec
    cores = re.search(r"--cpu-bind=list:(\S+)", mpiexec)
    assert cores is not None
    ranges = [tuple(map(int, r.split("-"))) for r in cores[1].split(":")]
    used = {c for lo, hi in ranges for c in range(lo, hi + 1)}
    assert len(ranges) == 12 and not used & {0, 52}  # ALCF reserves cores 0 and 52 (one per socket)
    assert sum(hi < 52 for _, hi in ranges) == 6  # 6 ranks per socket, as its 6 tiles


def test_a_users_profile_adds_to_a_shipped_one(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (site / "slurmlaunch.toml").write_text('[profiles.polaris]\naccount = "MyProj"\n'
                                           'pbs-resource = ["filesystems=home:eagle:grand"]\n')
    code, out, err = dry_run(capsys, "--profile", "polaris")
    assert code == 0, err
    assert "#PBS -A MyProj\n" in out and "#PBS -l filesystems=home:eagle:grand\n" in out
    assert cli.main(["config", "profiles"]) == 0
    assert {"polaris", "aurora", "gadi", "gadi-gpuvolta", "torque"} <= set(capsys.readouterr().out.split())


@pytest.mark.parametrize("profile", ["gadi", "gadi-gpuvolta"])
def test_account_is_the_project_gadi_charges(site: Path, capsys: pytest.CaptureFixture[str], profile: str) -> None:
    """Gadi charges the project named by -P (NCI_GADI), not PBS's -A account string: --account proj42, as a
    user coming from Slurm or ALCF writes it, is #PBS -P proj42; with a different --project it is refused."""
    code, out, err = dry_run(capsys, "--profile", profile, "--account", "proj42")
    assert code == 0, err
    assert "-P proj42" in pbs_lines(out) and not [line for line in pbs_lines(out) if line.startswith("-A")]
    code, out, err = dry_run(capsys, "--profile", profile, "--account", "proj42", "--project", "proj42")
    assert code == 0 and pbs_lines(out).count("-P proj42") == 1, err
    code, out, err = dry_run(capsys, "--profile", profile, "--account", "proj42", "--project", "ab12")
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "--account proj42 and --project ab12" in err and "charges the project named by -P" in err
    assert cli.main(["config", "show", "--profile", profile]) == 0
    assert "account-as" not in capsys.readouterr().out  # a site fact, not an option


def test_account_as_in_a_users_own_site_profile(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (site / "slurmlaunch.toml").write_text('[profiles.mysite]\nscheduler = "pbs"\naccount-as = "project"\n'
                                           'account = "ab12"\n[profiles.bad]\nscheduler = "pbs"\naccount-as = "P"\n')
    code, out, err = dry_run(capsys, "--profile", "mysite")
    assert code == 0 and "-P ab12" in pbs_lines(out) and "-A ab12" not in pbs_lines(out), err
    code, out, err = dry_run(capsys, "--profile", "bad")
    assert code == 2 and len(err.splitlines()) == 1 and "account-as = 'P' is not valid" in err, err
    code, out, err = dry_run(capsys, "--profile", "polaris", "--account", "MyProj")  # ALCF charges -A
    assert code == 0 and "-A MyProj" in pbs_lines(out) and not any(x.startswith("-P") for x in pbs_lines(out))


# option -> (the value PBS cannot carry out, a word the one-line refusal must contain)
REFUSED: dict[str, tuple[list[str], str]] = {
    "qos": (["--qos", "high"], "--qos"),
    "constraint": (["--constraint", "a100"], "--constraint"),
    "gpu-flag": (["--gpus-per-node", "2", "--gpu-flag", "gres"], "--gpu-flag"),
    "container-image": (["--container-image", "img"], "--container-image"),
    "mode": (["--mode", "torchrun"], "--mode"),
    "max-requeues of an array": (["--time", "10", "--array", "0-3", "--requeue", "--max-requeues", "5"],
                                 "--max-requeues"),
    "max-requeues on torque": (["--pbs-flavour", "torque", "--time", "10", "--requeue", "--max-requeues", "5"],
                               "--max-requeues"),
    "mem 0": (["--mem", "0"], "--mem 0"),
    "mem 0G": (["--mem", "0G"], "--mem 0G"),
    "time UNLIMITED": (["--time", "UNLIMITED"], "--time UNLIMITED"),
    "time infinite": (["--time", "infinite"], "--time infinite"),
    "name with a space": (["--job-name", "my run"], "--job-name"),
    "name with a newline": (["--job-name", "run\nx"], "--job-name"),
    "name starting with _": (["--job-name", "_run"], "--job-name"),
    "name of 237 characters": (["--job-name", "a" * 237], "--job-name"),
    "exclusive on torque": (["--pbs-flavour", "torque", "--exclusive"], "--exclusive"),
    "chunk on torque": (["--pbs-flavour", "torque", "--pbs-chunk", "a=b"], "--pbs-chunk"),
    "project on torque": (["--pbs-flavour", "torque", "--project", "x"], "--project"),
    "array list on PBS Pro": (["--array", "1,3,8"], "--array"),
    "array of one": (["--array", "3"], "--array"),
    "resource select": (["--pbs-resource", "select=3"], "--pbs-resource"),
    "resource walltime": (["--pbs-resource", "walltime=1:00:00"], "--pbs-resource"),
    "resource with a space": (["--pbs-resource", "a=b c"], "--pbs-resource"),
    "resource with a newline": (["--pbs-resource", "a=b\n"], "--pbs-resource"),
    "chunk with a newline": (["--pbs-chunk", "a=b\n"], "--pbs-chunk"),
    "resource ncpus with totals": (["--pbs-request", "totals", "--pbs-resource", "ncpus=4"], "--pbs-resource"),
    "chunk ngpus": (["--pbs-chunk", "ngpus=2"], "--pbs-chunk"),
    "chunk without value": (["--pbs-chunk", "bigmem"], "--pbs-chunk"),
    "chunk with totals": (["--pbs-request", "totals", "--pbs-chunk", "a=b"], "--pbs-chunk"),
    "bad queues": (["--pbs-queues", "debug:2-1"], "--pbs-queues"),
    "mpiexec arg": (["--mpiexec-arg", "oops"], "--mpiexec-arg"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_pbs_cannot_carry_out_is_refused_with_one_line(site: Path, capsys: pytest.CaptureFixture[str],
                                                            case: str) -> None:
    args, word = REFUSED[case]
    code, out, err = dry_run(capsys, "--scheduler", "pbs", *args)
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and word in err and "Traceback" not in err, err


@pytest.mark.parametrize("scheduler", ["slurm", "local"])
@pytest.mark.parametrize("args", [["--pbs-resource", "wd"], ["--pbs-chunk", "system=x"], ["--project", "ab12"],
                                  ["--pbs-request", "totals"], ["--pbs-queues", "q:1-"], ["--mpiexec-arg=--x"]])
def test_pbs_options_are_refused_elsewhere(site: Path, capsys: pytest.CaptureFixture[str], scheduler: str,
                                           args: list[str]) -> None:
    (site / "bin" / "sbatch").write_text("#!/bin/sh\nexit 99\n")
    (site / "bin" / "sbatch").chmod(0o755)
    code, _, err = dry_run(capsys, "--scheduler", scheduler, *args)
    assert code == 2 and err.count("\n") == 1 and args[0].split("=")[0] in err, err


@pytest.mark.parametrize(("name", "ok"), [
    ("train", True), ("0run", True), ("a" * 230, True), ("run-1.x+y", True),
    ("", False), ("-run", False), ("_run", False), (".run", False), ("a b", False), ("a\tb", False),
    ("a" * 231, False), ("ab\n", False), ("a=b", False), ("a,b", False), ("x$(id)", False), ("a'b", False),
])
def test_job_name_rule(name: str, ok: bool) -> None:
    # OpenPBS 23.06's qsub (tests/real/test_pbs_real_more.py): at most 230 of [A-Za-z0-9_+.-], the first alphanumeric.
    spec = golden_spec(job_name=name)
    if ok:
        pbs_script.check(spec)
        assert pbs.qsub_command(spec, "s.qsub")[1:3] == ["-N", name]
    else:
        with pytest.raises(SpecError, match="--job-name"):
            pbs_script.check(spec)


@pytest.mark.parametrize(("script", "name"), [("train.py", "train.py"), ("_private run.py", "private_run.py"),
                                              ("--.py", "py"), ("___", "slurmlaunch"),
                                              ("a=b,c$d.py", "a_b_c_d.py")])
def test_a_default_name_is_made_to_fit(script: str, name: str) -> None:
    assert pbs_script.job_name(golden_spec(script=script)) == name


def test_requeue_is_rerunnable() -> None:
    assert "-r y" in pbs_script.directives(golden_spec(time="10", requeue=True))


def test_requeue_is_a_resubmission_at_the_warning_but_not_for_an_array_or_torque() -> None:
    """The batch step's plan: --requeue MAX and the name to submit the kept script again as; the ranks are
    passed which run it is. An array's element, or a Torque job, is -r y alone."""
    spec = golden_spec(time="10", requeue=True, max_requeues=2, signal="USR1@60", job_name="train")
    plan = pbs_script.batch_step_plan(spec)
    assert plan[plan.index("--requeue"):plan.index("--requeue") + 4] == ["--requeue", "2", "--resubmit", "train"]
    assert "SLURMLAUNCH_RESTART_COUNT" in pbs_script.mpiexec_args(spec, [])[0]
    no_time = pbs_script.batch_step_plan(golden_spec(requeue=True))  # no warning sent: the 128+N rule still holds
    assert "--resubmit" in no_time and no_time[no_time.index("--warning") + 1] == "USR2" and "--walltime" not in no_time
    for other in (golden_spec(time="10", requeue=True, array="0-3"),
                  golden_spec(time="10", requeue=True, pbs_flavour="torque")):
        assert "--requeue" not in pbs_script.batch_step_plan(other)
        assert "-r y" in pbs_script.directives(other)
        assert "SLURMLAUNCH_RESTART_COUNT" not in pbs_script.mpiexec_args(other, [])[0]
    assert "-r y" not in pbs_script.directives(golden_spec(time="10"))


@pytest.mark.parametrize(("flavour", "kw", "directive"), [
    ("pro", dict(array="0-15:4"), "-J 0-12:4"),
    ("pro", dict(array="0-9", max_parallel=3), "-J 0-9%3"),
    ("pro", dict(sweep=(("lr", ("1", "2", "3")),)), "-J 0-2"),
    ("torque", dict(array="1,3,5-7"), "-t 1,3,5,6,7"),
    ("torque", dict(array="0-8:4", max_parallel=2), "-t 0,4,8%2"),
    # README (sweeps, PBS table): a list maps to -J when its indices are evenly spaced
    ("pro", dict(array="1,3"), "-J 1-3:2"),
    ("pro", dict(array="0,4,8"), "-J 0-8:4"),
    ("pro", dict(array="0-3"), "-J 0-3"),
    ("torque", dict(array="1,3", max_parallel=1), "-t 1,3%1"),
    ("torque", dict(array="1,2,5"), "-t 1,2,5"),
])
def test_arrays(flavour: str, kw: dict[str, object], directive: str) -> None:
    spec = golden_spec(pbs_flavour=flavour, **kw)
    assert directive in pbs_script.directives(spec)


@pytest.mark.parametrize(("array", "expect"), [
    ("1,2,5", "--array 1,2,5: PBS Pro's qsub -J takes one range X-Y[:STEP], so a list maps only when its indices "
              "are evenly spaced"),
    ("7", "--array/--sweep 7: a PBS Pro job array needs at least two indices"),
])
def test_pro_arrays_no_single_range_covers_are_refused(array: str, expect: str) -> None:
    with pytest.raises(SpecError, match=re.escape(expect)):
        pbs_script.directives(golden_spec(array=array))


def test_setup_exports_reach_open_mpi_ranks() -> None:
    spec = golden_spec(setup=("module load x", "export HF_HOME=/scratch/hf A=1; declare -x B", "echo export C"))
    args, _ = pbs_script.mpiexec_args(spec, [])
    forwarded = [args[i + 1] for i, a in enumerate(args) if a == "-x"]
    assert {"HF_HOME", "A", "B"} <= set(forwarded) and "C" not in forwarded


def test_mem_totals_keep_the_unit() -> None:
    spec = golden_spec(pbs_request="totals", mem="190G", nodes=3, gpus_per_node=0)
    assert "-l mem=570gb" in pbs_script.directives(spec) and "-l ncpus=3" in pbs_script.directives(spec)
    assert "-l mem=4000mb" in pbs_script.directives(spec.changed(mem="4000", nodes=1))
    assert "-l mem=8gb" in pbs_script.directives(golden_spec(pbs_flavour="torque", mem="4G", nodes=2))  # the job's
