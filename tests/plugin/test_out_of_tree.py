"""A scheduler slurmlaunch does not ship is a plug-in for the CLI and the Python API alike (issue 39 step 3):
the toy queue of toyq.py, registered the documented way (an entry point in the group
``slurmlaunch.schedulers`` of an installed distribution: here a .dist-info the test writes on PYTHONPATH),
driving stand-in commands on PATH (standin.py), runs `submit`, `status`, `cancel`, `list` and the API's
submit/result with no file of slurmlaunch/ naming it. The stand-ins really run the job's script; the states
`status` and `list` print are the stand-in's answers and the script's own exit-code file."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

import slurmlaunch
from slurmlaunch.core.errors import SpecError
from slurmlaunch.schedulers import registry
from tests.helpers import ROOT, run_cli

HERE = Path(__file__).resolve().parent
PLUGIN_MODULE = "tests.plugin.toyq"


def install_plugin(site: Path, value: str = f"{PLUGIN_MODULE}:EDGE", name: str = "toyq") -> None:
    """What `pip install` of a package declaring [project.entry-points."slurmlaunch.schedulers"] leaves."""
    info = site / "toyq_plugin-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyq-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[slurmlaunch.schedulers]\n{name} = {value}\n")


@pytest.fixture
def toyq(tmp_path: Path) -> dict[str, str]:
    """An environment with the plug-in installed and the toy queue's clients on PATH; its own state."""
    site, bin_dir = tmp_path / "site", tmp_path / "bin"
    install_plugin(site)
    bin_dir.mkdir()
    for command in ("toyq-submit", "toyq-release", "toyq-stat", "toyq-del"):
        (bin_dir / command).write_text(f"#!{sys.executable}\n" + (HERE / "standin.py").read_text())
        (bin_dir / command).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": f"{site}:{ROOT}",
            "TOYQ_HOME": str(tmp_path / "queue"), "XDG_STATE_HOME": str(tmp_path / "state")}


def wait_state(job: str, wanted: str, env: dict[str, str], cwd: Path, bound: float = 60.0) -> dict[str, object]:
    deadline = time.monotonic() + bound
    while True:
        r = run_cli("status", "--json", job, env=env, cwd=cwd)
        assert r.returncode in (0, 1), r.stderr
        status = json.loads(r.stdout)
        if status["state"] == wanted:
            return dict(status)
        assert time.monotonic() < deadline, f"job {job} not {wanted} after {bound:.0f}s: {status}"
        time.sleep(0.2)


