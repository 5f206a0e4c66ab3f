"""The job request (core/spec.py) and its validation: tables of values through validate() and the parse_*
functions, each refusal with its exact one-line message. Pure: no processes and no files (validate() looks
at none: the checks that need the submitting machine's files are app/resolve.py's, tests/app/test_resolve.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import slurmlaunch.core
from slurmlaunch.core.errors import SlurmLaunchError, SpecError
from slurmlaunch.core.spec import (
    JobSpec,
    parse_array,
    parse_env,
    parse_nodes,
    parse_sweep,
    time_minutes,
    time_seconds,
    validate,
)

TIME_FORMATS = "(expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)"
ARRAY_FORMS = "expected indices such as 0-9, 1,3,5-7 or 0-15:4"
NODES_FORMS = "expected a number of nodes, or MIN:MAX with --mode torchrun"
SWEEP_FORM = "expected KEY=V1,V2,... with non-empty values, e.g. lr=0.1,0.01"


# Neither exists: validate() must not look.
NOWHERE = dict(workdir="/nonexistent/slurmlaunch-workdir", python="/nonexistent/bin/python")


def request(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(script="t.py", **NOWHERE)
    base.update(kw)
    return JobSpec.of(**base)


# --- validate(): requests it accepts unchanged -------------------------------------------------------------

GOOD = [
    {},
    dict(nodes=100000),
    dict(nodes=2, gpus_per_node=4),
    dict(nodes=2, gpus_per_node=4, tasks_per_node=4, cpus_per_gpu=8),
    dict(tasks_per_node=3, cpus_per_task=2),
    dict(time="10"), dict(time="1:30"), dict(time="1:00:00"), dict(time="2-3"), dict(time="2-3:04:05"),
    dict(time="UNLIMITED"), dict(time="infinite"),
    dict(mem="4000"), dict(mem="16G"), dict(mem="512m"),
    dict(signal="USR1@120"), dict(signal="SIGTERM@0"), dict(signal="USR2"), dict(signal="none"), dict(signal=None),
    dict(requeue=True), dict(requeued_by="script"), dict(max_requeues=0),
    dict(rdzv_timeout=0), dict(rdzv_timeout=31536000), dict(master_port=1), dict(master_port=65535),
    dict(array="0-3"), dict(array="1,3,5-7", max_parallel=2), dict(sweep=(("lr", ("0.1", "0.01")),)),
    dict(mode="torchrun", nodes=4, min_nodes=2, max_restarts=3),
    dict(mpi="pals"), dict(pbs_flavour="torque"), dict(gpu_flag="gres"),
    dict(partition="gpu", account="proj42", qos="high", constraint="a100&ib"),
    dict(sbatch_args=("--mail-type=END",)), dict(job_name="a b $(x)"),  # the job name is data, byte for byte
    dict(apptainer="img.sif", container_mounts=("/data:/data",), container_workdir="/work"),
]


@pytest.mark.parametrize("kw", GOOD, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "defaults")
def test_good_requests_pass_unchanged(kw: dict[str, object]) -> None:
    spec = request(**kw)
    assert validate(spec) is spec


# --- validate(): what it refuses, and the exact line the user sees -----------------------------------------

BAD: list[tuple[dict[str, object], str]] = [
    (dict(nodes=0), "--nodes 0 is not valid (expected an integer 1..100000)"),
    (dict(nodes=100001), "--nodes 100001 is not valid (expected an integer 1..100000)"),
    (dict(gpus_per_node=-1), "--gpus-per-node -1 is not valid (expected an integer 0..65533)"),
    (dict(tasks_per_node=0), "--tasks-per-node 0 is not valid (expected an integer 1..65533)"),
    (dict(cpus_per_task=0), "--cpus-per-task 0 is not valid (expected an integer 1..65533)"),
    (dict(cpus_per_task=2, cpus_per_gpu=2, gpus_per_node=1),
     "--cpus-per-task and --cpus-per-gpu cannot be used together (give one of them)"),
    (dict(cpus_per_gpu=2), "--cpus-per-gpu needs --gpus-per-node > 0 (or use --cpus-per-task)"),
    (dict(gpus_per_node=4, tasks_per_node=2),
     "--tasks-per-node 2 is not valid with --gpus-per-node 4 (one rank per GPU: tasks per node must equal GPUs "
     "per node)"),
    (dict(time="1:2:3:4"), f"--time '1:2:3:4' is not a time Slurm accepts {TIME_FORMATS}"),
    (dict(time="abc"), f"--time 'abc' is not a time Slurm accepts {TIME_FORMATS}"),
    (dict(time="10\n"), "--time '10\\n' contains the control character '\\n' (expected a value without control "
                        "characters)"),
    (dict(time="٣"), f"--time '٣' is not a time Slurm accepts {TIME_FORMATS}"),  # [0-9], not \d
    (dict(time="4294967295"),
     "--time '4294967295' is longer than Slurm can keep (at most 4294967294 minutes; UNLIMITED for no limit)"),
    (dict(mem="4X"), "--mem '4X' is not valid (expected a size such as 4000, 16G or 512M)"),
    (dict(mem="99999999999T"), "--mem '99999999999T' is more than any node has (expected at most 1 EiB, e.g. 512G)"),
    (dict(signal="KILL@10"),
     "--signal 'KILL@10' is not valid (expected NAME[@SECONDS] with NAME one of USR2, USR1, TERM, INT, HUP, ALRM, "
     "URG, XCPU, CONT, e.g. USR2@90; or none)"),
    (dict(signal="USR2@65536"), "--signal 'USR2@65536' is not valid (expected SECONDS 0..65535 after @, as Slurm "
                                "allows, e.g. USR2@90)"),
    (dict(signal="B:usr1@-1"), "--signal 'B:usr1@-1' is not valid (expected SECONDS 0..65535 after @, as Slurm "
                               "allows, e.g. USR1@90)"),
    (dict(max_requeues=-1), "--max-requeues -1 is not valid (expected an integer 0..65535)"),
    (dict(requeued_by="me"), "requeued_by 'me' is not valid (expected one of slurmlaunch, script)"),
    (dict(requeue=True, signal=None), "--requeue needs a warning signal (--signal NAME@SECONDS), not --signal none"),
    (dict(rdzv_timeout=-1), "--rdzv-timeout -1 is not valid (expected seconds 0..31536000; 0: no bound)"),
    (dict(master_port=0), "--master-port 0 is not valid (expected 1-65535)"),
    (dict(master_port=70000), "--master-port 70000 is not valid (expected 1-65535)"),
    (dict(array="0-3", sweep=(("lr", ("1", "2")),)),
     "--array and --sweep cannot be used together (a sweep makes its own array: one element per point)"),
    (dict(array="3-1"), f"--array '3-1' is not valid ({ARRAY_FORMS}, each range from low to high)"),
    (dict(max_parallel=2), "--max-parallel needs --array or --sweep"),
    (dict(array="0-3", master_port=29500),
     "--master-port 29500 cannot be used with --array/--sweep (array elements may share nodes; each derives its "
     "own port from its job id)"),
    (dict(mode="mpirun"), "--mode 'mpirun' is not valid (expected srun or torchrun)"),
    (dict(max_restarts=2),
     "--max-restarts 2 needs --mode torchrun (torchrun's restarts, elastic ranges and ranks per node); in srun "
     "mode use --requeue and --tasks-per-node"),
    (dict(mode="torchrun", tasks_per_node=2),
     "--tasks-per-node 2 is not valid with --mode torchrun (one task per node runs torchrun; its ranks per node "
     "are --gpus-per-node, or --nproc-per-node)"),
    (dict(apptainer="x.sif", container_image="y"),
     "--container-image (pyxis) and --apptainer cannot be used together (give one of them)"),
    (dict(container_workdir="/w"), "--container-mount and --container-workdir need --container-image or --apptainer"),
    (dict(mpi="intel"), "--mpi 'intel' is not valid (expected one of openmpi, mpich, pals under PBS, pmix, "
                        "pmix_v2, pmix_v3, pmix_v4, pmix_v5, pmi2, cray_shasta, none under Slurm)"),
    (dict(pbs_flavour="x"), "--pbs-flavour 'x' is not valid (expected pro or torque)"),
    (dict(gpu_flag="gpu"), "--gpu-flag 'gpu' is not valid (expected gpus-per-node or gres)"),
    (dict(output_dir="a b\n"),
     "--output-dir 'a b\\n' contains the control character '\\n' (expected a value without control characters)"),
    # a command-line argument that was not UTF-8 (its bytes as lone surrogates, PEP 383) is named
    (dict(args=("ok", "caf\udce9")), "SCRIPT argument 2 'caf\\xe9' is not valid UTF-8 (the byte 0xe9; expected "
                                     "UTF-8 text, which the batch script is written in)"),
    (dict(output_dir="l\udcffgs"), "--output-dir 'l\\xffgs' is not valid UTF-8 (the byte 0xff; expected UTF-8 text, "
                                   "which the batch script is written in)"),
    (dict(partition="gpu\x1b[31m"),
     "--partition 'gpu\\x1b[31m' contains the control character '\\x1b' (expected a value without control "
     "characters)"),
    (dict(output_dir="logs-%j"),
     "--output-dir 'logs-%j' contains '%', which Slurm reads as a file-name pattern (choose a directory without "
     "'%' and '\\\\')"),
    (dict(sbatch_args=("mail-type=END",)),
     "--sbatch-arg 'mail-type=END' is not valid (expected one sbatch option on one line, e.g. --mail-type=END)"),
    (dict(partition="a b"), "--partition 'a b' is not valid (expected a non-empty name without spaces)"),
    (dict(account=""), "--account '' is not valid (expected a non-empty name without spaces)"),
    (dict(module=True, script=""), "no SCRIPT given"),
    (dict(script=""), "no SCRIPT given"),  # not "is a directory": the working directory joined with ""
    (dict(no_python=True, script=""), "no SCRIPT given"),
]


@pytest.mark.parametrize(("kw", "message"), BAD, ids=[m.split(" (")[0][:50] for _, m in BAD])
def test_bad_requests_are_one_line_naming_the_value(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as e:
        validate(request(**kw))
    assert str(e.value) == message
    assert "\n" not in str(e.value) and isinstance(e.value, SlurmLaunchError)


def test_counts_are_checked_before_what_they_size() -> None:
    """Several things wrong: the first in validate()'s order is named (the counts, README: Limits)."""
    with pytest.raises(SpecError, match=r"^--nodes 0 is not valid"):
        validate(request(nodes=0, time="abc", mode="x", script=""))


