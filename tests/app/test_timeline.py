"""`slurmlaunch timeline`: where a job's start-up went, per rank. The chart and the picture from fixed moments
(through the pure core; the SVG read back by the standard library's XML parser), mark() outside a job, the
rank's runner noting `import torch` and init_process_group in a real process, and real jobs: a 2x2 gloo
all_reduce on the local scheduler, the real Slurm cluster and the real OpenPBS one, each rank with every phase;
the Python API's job.timeline()."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from slurmlaunch.allocation.script_runner import python_argv
from slurmlaunch.allocation.timeline import TIMELINE_DIR, read
from slurmlaunch.core.timeline import (
    JOB_FILE,
    KINDS,
    build,
    chart,
    parse_moments,
    slow_startup_line,
    svg,
)
from tests.helpers import no_slurm_env, run_cli

S = 1_000_000_000
T0 = 1_765_000_000 * S


def _rank(rank: int, host: str, launch: float, exec_: float, torch: float, rdzv: float, mark: float) -> str:
    return (f"{T0 + int(launch * S)} {host} launch\n{T0 + int(exec_ * S)} {host} exec\n"
            f"{T0 + int(torch * S)} {host} torch\n{T0 + int(rdzv * S)} {host} rendezvous\n"
            f"{T0 + int(mark * S)} {host} mark first step\n")


FILES = {
    JOB_FILE: f"{T0} node1 batch\n{T0 + S // 2} node1 step\n",
    "0": _rank(0, "node1", 1, 1.2, 3, 4, 4.5),
    "1": _rank(1, "node1", 1, 1.3, 3.1, 4, 4.6),
    "2": _rank(2, "node2", 1.1, 1.4, 12, 12.5, 13),  # import torch took 10.6 s on node2
    "3": _rank(3, "node2", 1.1, 1.4, 3.5, 4, 4.4) + "garbage line\n12 node2\n",
}


def test_phases_slowest_rank_and_phase_from_fixed_moments() -> None:
    tl = build("42", FILES, world_size=5)
    assert [r.rank for r in tl.ranks] == [0, 1, 2, 3] and tl.missing == (4,)
    names = [p.name for p in tl.ranks[0].phases]
    assert names == ["batch step", "task start", "launcher", "import torch", "rendezvous", "first step"]
    assert tl.slowest_rank is not None and tl.slowest_rank.rank == 2
    assert tl.slowest_phase is not None and tl.slowest_phase.name == "import torch"
    assert tl.slowest_phase.seconds == pytest.approx(10.6)
    assert tl.seconds == pytest.approx(13.0)
    assert tl.ranks[2].phases[0].start_s == 0 and tl.ranks[2].phases[3].start_s == pytest.approx(1.4)
    assert tl.summary() == ("job 42: start-up took 13.0s; slowest rank 2 on node2, its slowest phase import torch "
                            "(10.6s)")
    data = tl.data()
    assert data["slowest_rank"] == 2 and data["missing"] == [4]
    assert json.loads(json.dumps(data)) == data


def test_the_text_chart_draws_every_rank_on_one_axis() -> None:
    text = chart(build("42", FILES, world_size=5), width=26)  # 0.5 s a cell
    lines = text.splitlines()
    assert lines[0].startswith("job 42: start-up took 13.0s; slowest rank 2")
    row = {int(line.split()[1]): line for line in lines[1:5]}
    bar = row[2].split("|")[1]
    assert len(bar) == 26 and bar == "bsl" + "t" * 21 + "rm", bar
    assert row[2].endswith("13.0s  <- slowest (the last ready for the rendezvous)") and "slowest" not in row[0]
    assert row[0].split("|")[1].rstrip().endswith("rm") and row[0].split("|")[1].endswith(" ")
    assert "t import torch" in text and "m to the first mark (first step)" in text
    assert "no moments from rank(s) 4" in text
    assert "clocks' skew" in text


def test_a_clock_behind_shows_as_a_negative_phase_and_is_said() -> None:
    files = {JOB_FILE: f"{T0 + 5 * S} node1 batch\n{T0 + 5 * S} node1 step\n", "0": _rank(0, "node2", 1, 2, 3, 4, 6)}
    tl = build("7", files)
    assert tl.ranks[0].phases[1].seconds == pytest.approx(-4)
    assert "the nodes' clocks disagree" in chart(tl)
    ET.fromstring(svg(tl))  # still a picture
    # a launch moment up to a tick (10 ms) before the step's: the kernel's start time, not a clock
    files = {JOB_FILE: f"{T0 + S} node1 batch\n{T0 + S} node1 step\n", "0": _rank(0, "node1", 0.99, 2, 3, 4, 6)}
    assert "clocks disagree" not in chart(build("7", files))


def test_the_slowest_rank_is_the_last_ready_for_the_rendezvous() -> None:
    # every rank ends its start-up together (the rendezvous waits for the last); rank 1 came last to it
    files = {JOB_FILE: FILES[JOB_FILE], "0": _rank(0, "node1", 1, 1.2, 3, 9, 9.5),
             "1": _rank(1, "node2", 1, 1.2, 8.5, 9, 9.5), "2": _rank(2, "node2", 1, 1.2, 3, 9, 9.5)}
    tl = build("8", files)
    assert tl.slowest_rank is not None and tl.slowest_rank.rank == 1
    assert tl.slowest_phase is not None and tl.slowest_phase.name == "import torch"


def test_a_job_without_a_rendezvous_is_not_said_to_wait_for_one() -> None:
    # a script without torch.distributed (the local page's hello.py): its slowest rank is the last done
    files = {JOB_FILE: FILES[JOB_FILE], "0": f"{T0 + S} node1 launch\n{T0 + 2 * S} node1 exec\n",
             "1": f"{T0 + S} node2 launch\n{T0 + 3 * S} node2 exec\n"}
    text = chart(build("9", files))
    assert "rank 1 node2" in text and "rendezvous)" not in text
    assert [line for line in text.splitlines() if "<- slowest" in line][0].endswith("<- slowest (the last done)")


def test_the_svg_is_well_formed_with_a_bar_per_phase() -> None:
    files = {**FILES, "1": FILES["1"].replace("node1", "node<&\"1>")}
    picture = svg(build("42", files, world_size=4))
    root = ET.fromstring(picture)
    ns = "{http://www.w3.org/2000/svg}"
    titles = [t.text for t in root.iter(f"{ns}title")]
    assert len(titles) == 4 * 6 and "rank 2: import torch 10.600s" in titles
    labels = [t.text for t in root.iter(f"{ns}text")]
    assert "rank 1 node<&\"1>" in labels and any(str(label).startswith("job 42: start-up took") for label in labels)
    assert root.get("height") == str(44 + 16 * 4 + 60)


def test_lines_that_are_not_moments_are_skipped_and_a_mark_keeps_its_name() -> None:
    moments = parse_moments(f"{T0} n1 mark after the first batch\n{T0} n1 nonsense\nx n1 exec\n\n{T0} n1\n")
    assert [(m.kind, m.name) for m in moments] == [("mark", "after the first batch")]
    assert KINDS[-1] == "mark"


def test_wait_names_the_slowest_phase_only_when_start_up_was_long() -> None:
    assert slow_startup_line(build("42", FILES)) is None  # 13 s
    line = slow_startup_line(build("42", FILES), threshold=10)
    assert line == ("start-up took 13s, most of it in import torch (11s on rank 2, node2): slurmlaunch timeline 42 "
                    "shows every rank")


MARKS = """
import os, sys
import slurmlaunch
slurmlaunch.mark("first step")
slurmlaunch.mark("first step")  # once per name: the second is a set lookup
slurmlaunch.mark("epoch\\n 1")
print(sorted(os.listdir(sys.argv[1])))
"""


def test_mark_is_a_no_op_outside_a_job_and_writes_once_inside(tmp_path: Path) -> None:
    (tmp_path / "marks.py").write_text(MARKS)
    where = tmp_path / "timeline"
    where.mkdir()
    env = {k: v for k, v in no_slurm_env(tmp_path).items() if k not in (TIMELINE_DIR, "RANK")}
    outside = subprocess.run([sys.executable, "marks.py", str(where)], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert outside.returncode == 0 and outside.stdout == "[]\n", outside.stderr
    no_rank = subprocess.run([sys.executable, "marks.py", str(where)], env={**env, TIMELINE_DIR: str(where)},
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert no_rank.returncode == 0 and no_rank.stdout == "[]\n", no_rank.stderr
    inside = subprocess.run([sys.executable, "marks.py", str(where)],
                            env={**env, TIMELINE_DIR: str(where), "RANK": "3"}, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert inside.returncode == 0 and inside.stdout == "['3']\n", inside.stderr
    moments = parse_moments((where / "3").read_text())
    assert [(m.kind, m.name) for m in moments] == [("mark", "first step"), ("mark", "epoch 1")]


HOOKED = """
import inspect, os, sys, tempfile
armed = [f for f in sys.meta_path if getattr(f, "__name__", "") == "Finder"]
assert len(armed) == 1, sys.meta_path
from torch.distributed import init_process_group  # the name taken before anything called it
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
assert dist.init_process_group is init_process_group is c10d.init_process_group
assert "backend" in inspect.signature(init_process_group).parameters
assert armed[0] not in sys.meta_path  # gone once torch is in
init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
dist.destroy_process_group()
print("ok")
"""


def test_the_runner_notes_torch_imported_and_the_rendezvous(tmp_path: Path, torch_available: None) -> None:
    (tmp_path / "hooked.py").write_text(HOOKED)
    (tmp_path / "plain.py").write_text("import json, sys\nprint('ok')\n")
    where = tmp_path / "timeline"
    where.mkdir()
    env = {**no_slurm_env(tmp_path), TIMELINE_DIR: str(where), "RANK": "0"}
    r = subprocess.run(python_argv(sys.executable, False, "hooked.py", env), env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert [m.kind for m in parse_moments((where / "0").read_text())] == ["torch", "rendezvous"]
    env["RANK"] = "1"
    r = subprocess.run(python_argv(sys.executable, False, "plain.py", env), env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert not (where / "1").exists()  # no torch, no rendezvous, no mark: nothing written


GLOO = """
import os
import torch
import torch.distributed as dist
import slurmlaunch
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
slurmlaunch.mark("first step")
assert t.item() == int(os.environ["WORLD_SIZE"]), t
dist.destroy_process_group()
"""
EVERY_PHASE = ["batch step", "task start", "launcher", "import torch", "rendezvous", "first step"]


def _check_timeline(job: str, env: dict[str, str], cwd: Path, svg_at: Path) -> None:
    r = run_cli("timeline", job, env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"job {job}: start-up took ") and "slowest rank" in lines[0], r.stdout
    assert sum(line.startswith("rank ") for line in lines) == 4, r.stdout
    assert lines[-1] == f"picture: {svg_at}", r.stdout
    root = ET.parse(svg_at).getroot()
    assert len(list(root.iter("{http://www.w3.org/2000/svg}rect"))) >= 4 * len(EVERY_PHASE)
    data = json.loads(run_cli("timeline", job, "--json", env=env, cwd=cwd).stdout)
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3] and data["missing"] == []
    for rank in data["ranks"]:
        assert [p["name"] for p in rank["phases"]] == EVERY_PHASE, rank
        assert all(p["seconds"] >= -0.02 for p in rank["phases"]), rank  # one clock: only the 10 ms tick
    assert len({rank["host"] for rank in data["ranks"]}) == 2, data  # two nodes


def test_local_2x2_gloo_job_has_every_phase_for_every_rank(tmp_path: Path, torch_available: None) -> None:
    (tmp_path / "gloo.py").write_text(GLOO)
    env = no_slurm_env(tmp_path)
    r = run_cli("submit", "--scheduler", "local", "--nodes", "2", "--tasks-per-node", "2", "-o", str(tmp_path / "logs"),
                "--wait", "gloo.py", env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[0]
    _check_timeline(job, env, tmp_path, tmp_path / "logs" / f"job-{job}.timeline.svg")
    assert "start-up took" not in r.stderr  # under SLOW_STARTUP_S: --wait says nothing of it
    moments = read(str(tmp_path / "logs" / f"job-{job}.timeline"))
    assert sorted(moments) == ["0", "1", "2", "3", JOB_FILE]


@pytest.mark.slurm
def test_slurm_2x2_gloo_job_timeline_draws(cluster_env: dict[str, str], tmp_path: Path, torch_available: None) -> None:
    (tmp_path / "gloo.py").write_text(GLOO)
    r = run_cli("submit", "--cpus-per-task", "1", "--nodes", "2", "--tasks-per-node", "2", "--wait",
                "--wait-timeout", "200", "gloo.py", env=cluster_env, cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[0]
    record = next(tmp_path.rglob(f"job-{job}.json"))
    _check_timeline(job, cluster_env, tmp_path, record.parent / f"job-{job}.timeline.svg")


@pytest.mark.pbs
def test_pbs_2x2_gloo_job_timeline_draws(pbs_env: dict[str, str], tmp_path: Path, torch_available: None) -> None:
    (tmp_path / "gloo.py").write_text(GLOO)
    as_root = ["--env", "OMPI_ALLOW_RUN_AS_ROOT=1", "--env", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "2", *as_root, "--wait",
                "--wait-timeout", "400", "gloo.py", env=pbs_env, cwd=tmp_path, timeout=480)
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[0]
    record = next(tmp_path.rglob("job-*.json"))
    _check_timeline(job, pbs_env, tmp_path, record.parent / record.name.replace(".json", ".timeline.svg"))


def test_timeline_of_an_unknown_job_is_one_line(tmp_path: Path) -> None:
    r = run_cli("timeline", "999999", env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "999999" in r.stderr, r.stderr


def _api_rank() -> float:
    import torch
    import torch.distributed as dist

    import slurmlaunch

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    slurmlaunch.mark("first step")
    dist.destroy_process_group()
    return float(t.item())


def test_api_job_timeline_is_typed_data(tmp_path: Path, torch_available: None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import slurmlaunch
    from slurmlaunch.core.timeline import Timeline

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    job = slurmlaunch.submit(_api_rank, scheduler="local", nodes=2, tasks_per_node=2,
                             output_dir=str(tmp_path / "logs"))
    assert job.results() == [4.0] * 4
    tl = job.timeline()
    assert isinstance(tl, Timeline) and [r.rank for r in tl.ranks] == [0, 1, 2, 3] and tl.missing == ()
    for rank in tl.ranks:  # the local scheduler's supervisor (the API's local jobs are its detached jobs: batch,
        # step), then the function's process: its start, the function's, torch, the rendezvous, the mark
        assert [p.name for p in rank.phases] == ["batch step", "task start", "launcher", "import torch",
                                                 "rendezvous", "first step"], rank
    assert tl.slowest_rank is not None and tl.slowest_phase in tl.slowest_rank.phases
