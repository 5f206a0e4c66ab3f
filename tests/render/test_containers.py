"""Containers: pyxis (srun --container-image) and Apptainer. Neither can be installed here: the generated
scripts are golden files (in test_submit's table), and Apptainer's command line runs through
tests/fakes/apptainer, a stand-in that applies the binds in a private mount namespace (root only) -- locally
here, and on the real Slurm cluster in tests/real/test_containers_real.py."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from slurmlaunch.render import launch, pbs_script, slurm_script
from tests.helpers import GOLDEN_CASES, assert_refused, golden_spec, no_slurm_env, run_cli, skip_or_fail

FAKES = Path(__file__).parents[1] / "fakes"
SYSTEM_PYTHON = "/usr/bin/python3"  # has no slurmlaunch: inside the "container" only the mount provides it

RECORD = """
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "HOSTILE"]
rec = {k: os.environ.get(k) for k in keys}
rec.update(cwd=os.getcwd(), python=sys.executable, argv=sys.argv[1:])
with open(os.path.join(os.environ["OUT_DIR"], f"rank-{os.environ['RANK']}.json"), "w") as f:
    json.dump(rec, f)
"""
HOSTILE = "a b'\"$(touch pwned);`x`\n\tz"

def test_pyxis_flags_and_apptainer_prefix() -> None:
    args = slurm_script.srun_args(GOLDEN_CASES["slurm_pyxis.sbatch"])
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in args and "--container-workdir=/workspace" in args
    mounts = next(a for a in args if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    assert mounts[0] == "/home/me/project:/home/me/project"
    assert mounts[1].endswith(":/opt/slurmlaunch-pkg/slurmlaunch:ro")
    assert mounts[2:] == ["/scratch:/scratch:ro", "/data:/data"]
    cmd = launch.launch_command(GOLDEN_CASES["slurm_apptainer.sbatch"])
    assert cmd[:3] == ["apptainer", "exec", "--nv"] and "--pwd" in cmd and "/images/torch.sif" in cmd
    assert cmd[cmd.index("/images/torch.sif") + 1:][:2] == ["python3", "-c"] and "torchrun-node" in cmd
    # under PBS the same prefix sits behind mpiexec
    text = pbs_script.render_script(golden_spec(apptainer="/images/torch.sif", python="python3", gpus_per_node=0))
    assert re.search(r"mpiexec .*\n +apptainer exec --bind ", text) and "--nv" not in text


@pytest.mark.parametrize(("kw", "expect"), [
    (dict(container_image="a", apptainer="b"), "cannot be used together"),
    (dict(container_mounts=("/a:/b",)), "--container-mount and --container-workdir need --container-image"),
    (dict(apptainer="x.sif", container_mounts=("a:/b",)), "--container-mount 'a:/b' is not valid"),
    (dict(apptainer="x.sif", container_mounts=("/a:/b,/c:/d",)), "no commas or spaces"),
    (dict(apptainer="x.sif", container_workdir="work"), "--container-workdir 'work' is not valid"),
    (dict(container_image="my image"), "--container-image 'my image' is not valid"),
])
def test_bad_container_requests(kw: dict[str, object], expect: str, tmp_path: Path) -> None:
    assert_refused(tmp_path, expect, **kw)


def test_pyxis_needs_slurm_and_apptainer_needs_apptainer(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    (tmp_path / "t.py").write_text("open('ran', 'w')")
    r = run_cli("submit", "--container-image", "ubuntu", "t.py", env=env, cwd=tmp_path)
    assert r.returncode == 2 and "Slurm's pyxis plugin" in r.stderr
    r = run_cli("submit", "--apptainer", "x.sif", "t.py", env=env, cwd=tmp_path)
    assert r.returncode == 2 and "apptainer is not on PATH" in r.stderr and not (tmp_path / "ran").exists()


def fake_apptainer_env(base: dict[str, str], tmp_path: Path) -> dict[str, str]:
    if os.geteuid() != 0 or not shutil.which("unshare") or not os.path.exists(SYSTEM_PYTHON):
        skip_or_fail("the Apptainer stand-in needs root and /usr/bin/python3")
    out = tmp_path / "out"
    out.mkdir()
    return dict(base, PATH=f"{FAKES}:{base['PATH']}", FAKE_APPTAINER_LOG=str(tmp_path / "apptainer.log"),
                OUT_DIR=str(out))


def check_ranks(tmp_path: Path, world: int) -> None:
    recs = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("rank-*.json"))]
    assert len(recs) == world and {r["WORLD_SIZE"] for r in recs} == {str(world)}
    assert sorted(int(r["RANK"]) for r in recs) == list(range(world))
    assert all(r["HOSTILE"] == HOSTILE and r["python"] == SYSTEM_PYTHON and r["argv"] == ["--x", "y z"]
               for r in recs)
    assert not (tmp_path / "pwned").exists()
    calls = (tmp_path / "apptainer.log").read_text().splitlines()
    assert len(calls) == world and all(c.startswith("image=/images/torch.sif nv=0 pwd=") for c in calls)


def test_apptainer_locally_through_the_stand_in(tmp_path: Path) -> None:
    env = fake_apptainer_env(no_slurm_env(tmp_path), tmp_path)
    (tmp_path / "record.py").write_text(RECORD)
    r = run_cli("submit", "--apptainer", "/images/torch.sif", "--python", SYSTEM_PYTHON, "--tasks-per-node", "2",
                "--env", f"HOSTILE={HOSTILE}", "record.py", "--x", "y z", env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    check_ranks(tmp_path, 2)


# --- the host's python3, which runs the batch step outside the container -------------------------------------
# A stand-in python3 of another version: the real interpreter, told it is that version before it runs the
# check's code, so the check's own Python is what decides (the one thing not tested: a real Python 2 parser).
FAKE_PYTHON = """#!{real} -S
import sys
sys.version_info = {version!r}
if sys.argv[1:2] == ["-V"]:
    (sys.stderr if sys.version_info[0] < 3 else sys.stdout).write("Python %d.%d.%d\\n" % sys.version_info[:3])
