"""The Python API from a "laptop" (no Slurm commands, its own HOME and ~/.ssh/config): a function pickled
here runs on 4 ranks of the real dev cluster behind a real sshd; the ranks' values and a failing rank's
exception come back. The cluster's interpreter has no slurmlaunch (it travels) but has submitit."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

from tests import sshd
from tests.sshd import free_master_port, masters_left, python_without_slurmlaunch

LAPTOP_SCRIPT = """\
import json, os, sys, time
import slurmlaunch

def work(tag):  # defined in __main__: it travels by value
    import os
    rank = int(os.environ["RANK"])
    print("hello from rank", rank, flush=True)
    if tag == "fail" and rank == 1:
        raise ValueError("rank one refuses: " + tag)
    return {"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "tag": tag, "py": sys.executable}

dest, setup, python, port1, port2, port3, hostile = json.loads(sys.argv[1])
common = dict(remote=dest, remote_setup=setup, remote_python=python, nodes=2, tasks_per_node=2)
out = {}
job = slurmlaunch.submit(work, hostile, master_port=port1, **common)
out["id"] = job.job_id
out["results"] = job.results()
until = time.time() + 60  # the values may come before the job's end reaches the scheduler (issue 32)
while not job.done() and time.time() < until:
    time.sleep(0.5)
out["state"] = job.state
out["done"] = job.done()
out["logs"] = job.logs(rank=3)
bad = slurmlaunch.submit(work, "fail", master_port=port2, **common)
try:
    bad.results()
except slurmlaunch.RankFailed as e:
    out["failed"] = [type(e).__name__, e.rank, e.trace]
script = slurmlaunch.submit_script("job.py", ["a b", "$(id)"], master_port=port3, **common)
out["script"] = script.results()
try:
    slurmlaunch.submit(work, "x", scheduler="local", **common)
except slurmlaunch.SpecError as e:
    out["local"] = str(e)
try:
    slurmlaunch.submit(work, "x", **{**common, "nodes": 0})
except slurmlaunch.SpecError as e:
    out["refused"] = str(e)
print("OUT " + json.dumps(out))
"""


def test_api_from_the_laptop_returns_4_ranks_and_a_failing_ranks_exception(
        laptop: sshd.Laptop, cluster_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    python = python_without_slurmlaunch(tmp_path)
    project = tmp_path / "notebook"
    project.mkdir()
    (project / "run.py").write_text(LAPTOP_SCRIPT)
    (project / "job.py").write_text("import sys\nsys.exit(0 if sys.argv[1:] == ['a b', '$(id)'] else 5)\n")
    remote_dir = tmp_path / "cluster" / "notebook"
    setup = [f"export SLURM_CONF={shlex.quote(cluster_env['SLURM_CONF'])}", "export SLURMLAUNCH_ALLOW_LOOPBACK=1"]
    hostile = "v $(touch /tmp/slurmlaunch-pwned-api) `id` 'q' \"q\" ünï\nl2"
    Path("/tmp/slurmlaunch-pwned-api").unlink(missing_ok=True)
    argv = json.dumps([f"login:{remote_dir}", setup, python, int(free_master_port()), int(free_master_port()),
                       int(free_master_port()), hostile])
    r = subprocess.run(["python3", "run.py", argv], capture_output=True, text=True, env=laptop.env, cwd=project,
                       timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "OUT " in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.split("OUT ", 1)[1])
    assert [v["rank"] for v in out["results"]] == [0, 1, 2, 3]
    assert all(v["world"] == 4 and v["tag"] == hostile and v["py"] == python for v in out["results"])
    assert out["state"] == "COMPLETED" and out["done"] is True
    assert "hello from rank 3" in out["logs"], out["logs"]
    kind, rank, trace = out["failed"]
    assert (kind, rank) == ("RankFailed", 1) and "ValueError: rank one refuses: fail" in trace, trace
    assert "nodes" in out["refused"] and "only Slurm and PBS clusters" in out["local"]
    assert out["script"] == [0, 0, 0, 0]  # the synced script, its arguments as given, on every rank
    assert not Path("/tmp/slurmlaunch-pwned-api").exists()
    assert (remote_dir / "run.py").is_file() and (remote_dir / "run.py").stat().st_mode & 0o077 == 0
    assert masters_left(laptop) == []  # the handles' masters stopped when the laptop process ended


ARRAYS_SCRIPT = """\
import json, os, sys
import slurmlaunch

def square(x, offset=0):  # defined in __main__: it travels by value
    import os
    print("square of", x, "on rank", os.environ["RANK"], flush=True)
    return {"value": x * x + offset, "rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"])}

def shout(word):
    return word.upper()

