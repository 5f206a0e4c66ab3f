"""Cluster profiles: layering, origins, bad files; a profile's partition/env/setup on the real cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import fake_sbatch, no_slurm_env, run_cli

USER = """
profile = "userdefault"
[defaults]
time = "10"
setup = ["echo user-default"]
mem = "1G"
[profiles.userdefault]
qos = "normal"
[profiles.gpu]
gpus-per-node = 4
partition = "user-gpu"
account = "user-acct"
env = { NCCL_DEBUG = "INFO", HF_TOKEN = "s3cret" }
template-dir = "mytemplates"
"""

PROJECT = """
[defaults]
time = "20"
setup = "echo project-default"
[profiles.gpu]
partition = "project-gpu"
gpu-flag = "gres"
exclusive = true
"""


def layered(tmp_path: Path) -> tuple[dict[str, str], Path]:
    env = no_slurm_env(tmp_path)
    cfg = tmp_path / "cfg" / "slurmlaunch"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text(USER)
    (cfg / "mytemplates").mkdir()
    env["XDG_CONFIG_HOME"] = str(tmp_path / "cfg")
    project = tmp_path / "proj"
    (project / "deep").mkdir(parents=True)
    (project / "slurmlaunch.toml").write_text(PROJECT)
    return env, project / "deep"


def show(env: dict[str, str], cwd: Path, *args: str) -> dict[str, dict[str, object]]:
    r = run_cli("config", "show", "--json", *args, env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    out: dict[str, dict[str, object]] = json.loads(r.stdout)["options"]
    return out


def test_layers_lowest_to_highest(tmp_path: Path) -> None:
    env, cwd = layered(tmp_path)
    user, project = str(tmp_path / "cfg/slurmlaunch/config.toml"), str(tmp_path / "proj/slurmlaunch.toml")
    opts = show(env, cwd, "--profile", "gpu")
    assert opts["time"] == {"value": "20", "origin": f"{project} [defaults]"}  # project defaults over user's
    assert opts["mem"] == {"value": "1G", "origin": f"{user} [defaults]"}
    assert opts["partition"] == {"value": "project-gpu", "origin": f"{project} [profiles.gpu]"}
    assert opts["account"]["origin"] == f"{user} [profiles.gpu]" and opts["gpus-per-node"]["value"] == 4
    assert opts["gpu-flag"]["value"] == "gres" and opts["exclusive"]["value"] is True
    assert opts["setup"] == {"value": ["echo user-default", "echo project-default"],
                             "origin": f"{user} [defaults] + {project} [defaults]"}
    assert opts["env"]["value"] == ["NCCL_DEBUG=INFO", "HF_TOKEN=****"]  # secrets are not shown
    assert opts["template-dir"]["value"] == str(tmp_path / "cfg/slurmlaunch/mytemplates")  # relative to its file
    assert opts["nodes"] == {"value": 1, "origin": "built-in default"}
    # no --profile: the user file's `profile =` is used; $SLURMLAUNCH_PROFILE beats it
    assert show(env, cwd)["qos"]["value"] == "normal"
    assert show(dict(env, SLURMLAUNCH_PROFILE="gpu"), cwd)["partition"]["value"] == "project-gpu"
    text = run_cli("config", "show", "--profile", "gpu", env=env, cwd=cwd).stdout
    assert re.search(r"partition = \"project-gpu\" +<- .*proj/slurmlaunch.toml \[profiles.gpu\]", text)


def test_command_line_wins_and_lists_join(tmp_path: Path) -> None:
    env, cwd = layered(tmp_path)
    (cwd / "t.py").write_text("print(1)")
    r = run_cli("submit", "--profile", "gpu", "--scheduler", "slurm", "--dry-run", "--partition", "cli-part",
                "--no-exclusive", "--gpu-flag", "gpus-per-node", "--setup", "echo cli", "--env", "NCCL_DEBUG=WARN",
                "t.py", env=dict(env, PATH=f"{fake_sbatch(tmp_path)}:{env['PATH']}"), cwd=cwd)
    assert r.returncode == 0, r.stderr
    script = r.stdout
    assert "#SBATCH --partition=cli-part" in script and "#SBATCH --account=user-acct" in script
    assert "--exclusive" not in script and "#SBATCH --gpus-per-node=4" in script and "#SBATCH --time=20" in script
    assert script.index("echo user-default") < script.index("echo project-default") < script.index("echo cli")
    # both NCCL_DEBUG exports are written; the command line's comes last, so it is the one the ranks see
    assert script.index("export NCCL_DEBUG=INFO") < script.index("export NCCL_DEBUG=WARN")


@pytest.mark.parametrize(("text", "expect"), [
    ("[defaults]\nnodes = \"two\"\n", "nodes = 'two' is not valid (expected a number of nodes"),
    # issue 33.5: out of bounds, the file and the table are named (not `--nodes 0 is not valid` alone)
    ("[profiles.p]\nnodes = 0\n", "[profiles.p]: nodes = 0 is not valid (expected a number of nodes 1..100000"),
    ("[defaults]\nnodes = \"0\"\n", "[defaults]: nodes = '0' is not valid (expected a number of nodes 1.."),
    ("[defaults]\nnodes = \"3:2\"\n", "nodes = '3:2' is not valid (expected a number of nodes"),
    ("[defaults]\nnodes = 99999999\n", "nodes = 99999999 is not valid (expected a number of nodes"),
    ("[defaults]\nmem = 4\n", "mem = 4 is not valid (expected a string)"),
    ("[defaults]\ngpu-flag = \"gpus\"\n", "gpu-flag = 'gpus' is not valid (expected one of gpus-per-node, gres)"),
    ("[defaults]\nnode = 2\n", "unknown option 'node' (valid: "),
    ("[defaults]\nexclusive = \"yes\"\n", "exclusive = 'yes' is not valid (expected true or false)"),
    ("[defaults]\nenv = [1]\n", "env = [1] is not valid (expected a table of strings"),
    ("[profile]\nnodes = 2\n", "[defaults] and [profiles.NAME]"),
    ("[defaults\n", "is not valid TOML"),
    ("[defaults]\nscript = \"x.py\"\n", "unknown option 'script'"),
])
def test_bad_files_one_line_exit_2_nothing_submitted(text: str, expect: str, tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    (tmp_path / "slurmlaunch.toml").write_text(text)
    (tmp_path / "t.py").write_text("open('ran', 'w')")
    profile = ["--profile", "p"] if "[profiles.p]" in text else []
    r = run_cli("submit", *profile, "t.py", env=env, cwd=tmp_path)
    assert r.returncode == 2 and expect in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert "slurmlaunch.toml" in r.stderr and not (tmp_path / "ran").exists()


def test_unknown_profile_names_the_known_ones(tmp_path: Path) -> None:
    env, cwd = layered(tmp_path)
    r = run_cli("submit", "--profile", "gpus", "x.py", env=env, cwd=cwd)
    assert r.returncode == 2 and "profile 'gpus' not found" in r.stderr and "gpu, userdefault" in r.stderr
    r = run_cli("config", "show", "--profile", "x", env=no_slurm_env(tmp_path / "proj"), cwd=tmp_path)
    assert r.returncode == 2 and "no config file" in r.stderr


def test_profile_runs_locally(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    (tmp_path / "slurmlaunch.toml").write_text(
        '[profiles.two]\ntasks-per-node = 2\nenv = { GREETING = "a b;$(rm -rf /)" }\noutput-dir = "out"\n')
    (tmp_path / "t.py").write_text("import os; print(os.environ['RANK'], os.environ['GREETING'])")
    r = run_cli("submit", "--profile", "two", "t.py", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    logs = sorted((tmp_path / "out").glob("*.rank-*.log"))
    texts = ["".join(ln for ln in p.read_text().splitlines(keepends=True) if not ln.startswith("slurmlaunch: OMP"))
             for p in logs]  # rank 0 says once that 2 ranks per node got OMP_NUM_THREADS=1
    assert texts == ["0 a b;$(rm -rf /)\n", "1 a b;$(rm -rf /)\n"]


@pytest.mark.slurm
def test_profile_on_the_real_cluster(cluster_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "slurmlaunch.toml").write_text(
        'profile = "small"\n[profiles.small]\npartition = "first"\ntime = "5"\nsetup = ["export FROM_SETUP=yes"]\n'
        'env = { FROM_ENV = "x y" }\n')
    (tmp_path / "t.py").write_text("import os, socket\n"
                                   "print(socket.gethostname(), os.environ['FROM_SETUP'], os.environ['FROM_ENV'])")
    r = run_cli("submit", "--wait", "--wait-timeout", "90", "t.py", env=cluster_env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.splitlines()[0]
    assert (tmp_path / f"slurmlaunch-logs/job-{job}.rank-0.log").read_text() == "node1 yes x y\n"
    assert "--partition=first" in (tmp_path / f"slurmlaunch-logs/job-{job}.sbatch").read_text()


def test_the_option_table_is_the_submit_parsers_one_definition() -> None:
    """Every option of `submit` (CLI, config show, the API's profiles) is a record of SUBMIT_OPTIONS, and
    profiles' table is read from it: the same flags, defaults, choices and bounds."""
    import argparse

    from slurmlaunch.app import profiles
    from slurmlaunch.app.options import SUBMIT_OPTIONS, add_submit_options
    from slurmlaunch.core.limits import Count

    parser = argparse.ArgumentParser(add_help=False)
    add_submit_options(parser)
    records = {o.dest: o for _, group in SUBMIT_OPTIONS for o in group}
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    assert set(records) == set(actions)
    for dest, record in records.items():
        action = actions[dest]
        assert tuple(action.option_strings[:len(record.flags)]) == record.flags
        assert (list(action.choices) if action.choices else None) == (list(record.choices) if record.choices else None)
        assert action.type is record.type
    table = profiles.option_table(parser)
    assert set(table) == set(records) - profiles.NOT_IN_PROFILES - set(profiles.CHANGES_WHAT_RUNS)
    for dest, opt in table.items():
        record = records[dest]
        assert opt.flag == record.flag
        default = list(record.default) if isinstance(record.default, tuple) else record.default
        assert opt.builtin == (default if default is not None or opt.kind != "bool" else False)
        if isinstance(record.type, Count):
            assert opt.bounds == (record.type.minimum, record.type.maximum)
    # a fresh list per parser: one parser's defaults never leak into another's
    again = argparse.ArgumentParser(add_help=False)
    add_submit_options(again)
    assert again.get_default("env") == [] and again.get_default("env") is not parser.get_default("env")