elif sys.argv[1:2] == ["-c"]:
    exec(sys.argv[2])
"""


def _host_check_prefix(text: str) -> str:
    """The rendered script's lines before the batch step starts anything (up to the host check), then a mark."""
    head, found, _ = text.partition("\nlog_dir=")
    assert found and "python3 -c 'import sys" in head
    return head + "\necho 'check passed'\n"


@pytest.mark.parametrize("render", [
    lambda: slurm_script.render_script(GOLDEN_CASES["slurm_pyxis.sbatch"]),
    lambda: slurm_script.render_script(GOLDEN_CASES["slurm_apptainer.sbatch"]),
    lambda: pbs_script.render_script(golden_spec(apptainer="/images/torch.sif", python="python3", gpus_per_node=0)),
], ids=["pyxis", "apptainer", "pbs-apptainer"])
@pytest.mark.parametrize("version, passes", [
    ((3, 6, 8, "final", 0), False), ((2, 7, 18, "final", 0), False), ((3, 9, 19, "final", 0), False),
    ((3, 10, 0, "final", 0), True), (None, False),  # None: no python3 on PATH at all
])
def test_an_old_or_missing_host_python3_says_so_in_one_line(render: object, version: tuple[object, ...] | None,
                                                              passes: bool, tmp_path: Path) -> None:
    import subprocess
    import sys
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("head", "umask"):  # the check's own pipe; the rest are bash built-ins
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    if version is not None:
        fake = bin_dir / "python3"
        fake.write_text(FAKE_PYTHON.format(real=sys.executable, version=version))
        fake.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(_host_check_prefix(render()))  # type: ignore[operator]
    r = subprocess.run(["/bin/bash", str(script)], env={"PATH": str(bin_dir)}, capture_output=True, text=True,
                       timeout=60, check=False)
    if passes:
        assert (r.returncode, r.stdout, r.stderr) == (0, "check passed\n", "")
        return
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r
    found = f"Python {version[0]}.{version[1]}.{version[2]} at {bin_dir}/python3" if version else "no python3 on PATH"
    assert r.stderr == (f"slurmlaunch: the batch step runs on this host with its python3 and found {found}; it needs "
                        f"Python >= 3.10. Fix: load one in --setup (e.g. --setup 'module load python/3.11') or put "
                        f"one first on PATH (--python is the container's)\n")


def test_the_host_check_asks_for_the_python_pyproject_requires() -> None:
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert f'requires-python = ">={".".join(map(str, launch.MIN_PYTHON))}"' in text
    assert launch.host_python_check(golden_spec()) is None  # no container: --python runs the batch step
