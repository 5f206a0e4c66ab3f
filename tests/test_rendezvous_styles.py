"""The rendezvous watchdog never stops a healthy job that rendezvous its own way (issue 27, part 1).

tests/clients/own_rendezvous.py joins its world by its own MASTER_PORT (idr-torch's way), by
init_method="tcp://host:PORT" and by "file://PATH": nothing ever listens at the MASTER_PORT slurmlaunch chose.
Each job runs with a short --rdzv-timeout and trains past it; before the watchdog learned to stand down once
a rank holds a connection, every such job's rank 1 was stopped at the deadline with exit code 69 ("nothing
listened at MASTER_ADDR:MASTER_PORT"). The bound is generous for a loaded machine (every rank imports torch
before it can join); the script prints how long it lived, and the test checks that it outlived the bound.
The other side, a rank that reached nobody is still stopped, is tests/test_local_faults.py's and
tests/test_slurm_cluster.py's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import no_slurm_env, skip_or_fail
from tests.test_clients import CLIENTS, free_port, job_text, run_together, submit, succeeded, workdir_for

STYLES = ("port", "tcp", "file")
BOUND = 30  # --rdzv-timeout, seconds
LIVE = BOUND + 8  # how long the script trains, counted from its start: past the bound


@pytest.fixture(scope="module")
def torch_installed() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        skip_or_fail("torch is not installed")


Commands = dict[str, tuple[list[str], dict[str, str], Path]]


def commands(tmp_path: Path, env: dict[str, str], extra: list[str]) -> Commands:
    out = {}
    for style in STYLES:
        d = workdir_for(tmp_path, style)
        argv = [str(CLIENTS / "own_rendezvous.py"), style, str(free_port()), str(d / "rendezvous.file"), str(LIVE)]
        out[style] = (submit("--nodes", "2", "--rdzv-timeout", str(BOUND), *extra, *argv), env, d)
    return out


def check(done: dict[str, tuple[int, str]], tmp_path: Path) -> None:
    for style, (code, console) in done.items():
        d = tmp_path / style
        text = job_text(d)
        assert "exit code 69" not in console + text and "nothing listened" not in text, f"{style}: {text[-3000:]}"
        assert succeeded(code, console, d), f"{style}: {console[-3000:]}\n{text[-3000:]}"
        got = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in re.findall(r"CLIENT own (.*)", text)]
        print(style, got)
        assert sorted(r["rank"] for r in got) == ["0", "1"] and {r["style"] for r in got} == {style}, text[-3000:]
        assert len({r["params"] for r in got}) == 1 and {r["sum"] for r in got} == {"1"}, got
        assert all(float(r["lived_s"]) > BOUND for r in got), got  # the watchdog's deadline passed


def test_own_rendezvous_outlives_the_watchdog_locally(tmp_path: Path, torch_installed: None) -> None:
    env = no_slurm_env(tmp_path)
    check(run_together(commands(tmp_path, env, []), timeout=240), tmp_path)


@pytest.mark.slurm
def test_own_rendezvous_outlives_the_watchdog_on_slurm(netns_cluster_env: dict[str, str], tmp_path: Path,
                                                        torch_installed: None) -> None:
    extra = ["--time", "5", "--wait", "--wait-timeout", "220", "--cancel-on-interrupt"]
    check(run_together(commands(tmp_path, netns_cluster_env, extra), timeout=260), tmp_path)