ports = json.loads(sys.argv[1])
out = {}
# the destination, its set-up lines and the interpreter come from the profile
jobs = slurmlaunch.map_array(square, [2, 3], profile="booster", nodes=1, tasks_per_node=2, master_port=ports[0],
                             offset=1)
out["array_ids"] = [j.job_id for j in jobs]
out["array"] = [j.results() for j in jobs]
with slurmlaunch.batch(profile="booster", nodes=1, tasks_per_node=1, master_port=ports[1]) as b:
    b.submit(shout, "a b $(id)")
    b.submit(square, 4)
out["batch_ids"] = [j.job_id for j in b.jobs]
out["batch"] = [j.result() for j in b.jobs]
one = slurmlaunch.submit(square, 5, profile="booster", nodes=1, tasks_per_node=1, master_port=ports[2])
out["one_id"] = one.job_id
out["one"] = one.result()
print("OUT " + json.dumps(out))
"""


def test_map_array_batch_and_a_profiles_remote_from_the_laptop_and_the_job_commands_see_them(
        laptop: sshd.Laptop, cluster_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    python = python_without_slurmlaunch(tmp_path)
    project = tmp_path / "nb"
    project.mkdir()
    (project / "run.py").write_text(ARRAYS_SCRIPT)
    remote_dir = tmp_path / "cluster" / "nb"
    setup = [f"export SLURM_CONF={shlex.quote(cluster_env['SLURM_CONF'])}", "export SLURMLAUNCH_ALLOW_LOOPBACK=1"]
    (project / "slurmlaunch.toml").write_text(
        "[profiles.booster]\n"
        f"remote = {json.dumps(f'login:{remote_dir}')}\n"
        f"remote-setup = {json.dumps(setup)}\n"
        f"python = {json.dumps(python)}\n")
    ports = json.dumps([int(free_master_port()) for _ in range(3)])
    r = subprocess.run(["python3", "run.py", ports], capture_output=True, text=True, env=laptop.env, cwd=project,
                       timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "OUT " in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.split("OUT ", 1)[1])
    assert out["array"] == [[{"value": 5, "rank": 0, "world": 2}, {"value": 5, "rank": 1, "world": 2}],
                            [{"value": 10, "rank": 0, "world": 2}, {"value": 10, "rank": 1, "world": 2}]]
    assert out["batch"] == ["A B $(ID)", {"value": 16, "rank": 0, "world": 1}]
    assert out["one"] == {"value": 25, "rank": 0, "world": 1}
    array, batch = out["array_ids"], out["batch_ids"]
    assert len({a.split("_")[0] for a in array}) == 1 and [a.split("_")[1] for a in array] == ["0", "1"], array
    assert (remote_dir / "run.py").is_file()  # synced from the laptop

    # the laptop's job commands know every one of them: list, status, logs, cancel
    listed = sshd.on_laptop(laptop, "list", "--json", cwd=project)
    assert listed.returncode == 0, listed.stderr
    rows = {row["job_id"]: row for row in json.loads(listed.stdout)}
    for job_id in (array[0].split("_")[0], batch[0].split("_")[0], out["one_id"]):
        assert rows[job_id]["remote"] == "login" and rows[job_id]["scheduler"] == "slurm", rows
    status = sshd.on_laptop(laptop, "status", "--json", out["one_id"], cwd=project)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "COMPLETED", status.stdout + status.stderr
    element = sshd.on_laptop(laptop, "status", "--json", array[1], cwd=project)
    assert element.returncode == 0 and json.loads(element.stdout)["state"] == "COMPLETED", element.stderr
    logs = sshd.on_laptop(laptop, "logs", "--rank", "1", array[1], cwd=project)
    assert logs.returncode == 0 and "square of 3 on rank 1" in logs.stdout, logs.stdout + logs.stderr
    # the batch log is the CLI's (the batch step's words: the script is the CLI's template); rank 0's output
    logs = sshd.on_laptop(laptop, "logs", "--rank", "0", out["one_id"], cwd=project)
    assert logs.returncode == 0 and "square of 5 on rank 0" in logs.stdout, logs.stdout + logs.stderr
    logs = sshd.on_laptop(laptop, "logs", out["one_id"], cwd=project)
    assert logs.returncode == 0, logs.stderr
    cancel = sshd.on_laptop(laptop, "cancel", out["one_id"], cwd=project)
    assert cancel.returncode == 0, cancel.stderr
    assert masters_left(laptop) == []


def test_the_login_nodes_runner_refuses_another_python_minor_version_before_unpickling() -> None:
    """cloudpickle's code objects do not carry across minor versions (a 3.11 laptop's function unpickled by a
    3.12 login node crashed the rank with SIGSEGV): the runner compares versions before it reads the call."""
    import base64
    import pickle
    import sys

    here = "{}.{}".format(*sys.version_info[:2])
    for laptop, refused in (("2.7", True), (here, False)):
        proc = subprocess.run([sys.executable, "-m", "slurmlaunch.app.api.runner", "state", laptop],
                              input=b"not a pickle", capture_output=True, timeout=60)
        if refused:
            answer = pickle.loads(base64.b64decode(proc.stdout.strip().splitlines()[-1]))
            message = str(answer["error"])
            assert f"is Python {here} and the laptop's is Python 2.7" in message and "remote_python" in message
            assert "\n" not in message and proc.returncode == 0
        else:  # the same version goes on to read the call (here: not a pickle, so it fails there)
            assert b"UnpicklingError" in proc.stderr or b"pickle" in proc.stderr.lower()


def test_the_apis_and_doctors_remote_interpreter_is_checked_there_first(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """Audit 4/6 for the API and doctor: remote_python='~/...' is the remote home's, and a missing or too old
    interpreter is one line before anything is synced, sent or submitted."""
    home = tmp_path / "remote home"
    old = home / "old/bin/python"
    old.parent.mkdir(parents=True)
    old.write_text("#!/bin/sh\nprintf 3.8\n")  # a login node's python3 of Ubuntu 20.04
    old.chmod(0o755)
    project = tmp_path / "nb"
    project.mkdir()
    remote_dir = tmp_path / "cluster" / "nb"
    setup = [f"export HOME={shlex.quote(str(home))}"]
    (project / "run.py").write_text(
        "import json, sys\nimport slurmlaunch\n"
        "dest, setup = json.loads(sys.argv[1])\n"
        "try:\n"
        "    slurmlaunch.submit(print, remote=dest, remote_setup=setup, remote_python='~/nope/bin/python')\n"
        "except slurmlaunch.SlurmLaunchError as e:\n"
        "    print('OUT ' + json.dumps(str(e)))\n")
    r = subprocess.run(["python3", "run.py", json.dumps([f"login:{remote_dir}", setup])], capture_output=True,
                       text=True, env=laptop.env, cwd=project, timeout=120, stdin=subprocess.DEVNULL)
    said = json.loads(r.stdout.split("OUT ", 1)[1])
    assert said.startswith("remote_python ~/nope/bin/python on login: not found") and "\n" not in said, said
    assert not remote_dir.exists()  # refused before the sync
    r = sshd.on_laptop(laptop, "doctor", "--remote", f"login:{remote_dir}", "--remote-setup", setup[0],
                       "--python", "~/old/bin/python", cwd=project, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--python ~/old/bin/python on login is Python 3.8" in r.stderr and "Traceback" not in r.stderr
    assert masters_left(laptop) == []


DROP_SCRIPT = """\
import json, os, sys, time
import slurmlaunch

