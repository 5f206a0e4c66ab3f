"""submit without a cluster: validation, golden scripts, templates, hostile strings in the script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurmlaunch.core.errors import SpecError
from slurmlaunch.core.spec import JobSpec, validate
from slurmlaunch.render import slurm_script
from slurmlaunch.render.jinja import render
from tests.helpers import EXAMPLES, GOLDEN, GOLDEN_CASES, HOSTILE, ROOT, fake_sbatch, golden_spec, no_slurm_env, run_cli

# --- bad requests: one line, exit 2, nothing submitted ----------------------------------------------

BAD = [
    (["--nodes", "0"], "--nodes 0"),
    (["--nodes", "-3"], "--nodes -3"),
    (["--nodes", "two"], "'two'"),
    (["--gpus-per-node", "-1"], "--gpus-per-node -1"),
    (["--gpus-per-node", "4", "--tasks-per-node", "2"], "tasks per node must equal GPUs per node"),
    (["--cpus-per-task", "0"], "--cpus-per-task 0"),
    (["--cpus-per-task", "2", "--cpus-per-gpu", "2", "--gpus-per-node", "1"], "cannot be used together"),
    (["--time", "1h"], "--time '1h'"),
    (["--time", "10:99:99:99"], "--time '10:99:99:99'"),
    (["--mem", "lots"], "--mem 'lots'"),
    (["--master-port", "70000"], "--master-port 70000"),
    (["--env", "1BAD=x"], "--env '1BAD=x'"),
    (["--env", "NOEQUALS"], "--env 'NOEQUALS'"),
    (["--partition", "a b"], "--partition 'a b'"),
    (["--output-dir", "logs%j"], "--output-dir 'logs%j'"),
    (["--sbatch-arg", "--mail-type=END\n#SBATCH --x"], "--sbatch-arg"),
    (["--scheduler", "torque"], "invalid choice: 'torque'"),
    (["--bogus-option"], "--bogus-option"),
    (["-m", "--no-python"], "cannot be used together"),
    (["--python", "/nonexistent/python"], "--python '/nonexistent/python'"),
]


@pytest.mark.parametrize(("args", "expect"), BAD)
def test_bad_requests(args: list[str], expect: str, tmp_path: Path) -> None:
    r = run_cli("submit", "--scheduler", "local", *args, str(EXAMPLES / "train_ddp.py"),
                env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2, r
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and expect in r.stderr, r.stderr
    assert not (tmp_path / "slurmlaunch-logs").exists()  # nothing started, nothing submitted


def test_missing_script(tmp_path: Path) -> None:
    r = run_cli("submit", "--scheduler", "local", "nope.py", env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "script 'nope.py' not found" in r.stderr and r.stderr.count("\n") == 1
    r = run_cli("submit", env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "SCRIPT" in r.stderr


def test_scheduler_slurm_without_sbatch(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    r = run_cli("submit", "--scheduler", "slurm", str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
    assert r.returncode == 2 and "sbatch is not on PATH" in r.stderr


# --- golden scripts ---------------------------------------------------------------------------------


def rendered(name: str) -> str:
    # Containers mount this checkout's package: the golden files say <slurmlaunch package> instead.
    package = os.path.dirname(os.path.dirname(os.path.abspath(slurm_script.__file__)))
    return slurm_script.render_script(GOLDEN_CASES[name], template_dir=None).replace(package, "<slurmlaunch package>")


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_scripts(name: str) -> None:
    text = rendered(name)
    path = GOLDEN / name
    if os.environ.get("SLURMLAUNCH_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"rendered script differs from {path} (SLURMLAUNCH_UPDATE_GOLDEN=1)"


def test_golden_scripts_are_valid_bash() -> None:
    for name in GOLDEN_CASES:
        r = subprocess.run(["bash", "-n", str(GOLDEN / name)], capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path}/SUBMITTED\n")
    (fake / "sbatch").chmod(0o755)
    env = no_slurm_env(tmp_path)
    env["PATH"] = f"{fake}:{env['PATH']}"
    shutil.copy(EXAMPLES / "train_ddp.py", tmp_path / "train.py")
    r = run_cli("submit", "--dry-run", "--scheduler", "slurm", "--nodes", "2", "--gpus-per-node", "4", "train.py",
                "--lr", "0.1",
                env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in r.stdout
    assert "--job-name=train.py" in r.stderr
    assert not (tmp_path / "SUBMITTED").exists()


def test_auto_needs_a_controller_not_just_sbatch(tmp_path: Path) -> None:
    fake = fake_sbatch(tmp_path)
    # Slurm 22.05's words on a machine without any configuration (no slurm.conf, SLURM_CONF, DNS SRV record)
    (fake / "scontrol").write_text("#!/bin/sh\n"
                                   "echo 'scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host' "
                                   ">&2\n"
                                   "echo 'scontrol: error: fetch_config: DNS SRV lookup failed' >&2\n"
                                   "echo 'scontrol: error: _establish_config_source: failed to fetch config' >&2\n"
                                   "echo 'scontrol: fatal: Could not establish a configuration source' >&2\n"
                                   "exit 1\n")
    (fake / "scontrol").chmod(0o755)
    env = {**no_slurm_env(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}  # auto: said once per user
    env["PATH"] = f"{fake}:{env['PATH']}"
    r = run_cli("submit", "--dry-run", str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
    assert r.returncode == 0 and "auto chose local (sbatch is on PATH but no Slurm cluster is configured" in r.stderr


# --- templates --------------------------------------------------------------------------------------

def test_user_template_dir_wins_and_env_var_and_config_dir(tmp_path: Path) -> None:
    spec = golden_spec()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "slurm.sbatch.j2").write_text("#!/bin/bash\n# mine {{ world_size }}\n")
    assert slurm_script.render_script(spec, str(mine)) == "#!/bin/bash\n# mine 8\n"
    cfg = tmp_path / "cfg" / "slurmlaunch" / "templates"
    cfg.mkdir(parents=True)
    (cfg / "slurm.sbatch.j2").write_text("# from config {{ nodes }}\n")
    ctx = slurm_script.script_context(spec)
    assert render("slurm.sbatch.j2", ctx, None, {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}) == \
        "# from config 2\n"
    assert render("slurm.sbatch.j2", ctx, None, {"XDG_CONFIG_HOME": str(tmp_path / "cfg"),
                                                 "SLURMLAUNCH_TEMPLATE_DIR": str(mine)}) == "#!/bin/bash\n# mine 8\n"


def test_missing_template_variable_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "slurm.sbatch.j2").write_text("#SBATCH --x={{ no_such_thing }}\n")
    with pytest.raises(SpecError, match="no_such_thing"):
        slurm_script.render_script(golden_spec(), str(tmp_path))
    r = run_cli("submit", "--dry-run", "--scheduler", "slurm", "--template-dir", str(tmp_path),
                str(EXAMPLES / "train_ddp.py"), env={**no_slurm_env(tmp_path),
                                                      "PATH": f"{fake_sbatch(tmp_path)}:{os.environ['PATH']}"})
    assert r.returncode == 2 and "no_such_thing" in r.stderr and r.stderr.count("\n") == 1


def test_shipped_templates_are_found_from_the_package() -> None:
    from slurmlaunch.render.jinja import shipped_template_dir

    assert (shipped_template_dir() / "slurm.sbatch.j2").is_file()
    shipped = (shipped_template_dir() / "slurm.sbatch.j2").read_text()
    assert (ROOT / "templates" / "slurm.sbatch.j2").read_text() == shipped


# --- hostile strings in the script: run the rendered script's env/argv part with bash ---------------


def test_hostile_values_in_env_and_args_arrive_verbatim(tmp_path: Path) -> None:
    """Render a real script, swap srun for a recorder, run it with bash: every value arrives intact."""
    assert len(HOSTILE) >= 30
    spec = validate(JobSpec.of(script=str(EXAMPLES / "train_ddp.py"), args=tuple(HOSTILE), workdir=str(tmp_path),
                               env=tuple((f"V{i}", v) for i, v in enumerate(HOSTILE)), output_dir="logs",
                               python=sys.executable))  # the batch step runs with it
    script = slurm_script.render_script(spec)
    recorder = tmp_path / "bin" / "srun"
    recorder.parent.mkdir()
    recorder.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(tmp_path / 'rec.json')!r}, 'w'))\n"
    )
    recorder.chmod(0o755)
    (tmp_path / "logs").mkdir()
    env = {"PATH": f"{recorder.parent}:/usr/bin:/bin", "SLURM_JOB_ID": "1", "HOME": str(tmp_path)}
    r = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    import json

    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["argv"][-len(HOSTILE):] == HOSTILE
    assert [rec["env"][f"V{i}"] for i in range(len(HOSTILE))] == HOSTILE
    assert not list(tmp_path.rglob("PWNED"))