def test_a_long_value_is_shortened_and_the_line_stays_readable() -> None:
    with pytest.raises(SpecError) as e:
        validate(request(time="9" * 5000 + "x"))
    assert len(str(e.value)) < 250 and str(e.value).startswith("--time '9999")


# --- the parsers the CLI and the API share ---------------------------------------------------------------

@pytest.mark.parametrize(("text", "expect"), [
    ("3", (3, None)), (3, (3, None)), ("2:4", (4, 2)), ("1:100000", (100000, 1)),
])
def test_parse_nodes(text: str | int, expect: tuple[int, int | None]) -> None:
    assert parse_nodes(text) == expect


@pytest.mark.parametrize(("text", "message"), [
    ("0", "--nodes 0 is not valid (expected an integer 1..100000; or MIN:MAX with --mode torchrun)"),
    ("-1", "--nodes -1 is not valid (expected an integer 1..100000; or MIN:MAX with --mode torchrun)"),
    ("100001", "--nodes 100001 is not valid (expected an integer 1..100000; or MIN:MAX with --mode torchrun)"),
    ("x", f"--nodes 'x' is not valid ({NODES_FORMS})"),
    ("a:b", f"--nodes 'a:b' is not valid ({NODES_FORMS}, each at most 100000)"),
    ("1:100001", f"--nodes '1:100001' is not valid ({NODES_FORMS}, each at most 100000)"),
    # MIN > MAX (and MIN 0) at parse time, in the line validate() gives a request that holds them
    ("4:2", "--nodes 4:2 is not valid (expected MIN:MAX with 1 <= MIN <= MAX)"),
    ("0:4", "--nodes 0:4 is not valid (expected MIN:MAX with 1 <= MIN <= MAX)"),
    ("1:0", "--nodes 1:0 is not valid (expected MIN:MAX with 1 <= MIN <= MAX)"),
])
def test_parse_nodes_refuses(text: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_nodes(text)
    assert str(e.value) == message


@pytest.mark.parametrize(("text", "expect"), [
    ("0-3", [0, 1, 2, 3]), ("1,3,5-7", [1, 3, 5, 6, 7]), ("0-15:4", [0, 4, 8, 12]), ("1,1,2", [1, 2]),
    ("7", [7]), ("4000000", [4000000]),
])
def test_parse_array(text: str, expect: list[int]) -> None:
    assert parse_array(text) == expect


@pytest.mark.parametrize(("text", "message"), [
    ("x", f"--array 'x' is not valid ({ARRAY_FORMS}; the concurrency limit is --max-parallel N)"),
    ("", f"--array '' is not valid ({ARRAY_FORMS}; the concurrency limit is --max-parallel N)"),
    ("0-3%2", f"--array '0-3%2' is not valid ({ARRAY_FORMS}; the concurrency limit is --max-parallel N)"),
    ("3-1", f"--array '3-1' is not valid ({ARRAY_FORMS}, each range from low to high)"),
    ("0-4:0", f"--array '0-4:0' is not valid ({ARRAY_FORMS}, each range from low to high)"),
    ("0-4000001",
     "--array '0-4000001' is not valid (indices go up to 4000000: Slurm's MaxArraySize may not exceed 4000001)"),
])
def test_parse_array_refuses(text: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_array(text)
    assert str(e.value) == message


def test_parse_array_counts_without_expanding() -> None:
    with pytest.raises(SpecError, match=r"^--array '0-3999999' names more than \d+ elements"):
        parse_array("0-3999999")


@pytest.mark.parametrize(("items", "expect"), [
    (["A=1"], (("A", "1"),)), (["A==b"], (("A", "=b"),)), (["A="], (("A", ""),)),
    (["_X=it's $(y)\nz"], (("_X", "it's $(y)\nz"),)),  # the value byte for byte
])
def test_parse_env(items: list[str], expect: tuple[tuple[str, str], ...]) -> None:
    assert parse_env(items) == expect


@pytest.mark.parametrize("item", ["1A=x", "NOEQ", "=x", "A B=1", "A-B=1"])
def test_parse_env_refuses(item: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_env([item])
    assert str(e.value) == (f"--env {item!r} is not valid (expected KEY=VALUE with KEY a shell variable name, "
                            f"e.g. FOO=1)")


@pytest.mark.parametrize(("items", "expect"), [
    (["lr=0.1,0.01"], (("lr", ("0.1", "0.01")),)),
    (["a.b-c=1", "seed=1,2,3"], (("a.b-c", ("1",)), ("seed", ("1", "2", "3")))),
])
def test_parse_sweep(items: list[str], expect: object) -> None:
    assert parse_sweep(items) == expect


@pytest.mark.parametrize(("items", "message"), [
    (["lr=0.1,,2"], f"--sweep 'lr=0.1,,2' is not valid ({SWEEP_FORM})"),
    (["lr"], f"--sweep 'lr' is not valid ({SWEEP_FORM})"),
    (["=1"], f"--sweep '=1' is not valid ({SWEEP_FORM})"),
    (["lr=1", "lr=2"], "--sweep lr is given twice (give all its values in one --sweep lr=V1,V2)"),
])
def test_parse_sweep_refuses(items: list[str], message: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_sweep(items)
    assert str(e.value) == message


def test_parse_sweep_bounds_the_grid_before_building_it() -> None:
    with pytest.raises(SpecError, match=r"^--sweep: the grid has more than \d+ points"):
        parse_sweep([f"k{i}=" + ",".join(str(v) for v in range(100)) for i in range(4)])


# --- Slurm's time formats ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds", "minutes"), [
    ("10", 600, 10), ("1:30", 90, 2), ("0:30", 30, 1), ("1:00:00", 3600, 60), ("2-3", 183600, 3060),
    ("2-3:04", 183840, 3064), ("2-3:04:05", 183845, 3065), ("UNLIMITED", None, None),
    # Slurm bounds no field, it adds them up (parse_time.c's time_str2secs; its own unit test reads 1:60:15
    # as 2 h 0 min 15 s): 1:99 is 1 min 99 s, rounded up to 3 min, as sbatch reads it.
    ("1:99", 159, 3), ("1:60:15", 7215, 121), ("0:60:0", 3600, 60), ("0-25", 90000, 1500),
    # a limit of 0 is no limit (sbatch: "A time limit of zero requests that no time limit be imposed")
    ("0", None, 0), ("0:00", None, 0), ("0-0:0:0", None, 0),
])
def test_time_formats(text: str, seconds: int | None, minutes: int | None) -> None:
    assert time_seconds(text) == seconds and time_minutes(text) == minutes


@pytest.mark.parametrize("text", ["x", "1:2:3:4", "1-", "-1", "1:", "10 ", "1-2-3", "10\n"])  # fullmatch, not `$`
def test_time_minutes_is_none_when_malformed(text: str) -> None:
    assert time_minutes(text) is None


@pytest.mark.parametrize("text", ["1:99", "1:60:15", "0-25:99", "0"])
def test_times_slurm_accepts_are_accepted(text: str) -> None:
    """Out-of-range fields and a limit of 0 are Slurm's own spellings (see test_time_formats), not errors."""
    assert validate(request(time=text)).resources.time == text


# --- the core is pure ---------------------------------------------------------------------------------------

# What would read the process's state or touch files.
IMPURE = {("os", "getcwd"), ("sys", "executable"), ("os", "listdir"), ("os", "stat"), ("os", "makedirs"),
          ("path", "exists"), ("path", "lexists"), ("path", "isfile"), ("path", "isdir"), ("path", "abspath"),
          ("path", "realpath"), ("shutil", "which"), ("os", "environ"), ("path", "expanduser")}
# The one exception core/__init__.py states: the per-user directories' defaults.
IMPURE_HERE = {"paths.py": {("os", "environ"), ("path", "expanduser")}}


@pytest.mark.parametrize("module", sorted(p.name for p in Path(slurmlaunch.core.__file__).parent.glob("*.py")))
def test_the_core_reads_no_process_state_and_touches_no_files(module: str) -> None:
    tree = ast.parse((Path(slurmlaunch.core.__file__).parent / module).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
            owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
            if (owner, node.attr) in IMPURE - IMPURE_HERE.get(module, set()):
                found.append(f"{owner}.{node.attr} (line {node.lineno})")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            found.append(f"open() (line {node.lineno})")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"import {n}" for n in names if n.split(".")[0] in ("shutil", "subprocess", "pathlib")]
    assert not found, f"core/{module}: {', '.join(found)}"