def wait_for_go(started, go):  # runs on the cluster: says it started, waits (bounded) for the test's word
    open(started, "w").close()
    deadline = time.monotonic() + 180
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.2)
    return 42 if os.path.exists(go) else -1

dest, setup, python, port, started, go = json.loads(sys.argv[1])
job = slurmlaunch.submit(wait_for_go, started, go, remote=dest, remote_setup=setup, remote_python=python,
                         nodes=1, master_port=port)
print("OUT " + json.dumps(job.results()), flush=True)
"""


def test_results_survive_a_connection_drop(laptop: sshd.Laptop, server: sshd.Sshd, cluster_env: dict[str, str],
                                           tmp_path: Path) -> None:
    """Second audit: results() ended at once when the connection dropped (--wait retries for 120 s). sshd goes
    away for a few seconds while results() waits: it says so once, tries again, and returns the value."""
    python = python_without_slurmlaunch(tmp_path)
    project = tmp_path / "nb"
    project.mkdir()
    (project / "run.py").write_text(DROP_SCRIPT)
    started, go = tmp_path / "started", tmp_path / "go"
    argv = json.dumps([f"login:{tmp_path / 'cluster'}", sshd.setup_for(cluster_env)[1:4:2], python,
                       int(free_master_port()), str(started), str(go)])
    p = subprocess.Popen(["python3", "run.py", argv], env=laptop.env, cwd=project, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not started.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)
        assert started.exists(), p.communicate(timeout=30)
        server.drop()
        time.sleep(6)  # the drop itself, not a synchronisation
        server.start()
        go.touch()
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0 and "OUT [42]" in out, out + err
    assert err.count("lost contact with login") == 1 and "in contact with login again" in err, err


ROUNDS_SCRIPT = """\
import json, sys, time
import slurmlaunch

