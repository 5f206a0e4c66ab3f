"""Issue 18, second pass: the README's everyday claims, each checked against the parser or a real process."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests import ports
from tests.helpers import no_slurm_env, run_cli

# --- item 2: every boolean a file may set has its --no- undo; what changes SCRIPT is refused in files ----------


def _submit_parser() -> argparse.ArgumentParser:
    from slurmlaunch.cli import _parser

    top = _parser(profiles=True)
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices["submit"]
    return parser


def test_every_boolean_profile_key_has_an_undo_flag(tmp_path: Path) -> None:
    from slurmlaunch.app import profiles

    parser = _submit_parser()
    table = parser.get_default("options_table")
    booleans = sorted(o.flag.lstrip("-") for o in table.values() if o.kind == "bool")
    assert {"wait", "cancel-on-interrupt", "exclusive", "requeue"} <= set(booleans)
    (tmp_path / "slurmlaunch.toml").write_text("[defaults]\n" + "".join(f"{b} = true\n" for b in booleans))
    env = no_slurm_env(tmp_path)
    from_file = profiles.resolve(parser.parse_args(["x.py"]), table, env, str(tmp_path))
    assert all(from_file.values[b.replace("-", "_")] is True for b in booleans)
    undone = profiles.resolve(parser.parse_args([f"--no-{b}" for b in booleans] + ["x.py"]), table, env,
                              str(tmp_path))
    assert all(undone.values[b.replace("-", "_")] is False for b in booleans), undone.values
    assert all(undone.origins[b.replace("-", "_")] == profiles.COMMAND_LINE for b in booleans)


@pytest.mark.parametrize(("key", "flag"), [("module", "-m/--module"), ("no-python", "--no-python"),
                                           ("no_python", "--no-python")])
def test_keys_that_change_what_runs_are_refused_in_files(key: str, flag: str, tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    (tmp_path / "slurmlaunch.toml").write_text(f"[defaults]\n{key} = true\n")
    (tmp_path / "t.py").write_text("open('ran', 'w')")
    r = run_cli("submit", "t.py", env=env, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert f"{key} = true is not taken from config files" in r.stderr and flag in r.stderr, r.stderr
    assert "slurmlaunch.toml [defaults]" in r.stderr and not (tmp_path / "ran").exists()


def test_completion_offers_undo_flags_only_for_booleans() -> None:
    fish = run_cli("completion", "fish").stdout.splitlines()
    submit = [line for line in fish if "'__fish_seen_subcommand_from submit'" in line]
    undo = {line.split(" -l ")[1].split()[0] for line in submit if "-d 'undo " in line}
    assert undo == {"no-exclusive", "no-requeue", "no-wait", "no-cancel-on-interrupt", "no-sync"}, undo
    no_python = [line for line in submit if " -l no-python " in line]
    assert len(no_python) == 1 and "-d 'SCRIPT is an executable'" in no_python[0], no_python
    bash = run_cli("completion", "bash").stdout
    assert "--no-wait" in bash and "--no-cancel-on-interrupt" in bash


# --- item 11: paths in a config file are relative to that file ---------------------------------------------------


def test_paths_in_a_file_are_relative_to_the_file(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    project = tmp_path / "proj"
    (project / "deep").mkdir(parents=True)
    (project / "templates").mkdir()
    (project / "slurmlaunch.toml").write_text('[defaults]\noutput-dir = "runs"\ntemplate-dir = "templates"\n')
    r = run_cli("config", "show", "--json", env=env, cwd=project / "deep")
    assert r.returncode == 0, r.stderr
    options = json.loads(r.stdout)["options"]
    assert options["output-dir"]["value"] == str(project / "runs")
    assert options["template-dir"]["value"] == str(project / "templates")
    (project / "deep" / "t.py").write_text("print('hello')")
    (project / "slurmlaunch.toml").write_text('[defaults]\noutput-dir = "runs"\n')  # the local run takes no template
    r = run_cli("submit", "t.py", env=env, cwd=project / "deep")
    assert r.returncode == 0, r.stderr
    assert list((project / "runs").glob("*.rank-0.log")) and not (project / "deep" / "runs").exists()
    # given on the command line, a path is the working directory's, as any command's argument
    r = run_cli("submit", "--output-dir", "here", "t.py", env=env, cwd=project / "deep")
    assert r.returncode == 0 and list((project / "deep" / "here").glob("*.rank-0.log")), r.stderr


# --- item 3: `slurmlaunch run` accepts every torchrun flag, or refuses it in one line saying what to use ----------


def torchrun_flags() -> list[tuple[str, str | None]]:
    """(flag, a valid value or None) for every option string of the installed torch's torchrun (the oracle)."""
    import re
    import subprocess
    import sys

    pytest.importorskip("torch")
    text = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--help"], capture_output=True,
                          text=True, timeout=120, check=True).stdout
    options = text.split("\noptions:\n", 1)[1]
    flags: list[tuple[str, str | None]] = []
    for line in options.splitlines():
        if not re.match(r"  -", line):
            continue
        for part in re.split(r"  +", line.strip(), maxsplit=1)[0].split(", "):
            flag, _, metavar = part.partition(" ")
            if flag in ("-h", "--help"):
                continue
            choices = re.fullmatch(r"\{(.*)\}", metavar)
            flags.append((flag, choices.group(1).split(",")[0] if choices else ("1" if metavar else None)))
    assert len(flags) > 40 and ("--max-restarts", "1") in flags and ("--standalone", None) in flags, flags
    return flags


