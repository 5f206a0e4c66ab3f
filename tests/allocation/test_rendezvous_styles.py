"""The rendezvous watchdog never stops a healthy job that rendezvous its own way (issue 27, part 1).

tests/clients/own_rendezvous.py joins its world by its own MASTER_PORT (idr-torch's way), by
init_method="tcp://host:PORT" and by "file://PATH": nothing ever listens at the MASTER_PORT slurmlaunch chose.
Each job runs with a short --rdzv-timeout and trains past it; before the watchdog learned to stand down once
a rank holds a connection, every such job's rank 1 was stopped at the deadline with exit code 69 ("nothing
listened at MASTER_ADDR:MASTER_PORT"). The bound is generous for a loaded machine (every rank imports torch
before it can join); the script prints how long it lived, and the test checks that it outlived the bound.
The other side, a rank that reached nobody is still stopped, is tests/schedulers/test_local_faults.py's and
tests/real/test_slurm_cluster.py's."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.helpers import no_slurm_env, skip_or_fail
from tests.ports import port as free_port
from tests.real.test_clients import CLIENTS, job_text, run_together, submit, succeeded, workdir_for

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


def test_own_rendezvous_outlives_run_master_timeout(tmp_path: Path, torch_installed: None) -> None:
    """`slurmlaunch run` across 2 nodes of this machine: node 1 starts its ranks at once, whatever listens at
    --master-port. The script rendezvous at init_method="tcp://127.0.0.1:ITS_PORT", so nothing ever listens
    at --master-port; it trains past --master-timeout. Before, node 1 waited for --master-port to listen,
    then exited 2, "could not reach the master", and node 0's rank waited for a peer that never came."""
    d = workdir_for(tmp_path, "run")
    env = no_slurm_env(d)
    script = [str(CLIENTS / "own_rendezvous.py"), "tcp", str(free_port()), str(d / "unused"), str(LIVE)]
    master_port = str(free_port())
    commands = {f"node{node}": ([sys.executable, "-m", "slurmlaunch", "run", "--nnodes", "2", "--node-rank",
                                 str(node), "--master-addr", "127.0.0.1", "--master-port", master_port,
                                 "--allow-loopback", "--cpu", "--master-timeout", str(BOUND), *script], env, d)
                for node in range(2)}
    done = run_together(commands, timeout=240)
    text = done["node0"][1] + done["node1"][1]
    assert done["node0"][0] == 0 and done["node1"][0] == 0, text[-3000:]
    assert "rendezvous never happened" not in text and "Stopping this rank" not in text, text[-3000:]
    # what node 1 said while it waited: nothing listens there, the ranks joined a world of their own
    assert re.search(rf"slurmlaunch: node 1: nothing listens at 127\.0\.0\.1:{master_port} after \d+s, but the "
                     r"ranks hold TCP connections \(a rendezvous of their own\)", done["node1"][1]), text[-3000:]
    got = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in re.findall(r"CLIENT own (.*)", text)]
    assert sorted(r["rank"] for r in got) == ["0", "1"] and {r["style"] for r in got} == {"tcp"}, text[-3000:]
    assert len({r["params"] for r in got}) == 1 and {r["sum"] for r in got} == {"1"}, got
    assert all(float(r["lived_s"]) > BOUND for r in got), got  # the ranks' deadline passed
