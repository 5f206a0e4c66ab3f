"""Rendering: request -> script context -> script text for each scheduler, in this process (no sbatch, no qsub,
no subprocess). Whole scripts are pinned by the golden files (test_submit.py, test_pbs*.py); these tables pin
the steps in between, so a changed script points at the part that changed it."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from slurmlaunch.core.errors import SpecError
from slurmlaunch.core.jobfiles import SUBMISSION_MARK, JobFiles, own_dir
from slurmlaunch.core.spec import JobSpec
from slurmlaunch.render import launch, pbs_script, slurm_script
from slurmlaunch.render.jinja import render, search_path, shipped_template_dir
from slurmlaunch.schedulers import local
from tests.helpers import golden_spec

LOG = "/home/me/project/slurmlaunch-logs"
PY = "/opt/venv/bin/python"
LAUNCH = [PY, "-m", "slurmlaunch", "launch", "/home/me/project/train.py", "--lr", "0.1"]


# --- Slurm: the #SBATCH lines, srun's arguments, what each task runs -------------------------------------------

@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_the_scripts_take_the_job_file_names_from_jobfiles(mode: str) -> None:
    """The templates spell no name of the job's files: the context gives them, with the scripts' variables."""
    spec = golden_spec(mode=mode, **({"nproc_per_node": 4} if mode == "torchrun" else {}))
    text = slurm_script.render_script(spec)
    own = own_dir("$log_dir", "$SLURM_JOB_ID", SUBMISSION_MARK)
    assert f'own="{own}"' in text
    # the batch step names them
    assert "job-" not in text.replace("job-<id>.json", "").replace("job-%j", "").replace(own, "")
    assert f' --unit {spec.log_unit} ' in text and ' --log-dir "$log_dir" --job "$job_tag" -- ' in text
    assert ' --log-dir "$log_dir" --job "$job_id" -- ' in pbs_script.render_script(golden_spec())
    assert "--output" not in slurm_script.srun_args(spec)  # the script's: in its own $log_dir
    rank_logs = os.path.basename(JobFiles(spec.log_dir, "%j", spec.log_unit).log("%t"))
    assert f' --output "$log_dir"/{rank_logs} ' in text


@pytest.mark.parametrize(("kw", "lines"), [
    ({}, ["--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--signal=B:USR2@90", "--open-mode=append"]),
    (dict(gpu_flag="gres", cpus_per_gpu=8, mem="64G", time="1:00:00", exclusive=True, requeue=True),
     ["--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4", "--cpus-per-task=8", "--mem=64G", "--time=1:00:00",
      "--exclusive", "--signal=B:USR2@90", "--requeue", "--open-mode=append"]),
    (dict(signal="none", array="0-3", max_parallel=2),
     ["--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--array=0-3%2", "--open-mode=append"]),
    (dict(mode="torchrun", nodes=4, min_nodes=2, gpus_per_node=0, nproc_per_node=2),
     ["--nodes=2-4", "--ntasks-per-node=1", "--signal=B:USR2@90", "--open-mode=append"]),
    (dict(gpus_per_node=0, tasks_per_node=3, cpus_per_task=2, partition="p", account="a", qos="q",
          constraint="c", sbatch_args=("--mail-type=END",)),
     ["--nodes=2", "--ntasks-per-node=3", "--cpus-per-task=2", "--partition=p", "--account=a", "--qos=q",
      "--constraint=c", "--signal=B:USR2@90", "--open-mode=append", "--mail-type=END"]),
])
def test_sbatch_directives(kw: dict[str, object], lines: list[str]) -> None:
    assert slurm_script.directives(golden_spec(**kw)) == lines


def test_free_text_never_becomes_a_directive() -> None:
    """The job name and log paths go on sbatch's command line, where #SBATCH's parser cannot cut them."""
    spec = golden_spec(job_name="x\n#SBATCH --uid=0", output_dir="logs dir")
    assert not any("x" == d or "uid" in d or "logs dir" in d for d in slurm_script.directives(spec))


@pytest.mark.parametrize(("kw", "args", "logs"), [
    ({}, ["--kill-on-bad-exit=1", "--nodes=2", "--ntasks-per-node=4", "--ntasks=8", "--open-mode=append"],
     "job-%j.rank-%t.log"),
    (dict(cpus_per_gpu=8), ["--kill-on-bad-exit=1", "--nodes=2", "--ntasks-per-node=4", "--ntasks=8",
                            "--cpus-per-task=8", "--open-mode=append"], "job-%j.rank-%t.log"),
    (dict(array="0-3"), ["--kill-on-bad-exit=1", "--nodes=2", "--ntasks-per-node=4", "--ntasks=8",
                         "--open-mode=append"], "job-%A_%a.rank-%t.log"),
    (dict(mode="torchrun", nodes=4, min_nodes=2, gpus_per_node=0, nproc_per_node=2),
     ["--kill-on-bad-exit=1", "--ntasks-per-node=1", "--open-mode=append"],
     "job-%j.node-%t.log"),  # an elastic step spans whatever the allocation got
])
def test_srun_arguments(kw: dict[str, object], args: list[str], logs: str) -> None:
    """srun's arguments; its --output pattern is in the script's own $log_dir (jobfiles.own_dir)."""
    assert slurm_script.srun_args(golden_spec(**kw)) == args
    assert slurm_script.rank_logs(golden_spec(**kw)) == logs


@pytest.mark.parametrize(("kw", "command"), [
    ({}, LAUNCH),
    (dict(script="/abs/train.py"), [*LAUNCH[:4], "/abs/train.py", "--lr", "0.1"]),
    (dict(module=True, script="pkg.train"), [*LAUNCH[:4], "-m", "pkg.train", "--lr", "0.1"]),
    (dict(legacy_local_rank_arg=True), [*LAUNCH[:4], "--legacy-local-rank-arg", *LAUNCH[4:]]),
    (dict(mode="torchrun", nodes=4, min_nodes=2, gpus_per_node=0, nproc_per_node=2, max_restarts=1),
     [PY, "-m", "slurmlaunch", "torchrun-node", "--nproc-per-node=2", "--max-restarts=1", "--nnodes=2:4",
      "--forward-signal=USR2", *LAUNCH[4:]]),
    (dict(mode="torchrun", gpus_per_node=2, signal="none"),
     [PY, "-m", "slurmlaunch", "torchrun-node", "--nproc-per-node=2", "--max-restarts=0", *LAUNCH[4:]]),
])
def test_what_each_task_runs(kw: dict[str, object], command: list[str]) -> None:
    assert launch.launch_command(golden_spec(**kw)) == command


def test_apptainer_wraps_the_launcher() -> None:
    cmd = launch.launch_command(golden_spec(apptainer="/img/torch.sif"))
    assert cmd[:3] == ["apptainer", "exec", "--nv"] and cmd[cmd.index("--pwd") + 1] == "/home/me/project"
    assert cmd[cmd.index("/img/torch.sif") + 1:][:2] == [PY, "-c"]  # the bootstrap: slurmlaunch is bound in
    assert cmd[-4:] == ["launch", *LAUNCH[4:]]


@pytest.mark.parametrize(("signal", "name"), [("USR2@90", "USR2"), ("USR1@120", "USR1"), ("TERM@60", "TERM"),
                                             ("none", None)])
def test_the_batch_step_is_told_the_warning_signal(signal: str, name: str | None) -> None:
    plan = slurm_script.batch_step_plan(golden_spec(signal=signal))
    assert (plan[plan.index("--warning") + 1] if "--warning" in plan else None) == name


def test_script_context_is_the_request_spelled_for_the_template() -> None:
    spec = golden_spec(env=(("A", "1"),), setup=("module load cuda",), sweep=(("lr", ("0.1", "0.01")),))
    ctx = slurm_script.script_context(spec)
    assert (ctx["world_size"], ctx["nodes"], ctx["multi_node"], ctx["tasks_per_node"]) == (8, "2", True, 4)
    assert ctx["directives"] == slurm_script.directives(spec) and ctx["srun_args"] == slurm_script.srun_args(spec)
    assert ctx["launch_cmd"] == launch.launch_command(spec) and ctx["setup"] == ["module load cuda"]
    assert ("A", "1") in ctx["env"] and ctx["log_dir"] == LOG and ctx["workdir"] == "/home/me/project"
    assert ctx["array"] and not ctx["torchrun"] and len(ctx["sweep_points"]) == 2


def test_the_sbatch_text_carries_the_context() -> None:
    spec = golden_spec()
    text = slurm_script.render_script(spec)
    assert text.startswith("#!/bin/bash")
    for line in slurm_script.directives(spec):
        assert f"#SBATCH {line}\n" in text
    assert shlex.join(launch.launch_command(spec)) in text


# --- PBS -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("time", "walltime"), [
    ("10", "0:10:00"), ("1:30", "0:01:30"), ("0:59", "0:00:59"), ("1:00:00", "1:00:00"), ("2-3", "51:00:00"),
    ("2-3:04:05", "51:04:05"),
])
def test_pbs_walltime_from_slurms_time(time: str, walltime: str) -> None:
    assert pbs_script.walltime(time) == walltime


@pytest.mark.parametrize(("kw", "lines"), [
    ({}, ["-l select=2:ncpus=4:mpiprocs=4:ngpus=4", "-l place=scatter", "-j oe", "-k doe"]),
    (dict(pbs_flavour="torque", time="2:00:00", mem="16G", partition="gpuq", account="p1"),
     ["-l nodes=2:ppn=4:gpus=4", "-l mem=32gb", "-l walltime=2:00:00", "-q gpuq", "-A p1", "-j oe"]),
])
def test_qsub_directives(kw: dict[str, object], lines: list[str]) -> None:
    assert pbs_script.directives(golden_spec(**kw)) == lines


def test_the_qsub_text_carries_the_context() -> None:
    spec = golden_spec()
    ctx = pbs_script.script_context(spec)
    assert ctx["directives"] == pbs_script.directives(spec) and ctx["world_size"] == 8 and ctx["mpi"] == "openmpi"
    text = pbs_script.render_script(spec)
    for line in pbs_script.directives(spec):
        assert f"#PBS {line}\n" in text


# --- local: the dry run is the emulated step, one block per rank -----------------------------------------------

def test_local_dry_run_shows_each_ranks_step_and_command() -> None:
    text = local.dry_run(golden_spec(gpus_per_node=0, tasks_per_node=2), {})
    assert text.splitlines()[0] == f"# local job 'train.py': logs in {LOG}"
    ranks = [line for line in text.splitlines() if line.startswith("# rank ") and " reads: " not in line]
    reads = [line for line in text.splitlines() if line.startswith("# rank ") and " reads: " in line]
    assert [r.split(" reads: ")[0] for r in reads] == ["# rank 0", "# rank 1", "# rank 2", "# rank 3"], reads
    assert [r.split(":")[0] for r in ranks] == ["# rank 0", "# rank 1", "# rank 2", "# rank 3"]
    assert "SLURM_PROCID=3 " in ranks[3] and "SLURM_NODEID=1 " in ranks[3] and "SLURM_LOCALID=1 " in ranks[3]
    assert text.count(shlex.join(LAUNCH)) == 4


# --- the template engine: lookup order, quoting filters, strictness, errors as one line -----------------------

def test_lookup_order(tmp_path: Path) -> None:
    (tmp_path / "given").mkdir()
    environ = {"SLURMLAUNCH_TEMPLATE_DIR": str(tmp_path / "env"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    assert search_path(str(tmp_path / "given"), environ) == [
        tmp_path / "given", tmp_path / "env", tmp_path / "cfg" / "slurmlaunch" / "templates", shipped_template_dir()]
    assert search_path(None, {"XDG_CONFIG_HOME": str(tmp_path / "cfg")})[-1] == shipped_template_dir()
    with pytest.raises(SpecError, match=r"^--template-dir '.*/nowhere' is not a directory$"):
        search_path(str(tmp_path / "nowhere"), environ)


def test_a_users_template_wins_and_the_filters_quote(tmp_path: Path) -> None:
    (tmp_path / "slurm.sbatch.j2").write_text("echo {{ x | q }}; run {{ argv | qjoin }}\n")
    text = render("slurm.sbatch.j2", {"x": "it's $(x)", "argv": ["a b", "c"]}, str(tmp_path), {})
    assert text == "echo 'it'\"'\"'s $(x)'; run 'a b' c\n"


@pytest.mark.parametrize(("template", "message"), [
    ("{{ missing }}", "template '{dir}/t.j2' line 1: 'missing' is undefined (variables available: a, b)"),
    ("{% if %}", "template '{dir}/t.j2' line 1: Expected an expression, got 'end of statement block'"),
    ("{% include 'nope.j2' %}", "template '{dir}/t.j2': it includes 'nope.j2', which is not found in {dirs} "
                                "(includes are names relative to those directories)"),
    ("{{ a / 0 }}", "template '{dir}/t.j2' line 1 failed: ZeroDivisionError: division by zero"),
])
def test_a_users_broken_template_is_one_line_naming_the_file(template: str, message: str, tmp_path: Path) -> None:
    (tmp_path / "t.j2").write_text(template)
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    with pytest.raises(SpecError) as e:
        render("t.j2", {"a": 1, "b": 2}, str(tmp_path), environ)
    dirs = ", ".join(map(str, [tmp_path, tmp_path / "cfg" / "slurmlaunch" / "templates", shipped_template_dir()]))
    assert str(e.value) == message.format(dir=tmp_path, dirs=dirs)


def test_a_template_that_is_nowhere(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as e:
        render("nope.j2", {}, None, {"XDG_CONFIG_HOME": str(tmp_path)})
    assert str(e.value) == (f"template 'nope.j2' not found in {tmp_path / 'slurmlaunch' / 'templates'}, "
                            f"{shipped_template_dir()}")


def test_a_template_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "t.j2").write_bytes(b"echo \xff\n")
    with pytest.raises(SpecError, match=r"is not UTF-8 text \(byte 0xff at offset 5\)$"):
        render("t.j2", {}, str(tmp_path), {})


def test_request_to_text_needs_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure step: rendering every scheduler's script starts nothing."""
    import subprocess

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError(f"a process was started while rendering: {a}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    spec: JobSpec = golden_spec()
    assert slurm_script.render_script(spec) and pbs_script.render_script(spec) and local.dry_run(spec, {})