def test_the_cli_runs_jobs_through_an_installed_plugin(toyq: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import sys, time\nprint('trained', sys.argv[1:])\n"
                                       "if sys.argv[1] == 'long':\n    time.sleep(120)\nsys.exit(int(sys.argv[2]))\n")
    dry = run_cli("submit", "--scheduler", "toyq", "--dry-run", "train.py", "short", "0", env=toyq, cwd=tmp_path)
    assert dry.returncode == 0 and "# would run: toyq-submit '<this script>'" in dry.stderr, dry.stderr
    assert dry.stdout.startswith("#!/bin/bash\n# toyq job train.py: 1 rank\n"), dry.stdout

    done = run_cli("submit", "--scheduler", "toyq", "--no-wait", "train.py", "short", "3", env=toyq, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    assert job == "101" and f"submitted job {job}" in done.stderr, done.stderr
    status = wait_state(job, "FAILED", toyq, tmp_path)
    assert status["exit_code"] == 3, status
    record = json.loads((tmp_path / "slurmlaunch-logs" / f"job-{job}.json").read_text())
    assert record["scheduler"] == "toyq" and record["command"][0] == "toyq-submit", record
    logs = run_cli("logs", job, env=toyq, cwd=tmp_path)
    assert logs.returncode == 0 and "trained ['short', '3']" in logs.stdout, (logs.stdout, logs.stderr)

    long = run_cli("submit", "--scheduler", "toyq", "--no-wait", "train.py", "long", "0", env=toyq, cwd=tmp_path)
    assert long.returncode == 0, long.stderr
    running = long.stdout.strip()
    assert wait_state(running, "RUNNING", toyq, tmp_path)["nodes"] == "toyhost"
    listed = run_cli("list", env=toyq, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert "toyq" in rows[job] and "FAILED" in rows[job] and "RUNNING" in rows[running], listed.stdout
    cancel = run_cli("cancel", running, env=toyq, cwd=tmp_path)
    assert cancel.returncode == 0, cancel.stderr
    wait_state(running, "CANCELLED", toyq, tmp_path)
    pid = int(Path(toyq["TOYQ_HOME"], f"{running}.pid").read_text())
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "toyq-del left the job's processes running"
        time.sleep(0.1)


def test_a_plugins_options_are_checked_as_a_shipped_schedulers_are(toyq: dict[str, str], tmp_path: Path) -> None:
    """Its refusals are the same rule's (schedulers/support.py): one line, exit 2, nothing submitted."""
    (tmp_path / "train.py").write_text("")
    r = run_cli("submit", "--scheduler", "toyq", "--nodes", "2", "train.py", env=toyq, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--nodes 2: the toyq scheduler cannot carry it out: toyq runs one node" in r.stderr, r.stderr
    assert not Path(toyq["TOYQ_HOME"]).exists()
    unknown = run_cli("submit", "--scheduler", "lsf", "train.py", env=toyq, cwd=tmp_path)
    assert unknown.returncode == 2 and "invalid choice: 'lsf'" in unknown.stderr, unknown.stderr


API_CALL = """
import sys
import slurmlaunch

def add(a, b):
    import submitit
    env = submitit.JobEnvironment()  # the rank's place, as a function reads it under Slurm
    return a + b, env.cluster, env.job_id, env.global_rank, env.num_tasks

job = slurmlaunch.submit(add, 2, 3, scheduler="toyq")
total, cluster, job_id, rank, tasks = job.result()
print("result", total, cluster, job_id == job.job_id, rank, tasks, flush=True)
"""


def test_the_python_api_runs_a_function_through_an_installed_plugin(toyq: dict[str, str], tmp_path: Path) -> None:
    import subprocess

    (tmp_path / "call.py").write_text(API_CALL)
    r = subprocess.run([sys.executable, "call.py"], cwd=tmp_path, env=toyq, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0 and "result 5 toyq True 0 1" in r.stdout, (r.stdout, r.stderr[-3000:])
    assert os.listdir(toyq["TOYQ_HOME"]), "the job did not go through the toy queue's toyq-submit"


# --- the registry's side: what a bad plug-in gets -------------------------------------------------------------

@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    registry.installed.cache_clear()
    yield site
    registry.installed.cache_clear()


def test_the_registry_finds_an_installed_plugin_in_process(on_path: Path) -> None:
    install_plugin(on_path)
    from tests.plugin import toyq

    assert registry.scheduler("toyq") is toyq.EDGE
    assert "toyq" in registry.NAMES and list(registry.NAMES)[:3] == list(registry.SHIPPED)
    assert registry.SHIPPED == tuple(p.name for p in registry.PLUGINS)
    from slurmlaunch.app.options import SUBMIT_OPTIONS

    opt = next(o for _, group in SUBMIT_OPTIONS for o in group if o.flags[0] == "--scheduler")
    assert "toyq" in (opt.choices or ()) and "lsf" not in (opt.choices or ())


@pytest.mark.parametrize(("name", "value", "said"), [
    ("slurm", f"{PLUGIN_MODULE}:EDGE", "'slurm' is a name slurmlaunch gives its own scheduler"),
    ("toyq", "tests.plugin.nowhere:EDGE", "tests.plugin.nowhere:EDGE cannot be loaded"),
    ("toyq", f"{PLUGIN_MODULE}:NOTHING", f"{PLUGIN_MODULE}:NOTHING cannot be loaded"),
    ("other", f"{PLUGIN_MODULE}:EDGE", "calls itself 'toyq' (expected 'other', its entry point's name)"),
])
def test_a_broken_plugin_is_one_line_naming_it(on_path: Path, name: str, value: str, said: str) -> None:
    """Said when the name is asked for, or any plug-in's (`list`, --scheduler NAME): a plug-in that would shadow a
    shipped scheduler is refused even though the shipped name alone never reads the plug-ins."""
    install_plugin(on_path, value, name)
    with pytest.raises(SpecError, match=said.replace("(", r"\(").replace(")", r"\)")):
        registry.scheduler(name if name != "slurm" else "lsf")
    assert registry.scheduler("slurm").name == "slurm"


def test_shipped_names_read_no_package_metadata(tmp_path: Path) -> None:
    """A command on a shipped scheduler never looks for plug-ins (importlib.metadata costs tens of ms)."""
    import subprocess

    code = ("import sys\nfrom slurmlaunch.schedulers.registry import NAMES, scheduler, canonical\n"
            "assert 'local' in NAMES and canonical('slurm') == 'slurm'\nscheduler('pbs')\n"
            "assert 'importlib.metadata' not in sys.modules, 'metadata read'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert slurmlaunch.__file__


# --- what a plug-in offers that the app reads (issue 39: no capability flag only one scheduler sets) --------------

def test_a_plugin_that_offers_a_ranks_requeue_command_lets_lightning_requeue(tmp_path: Path) -> None:
    """submit leaves the requeue to Lightning's rank 0 exactly where the scheduler offers its ranks the command
    Lightning runs (`scontrol requeue`): a plug-in may (a Slurm-compatible queue), whatever its name; one that
    offers another command, or none (toyq as shipped here), keeps the batch script's requeue."""
    from dataclasses import replace

    from slurmlaunch.app.submit import adapt_to_client
    from slurmlaunch.core.spec import JobSpec
    from tests.plugin import toyq

    (tmp_path / "train.py").write_text("import lightning as L\nL.Trainer().fit(None)\n")
    spec = JobSpec.of(script="train.py", workdir=str(tmp_path), requeue=True, time="10")
    warned = replace(toyq.EDGE, warning_signal=True)
    by_whom = {offered: adapt_to_client(spec, {}, replace(warned, rank_requeue=offered)).preemption.requeued_by
               for offered in ("scontrol requeue", "toyq-requeue", None)}
    assert by_whom == {"scontrol requeue": "script", "toyq-requeue": "slurmlaunch", None: "slurmlaunch"}
    assert adapt_to_client(spec, {}, warned).warning == ("USR1", 90)  # Lightning's signal all the same


def test_a_plugin_that_takes_gpu_request_styles_gets_the_one_doctor_learned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU request style doctor kept for a cluster (site.json, by the cluster's name) is used by submit on a
    scheduler that takes more than one style, a plug-in's as Slurm's, by its cluster()'s name; never on one that
    takes none (toyq as shipped here), nor when --gpu-flag was given."""
    from dataclasses import replace

    from slurmlaunch.app.submit import adapt_to_site
    from slurmlaunch.core.spec import JobSpec
    from tests.plugin import toyq

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "state" / "slurmlaunch").mkdir(parents=True)
    (tmp_path / "state" / "slurmlaunch" / "site.json").write_text(json.dumps({"toyland": {"gpu_flag": "gres"}}))
    spec = JobSpec.of(script="train.py", gpus_per_node=2)
    styles = replace(toyq.EDGE, gpu_request_styles=("gpus-per-node", "gres"), cluster_of=lambda: {"name": "toyland"})
    assert adapt_to_site(spec, {}, styles).resources.gpu_flag == "gres"
    assert adapt_to_site(spec, {"gpu_flag": "command line"}, styles).resources.gpu_flag == "gpus-per-node"
    elsewhere = replace(styles, cluster_of=lambda: {"name": "another"})
    assert adapt_to_site(spec, {}, elsewhere).resources.gpu_flag == "gpus-per-node"
    assert adapt_to_site(spec, {}, replace(styles, gpu_request_styles=())).resources.gpu_flag == "gpus-per-node"
    assert toyq.EDGE.gpu_request_styles == () and toyq.EDGE.rank_requeue is None  # the interface's defaults