def one(x):  # defined in __main__: it travels by value
    return x + 1

def together(x, folder, n):  # each element waits (bounded) until all n have started, so that they end together
    import os, time
    open(os.path.join(folder, str(x)), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(folder)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    if x < 0:
        raise ValueError("element refuses: " + str(x))
    return x * 10

dest, setup, python, folder, failing = json.loads(sys.argv[1])
common = dict(remote=dest, remote_setup=setup, remote_python=python, nodes=1, tasks_per_node=1)
out = {}
start = time.monotonic()
out["one"] = slurmlaunch.submit(one, 1, **common).result()
out["one_s"] = time.monotonic() - start
start = time.monotonic()
out["map"] = [j.result() for j in slurmlaunch.map_array(one, [1, 2, 3], **common)]
out["map_s"] = time.monotonic() - start
start = time.monotonic()
out["four"] = [j.results() for j in slurmlaunch.map_array(together, [0, 1, 2, 3], [folder] * 4, [4] * 4, **common)]
out["four_s"] = time.monotonic() - start
out["mixed"] = []
for j in slurmlaunch.map_array(together, [5, -1, 6], [failing] * 3, [3] * 3, **common):
    try:
        out["mixed"].append(j.results())
    except slurmlaunch.RankFailed as e:
        out["mixed"].append([e.rank, e.trace.strip().splitlines()[-1]])
print("OUT " + json.dumps(out))
"""


def test_a_remote_wait_is_one_round_trip_per_poll(laptop: sshd.Laptop, cluster_env: dict[str, str],
                                                   tmp_path: Path) -> None:
    """issue 32: a remote job's wait costs the laptop one ssh command (one call of the login node's runner)
    per WAIT_STEP_S at most, whatever the login node's own poll does meanwhile: the runner's calls are counted
    by the remote interpreter, a shim that logs its arguments and runs the real one."""
    from slurmlaunch.app.remote.api import RUNNER_MODULE, WAIT_STEP_S

    python = python_without_slurmlaunch(tmp_path)
    calls = tmp_path / "runner-calls"
    shim = tmp_path / "python-counted"
    shim.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(calls))}\nexec {shlex.quote(python)} "$@"\n')
    shim.chmod(0o755)
    project = tmp_path / "rounds"
    project.mkdir()
    (project / "run.py").write_text(ROUNDS_SCRIPT)
    setup = [f"export SLURM_CONF={shlex.quote(cluster_env['SLURM_CONF'])}", "export SLURMLAUNCH_ALLOW_LOOPBACK=1"]
    (tmp_path / "four").mkdir()
    (tmp_path / "mixed").mkdir()
    argv = json.dumps([f"login:{tmp_path / 'cluster' / 'rounds'}", setup, str(shim), str(tmp_path / "four"),
                       str(tmp_path / "mixed")])
    r = subprocess.run(["python3", "run.py", argv], capture_output=True, text=True, env=laptop.env, cwd=project,
                       timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "OUT " in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.split("OUT ", 1)[1])
    assert out["one"] == 2 and out["map"] == [2, 3, 4], out
    assert out["four"] == [[0], [10], [20], [30]], out
    # a sibling's failure, asked about together with the others, reaches the loop at its own handle, rank 0
    assert out["mixed"] == [[50], [0, "ValueError: element refuses: -1"], [60]], out
    actions = [line.split(RUNNER_MODULE, 1)[1].split()[0] for line in calls.read_text().splitlines()
               if RUNNER_MODULE in line]
    assert actions[0] == "submit" and actions.count("map_array") == 3, actions
    starts = [i for i, action in enumerate(actions) if action == "map_array"]
    first, then, four = actions[:starts[0]], actions[starts[0]:starts[1]], actions[starts[1]:starts[2]]
    # one wait per WAIT_STEP_S at most, nothing else while waiting
    assert first.count("wait") <= 1 + out["one_s"] // WAIT_STEP_S and set(first) == {"submit", "wait"}, actions
    assert then.count("wait") <= 3 + out["map_s"] // WAIT_STEP_S and set(then) == {"map_array", "wait"}, actions
    # the 4 handles of a map_array whose elements end together: one wait for all of them per poll, not one each
    # (one more allowed: under load the elements' result files may land further apart than the 1 s the login
    # node gathers for, which still is not one call per job)
    assert four.count("wait") <= 2 + out["four_s"] // WAIT_STEP_S \
        and set(four) == {"map_array", "wait"}, actions
    print(f"runner calls: {actions} ({out['one_s']:.1f} s, {out['map_s']:.1f} s, {out['four_s']:.1f} s)")  # -s
