"""The batch step's rules and srun's and Open MPI's words: pure decisions the batch step (allocation/batch_step.py)
takes, and the local scheduler and the Python API with it.

Which exit code a run counts as (128 + N for a signal; 128 + the warning signal is "saved, requeue me"), whether it
is requeued, which rank an abort in torch's teardown names, how srun and Open MPI word a task that ended (the
patterns the batch step reads their output with), and the one reader of the first-failure line the batch step
writes to the job's failure file (:func:`read_failure`, which the Python API's results use). Values in, values out;
:func:`read_failure` alone reads a file, the one it names. Standard library only, and light: the batch step imports
this at its start (issue 32), `re` and `signal` only where a rule needs them.
"""

from __future__ import annotations

from ..core.parse import signal_number

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


# The signals whose default action ends a process (signal(7): Term or Core), each as srun words it.
KILLING = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGKILL", "SIGUSR1",
           "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM", "SIGXCPU", "SIGXFSZ", "SIGSYS")
# Slurm's own word for a task killed by the cgroup's OOM killer (with task/cgroup), besides strsignal's "Killed".
OUT_OF_MEMORY = "Out Of Memory"
_SRUN_ERROR = "srun: error: "
_SRUN_TASKS = r"([^ :]+): tasks? ([0-9,-]+): "  # patterns, compiled (and cached) by `re` where they are used
OPENMPI_RANK = r"^ *Process name: *\[\[\d*,\d*\],(\d+)\]"
OPENMPI_CODE = r"^ *Exit code: *(\d+)"
# Open MPI's refusal to start ranks as root without both OMPI_ALLOW_RUN_AS_ROOT variables (its help-orterun.txt,
# seen from Debian's 4.1.4 here: "mpiexec has detected an attempt to run as root."; Open MPI 5's prterun says it
# in the same words): it exits 1 before any rank starts, so Open MPI names no rank.
OPENMPI_ROOT = r"^(\S+) has detected an attempt to run as root\."
ROOT_FIX = ("add --env OMPI_ALLOW_RUN_AS_ROOT=1 --env OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 to slurmlaunch submit, or "
            "submit as a user other than root")
# Open MPI's word on a rank a signal ended (its help-orterun.txt): "mpiexec noticed that process rank 0 with PID
# 0 on node node1 exited on signal 10 (User defined signal 1)." It names the first such rank only.
OPENMPI_SIGNAL = r"noticed that process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)"
# Open MPI's word on a host whose daemon (orted) it lost, the host down or its processes killed (its
# help-errmgr-base.txt [node-died]: "ORTE has lost communication with a remote daemon." ... "Remote daemon:
# [[J,0],1] on node node2"): the ranks there are gone with it, and it names none of them.
OPENMPI_LOST = r"^ *Remote daemon: *\S+ on node (\S+)"


def signal_words() -> dict[str, tuple[int, str]]:
    """How srun words a task killed by a signal (strsignal's description: "Killed", "Segmentation fault"):
    the exit code it counts as (128 + N) and what the failure line says."""
    from signal import Signals, strsignal

    words = {strsignal(s) or s.name: (128 + s.value, f"killed by {s.name}") for s in map(Signals.__getitem__, KILLING)}
    words[OUT_OF_MEMORY] = (128 + Signals.SIGKILL.value, "killed by SIGKILL: out of memory")
    return words


def warning_fix(name: str, requeue: bool) -> str:
    """What to do when the ranks died of the warning signal SIG``name`` (the local scheduler says the same)."""
    number = signal_number(name)
    return (f"the script does not handle it, so nothing was saved{' and the job is not requeued' if requeue else ''}. "
            f"Fix: handle SIG{name} in the script (save a checkpoint, exit {128 + number}; see "
            f"examples/checkpoint_requeue.py), or ask for the signal it handles (--signal USR1@90 for Lightning), "
            f"or --signal none")


def warning_code(name: str) -> int:
    """The exit code that says "saved, requeue me" for the warning signal SIG``name``: 128 + its number."""
    return 128 + signal_number(name)


def wants_requeue(warned: bool, code: int, killed: bool, asked: int) -> bool:
    """The requeue rule: a run that got the warning and did not finish, or whose ranks exited with ``asked``
    (128 + the warning signal) after saving a checkpoint; not one whose ranks died of the signal (``killed``:
    no handler, nothing saved), nor one that finished (exit 0) after the warning."""
    return not killed and ((warned and code != 0) or code == asked)


def keeps_asked_code(recorded: int | None, asked: int, aborted_first: bool) -> bool:
    """The teardown-abort rule: a rank that torch's teardown killed by SIGABRT after its script exited with
    ``asked`` (128 + the warning signal; ``recorded``: the RUNNER's exit mark) keeps that code when its abort
    is the first failure (``aborted_first``): the request is not lost to the abort."""
    return aborted_first and recorded == asked


