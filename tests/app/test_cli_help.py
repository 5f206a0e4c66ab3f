"""--help with examples for every command, and shell completion run by a real bash."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import no_slurm_env, run_cli

COMMANDS = ["env", "hostnames", "submit", "list", "status", "logs", "cancel", "dev-cluster", "run", "doctor",
            "config", "completion", "launch", "torchrun-node"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command: str) -> None:
    r = run_cli(command, "--help")
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert "example" in r.stdout and f"slurmlaunch {command}" in r.stdout.replace("slurmlaunch <command>", ""), \
        r.stdout


def test_top_level_help_lists_commands_and_an_example() -> None:
    r = run_cli("--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "doctor" in r.stdout and "torchrun-node" in r.stdout


def complete(script: str, words: list[str], env: dict[str, str] | None = None) -> list[str]:
    """What bash offers after `words` (the last one is being typed), through the generated function."""
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = f'{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _slurmlaunch; ' \
              'printf "%s\\n" "${COMPREPLY[@]}"'
    r = subprocess.run(["bash", "--norc", "-c", program], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_bash_completion(tmp_path: Path) -> None:
    script = run_cli("completion", "bash").stdout
    assert "complete -o filenames -F _slurmlaunch slurmlaunch" in script
    assert complete(script, ["slurmlaunch", "sub"]) == ["submit"]
    assert "launch" not in complete(script, ["slurmlaunch", ""])  # run inside allocations, not by people
    assert complete(script, ["slurmlaunch", "submit", "--gpu"]) == ["--gpus-per-node", "--gpu-flag"]
    assert complete(script, ["slurmlaunch", "submit", "--scheduler", ""]) == ["auto", "slurm", "pbs", "local"]
    assert complete(script, ["slurmlaunch", "dev-cluster", ""]) == ["up", "down", "status"]
    assert complete(script, ["slurmlaunch", "completion", "z"]) == ["zsh"]
    (tmp_path / "train_me.py").write_text("")
    assert complete(f"cd {tmp_path}\n" + script, ["slurmlaunch", "submit", "train_"]) == ["train_me.py"]
    # profile names come from the config files and the shipped site profiles, through `slurmlaunch config profiles`
    (tmp_path / "slurmlaunch.toml").write_text("[profiles.booster]\nnodes = 2\n[profiles.cpu]\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "slurmlaunch").write_text(f"#!/bin/sh\nexec {sys.executable} -m slurmlaunch \"$@\"\n")
    (bin_dir / "slurmlaunch").chmod(0o755)
    env = dict(no_slurm_env(tmp_path), PATH=f"{bin_dir}:/usr/bin:/bin")
    assert complete(f"cd {tmp_path}\n" + script, ["slurmlaunch", "submit", "--profile", ""], env) == [
        "aurora", "booster", "cpu", "gadi", "gadi-gpuvolta", "polaris", "torque"]


def test_zsh_and_fish_scripts() -> None:
    zsh = run_cli("completion", "zsh").stdout
    assert "bashcompinit" in zsh and "_slurmlaunch()" in zsh
    if shutil.which("zsh"):
        assert subprocess.run(["zsh", "-n", "-c", zsh]).returncode == 0
    fish = run_cli("completion", "fish").stdout.splitlines()
    assert any(line.startswith("complete -c slurmlaunch -n '__fish_seen_subcommand_from submit' -l gpus-per-node -r")
               for line in fish)
    assert any("-l scheduler -x -a 'auto slurm pbs local'" in line for line in fish)
    if shutil.which("fish"):
        assert subprocess.run(["fish", "-n", "-c", "\n".join(fish)]).returncode == 0


def test_config_profiles_lists_names(tmp_path: Path) -> None:
    (tmp_path / "slurmlaunch.toml").write_text("[profiles.b]\n[profiles.a]\n")
    r = run_cli("config", "profiles", env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "a\naurora\nb\ngadi\ngadi-gpuvolta\npolaris\ntorque\n"  # + shipped


def test_submit_builds_run_options_only_for_run() -> None:
    """`submit` parses only its own options: `run`'s module (and its network helpers) is not imported."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "slurmlaunch", "submit", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: slurmlaunch submit" in r.stdout
    assert "slurmlaunch.app.run" not in r.stderr
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "slurmlaunch", "run", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "slurmlaunch.app.run" in r.stderr and "--nproc-per-node" in r.stdout


def test_a_local_submission_imports_none_of_the_remote_modules(tmp_path: Path) -> None:
    """ssh, rsync and the shipped package are --remote's: a dry run here does not pay for importing them
    (refuse_remote_only lives with the options for that reason)."""
    (tmp_path / "t.py").write_text("")
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "slurmlaunch", "submit", "--scheduler", "local",
                        "--dry-run", "t.py"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [line for line in r.stderr.splitlines() if "slurmlaunch.app.remote" in line] == []


@pytest.mark.parametrize(("args", "said"), [
    (["submit", "--bogus"], "slurmlaunch submit: error: unrecognized arguments: --bogus (the following arguments "
                            "are required: SCRIPT)\n"),
    (["submit", "--dry-run", "--nodez=2", "--wait"], "slurmlaunch submit: error: unrecognized arguments: --nodez=2 "
                                                     "(the following arguments are required: SCRIPT)\n"),
    (["status", "--jsn"], "slurmlaunch status: error: unrecognized arguments: --jsn (the following arguments are "
                          "required: job)\n"),
    (["submit", "--nodes", "-1"], "slurmlaunch submit: error: the following arguments are required: SCRIPT\n"),
    (["submit"], "slurmlaunch submit: error: the following arguments are required: SCRIPT\n"),
])
def test_a_mistyped_option_is_named_even_when_script_is_missing_too(tmp_path: Path, args: list[str],
                                                                    said: str) -> None:
    """argparse says a missing positional before an unknown option: `submit --bogus` said only that SCRIPT was
    missing, and never which option was mistyped. One line, exit 2, the option byte for byte."""
    r = run_cli(*args, env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", said)