def test_run_takes_or_refuses_every_torchrun_flag(tmp_path: Path) -> None:
    from slurmlaunch.cli import _parser
    from slurmlaunch.core.errors import SpecError

    accepted, refused = [], []
    for flag, value in torchrun_flags():
        argv = ["run", flag, *([value] if value is not None else []), "x.py", "--lr", "1"]
        try:
            ns = _parser().parse_args(argv)
        except SpecError as e:
            message = str(e)
            assert message.startswith(f"{flag} is a torchrun flag") and "\n" not in message, message
            assert "use " in message or "drop the flag" in message, message
            refused.append(flag)
        else:
            assert ns.script == "x.py" and ns.args == ["--lr", "1"], (flag, ns)
            accepted.append(flag)
    assert "--max-restarts" in refused and "--nproc_per_node" in accepted and "--shutdown-timeout" in accepted
    r = run_cli("run", "--max-restarts=1", "x.py", env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "slurmlaunch submit --mode torchrun --max-restarts N" in r.stderr, r.stderr


def test_run_shutdown_timeout_is_the_grace_before_sigkill(tmp_path: Path) -> None:
    """Rank 1 fails at once; rank 0 ignores SIGTERM: it is killed after --shutdown-timeout, not the default 10s."""
    import time

    (tmp_path / "t.py").write_text(
        "import os, signal, sys, time\n"
        "if os.environ['RANK'] == '1':\n    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ignoring', flush=True)\ntime.sleep(120)\n")
    start = time.monotonic()
    r = run_cli("run", "--nproc-per-node", "2", "--cpu", "--shutdown-timeout", "0.5", "t.py",
                env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 3 and "rank 1 failed first with exit code 3" in r.stderr, r.stderr
    assert time.monotonic() - start < 60  # bounded; the default (10 s) would also pass: the parse test names it


# --- item 6: the docs' option lists are the parser's: tests/test_docs.py (the reference is written from it) ---


# --- item 12: a non-master `run` node says what it waits for, with the time so far -------------------------------


def test_non_master_says_it_waits_for_the_master(tmp_path: Path) -> None:
    import re
    import socket

    script = tmp_path / "s.py"
    script.write_text("import time\ntime.sleep(240)\n")  # waits as a rank in init_process_group would
    env = no_slurm_env(tmp_path)
    port = ports.port()
    # nobody listens: the start, the "still waiting" lines (one per 10 s) and the end are all said; the ranks
    # run meanwhile, and their watchdog stops them at the bound
    r = run_cli("run", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                "--allow-loopback", "--cpu", "--master-timeout", "12", str(script), env=env, cwd=tmp_path,
                timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.startswith("slurmlaunch: node 1:")]
    assert r.returncode == 69 and lines[0] == (
        f"slurmlaunch: node 1: waiting for the master (node 0) to listen at 127.0.0.1:{port} (at most 12s, "
        f"--master-timeout); the ranks start now, and one is stopped only if nothing listened there by then and it "
        f"connected to nothing else"), r.stderr
    assert re.fullmatch(rf"slurmlaunch: node 1: still waiting for the master at 127.0.0.1:{port} \(1\ds of 12s; "
                        r"last: Connection refused\)", lines[1]), r.stderr
    assert f"to listen at 127.0.0.1:{port} for 12s (--master-timeout)" in lines[-1] and len(lines) == 3, r.stderr
    # something listens: it says so, with the time it took (the ranks ran meanwhile)
    script.write_text("pass")
    with socket.create_server(("127.0.0.1", 0)) as master:
        port = master.getsockname()[1]
        r = run_cli("run", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                    str(port), "--allow-loopback", "--cpu", str(script), env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.search(rf"node 1: the master at 127.0.0.1:{port} answered after \d+s\n", r.stderr), r.stderr


# --- item 15 (rest): dev-cluster status after down; config show without padding -------------------------------------


def test_dev_cluster_status_after_down_is_one_line(tmp_path: Path) -> None:
    """What `down` leaves: slurm.conf, no pid files (or a stale one): one line, not sinfo's connection error."""
    import subprocess
    import sys

    root = tmp_path / "cluster"
    root.mkdir()
    (root / "slurm.conf").write_text(f"ClusterName=x\nSlurmctldHost=localhost\nSlurmctldPort=1\n"
                                     f"SlurmctldPidFile={root}/slurmctld.pid\n")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    for pidfile in (None, str(dead.pid)):
        if pidfile is not None:
            (root / "slurmctld.pid").write_text(pidfile + "\n")
        r = run_cli("dev-cluster", "status", "--dir", str(root), env=no_slurm_env(tmp_path), cwd=tmp_path)
        assert r.returncode == 1 and r.stdout == "", r
        assert r.stderr == (f"slurmlaunch: dev-cluster in {root} is down: its controller is not running "
                            f"(slurmlaunch dev-cluster up --dir {root} starts one)\n"), r.stderr


def test_config_show_does_not_pad_to_the_longest_value(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    long_line = "source /opt/site/env/" + "x" * 100
    (tmp_path / "slurmlaunch.toml").write_text(f'[defaults]\nsetup = ["{long_line}"]\n')
    r = run_cli("config", "show", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    nodes = next(line for line in lines if line.startswith("  nodes = 1 "))
    setup = next(line for line in lines if line.startswith("  setup = "))
    assert long_line in setup and setup.index("  <- ") == len(f'  setup = ["{long_line}"]'), setup
    assert nodes.index("<- built-in default") < 60, nodes  # lined up with the short values, not the long one
    assert all(line == line.rstrip() for line in lines)
    assert len({line.index(" <- ") for line in lines if " <- " in line and len(line.split(" <- ")[0]) < 48}) == 1