def asked_abort_message(rank: int, code: int) -> str:
    return (f"rank {rank} aborted in torch's teardown after the script exited {code} (docs: Debugging, 'Teardown "
            f"aborts'); the job counts as exit code {code}")


def stopped_line(who: str, code: int, text: str, others: str, first: bool = True) -> str:
    """The first failure when slurmlaunch stopped the rank itself (``who``: "rank 3 on node2")."""
    return f"{who} failed{' first' if first else ''} with exit code {code} (stopped by slurmlaunch: {text}){others}"



def srun_first(lines: Sequence[str], skip: str) -> tuple[str, str, int, str] | None:
    """srun's first word on a task that ended, as (node, tasks, code, how): "node2: task 2: Exited with exit
    code 7", or for a task killed by a signal its description ("node2: task 2: Killed"). The others' words come
    after srun stopped them; the warning signal's description (``skip``) is left to the warning's rule."""
    import re

    words = signal_words()
    for line in lines:
        if not line.startswith(_SRUN_ERROR):
            continue
        text = line[len(_SRUN_ERROR):].removesuffix(" (core dumped)")
        m = re.match(_SRUN_TASKS, text)
        if not m:
            continue
        what = text[m.end():]
        exited = re.fullmatch(r"Exited with exit code (\d+)", what)
        if exited:
            return m[1], m[2], int(exited[1]), ""
        if what in words and what != skip:
            return m[1], m[2], *words[what]
    return None


# The first-failure line as Step.finish writes it to the job's failure file (first_failure, stopped_line): the
# ranks (a range or list under srun: "rank(s) 0-1"), their node, the job's code, and in parentheses how.
_FAILURE_LINE = (r"^slurmlaunch: ranks?(?:\(s\))? ([0-9,-]+) on (\S+) failed(?: first)? with exit code (\d+)"
                 r"(?: \((.*?)\))?(?:;|$)")


def read_failure(path: str) -> tuple[list[int], str, int, str] | None:
    """The first failure the batch step wrote to the job's failure file ``path``, read back in its own words:
    (the ranks, their node, the exit code as a shell has it (128 + N for signal N), how ("killed by SIGSEGV",
    "stopped by slurmlaunch: ..."), "" when it said nothing more); None when there is none or it names no rank
    (torchrun's node task, Open MPI's refusal to run as root, the warning signal's line)."""
    import re

    try:
        with open(path, "rb") as f:
            text = f.read(1 << 16).decode("utf-8", errors="replace")
    except OSError:
        return None
    m = re.match(_FAILURE_LINE, text.strip().splitlines()[0] if text.strip() else "")
    if m is None:
        return None
    ranks: list[int] = []
    for part in m[1].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (high.isdigit() or not high):
            ranks.extend(range(int(low), int(high or low) + 1))
    return ranks, m[2], int(m[3]), m[4] or ""


def srun_killed_by(lines: Sequence[str], description: str) -> str:
    """The tasks srun says ``description`` (a signal's words) ended, as "task 0 on node1, tasks 2-3 on node2"."""
    found = []
    for line in lines:
        if line.startswith(_SRUN_ERROR):
            text = line[len(_SRUN_ERROR):].removesuffix(" (core dumped)")
            if text.endswith(": " + description):
                node, _, tasks = text[: -len(description) - 2].partition(": ")
                found.append(f"{tasks} on {node}")
    return ", ".join(found)


def openmpi_signalled(lines: Sequence[str]) -> tuple[int, str, int] | None:
    """The rank Open MPI says a signal ended, as (rank, host, signal number); None when it says none."""
    import re

    for line in lines:
        m = re.search(OPENMPI_SIGNAL, line)
        if m:
            return int(m[1]), m[2], int(m[3])
    return None


def srun_aborted(lines: Sequence[str]) -> list[int]:
    """The ranks srun says SIGABRT ended ("node1: tasks 0-1,3: Aborted")."""
    import re

    ranks: set[int] = set()
    for line in lines:
        m = re.match(r"srun: error: [^ :]*: tasks? ([0-9,-]*): Aborted", line)
        for part in (m[1].split(",") if m else []):
            low, _, high = part.partition("-")
            if low.isdigit():
                ranks.update(range(int(low), int(high or low) + 1))
    return sorted(ranks)


_PBS_ID = r"\d+(\.[\w.-]+)?"


def pbs_id(text: str) -> bool:
    """Whether ``text`` is a PBS job id (1234, or 1234.server)."""
    import re

    return re.fullmatch(_PBS_ID, text) is not None


def ranks_word(low: int, high: int) -> str:
    return f"rank {low}" if low == high else f"ranks {low}-{high}"
