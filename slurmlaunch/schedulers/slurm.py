"""Slurm: render the sbatch script, submit it, ask for its state, cancel it."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import time
from collections.abc import Sequence

from ..core.errors import SchedulerError, SpecError
from ..core.hostlist import expand
from ..core.jobfiles import JobFiles
from ..core.spec import GPU_FLAGS, SRUN_MPI_TYPES, JobSpec
from ..render.slurm_script import file_tag
from ..render.slurm_script import render_script as render_script  # the edge renders what it submits
from . import Held, JobStatus, Submission, array_outcome, current_umask, is_final, rank_log, run_command, submit_with
from .interface import QueuedEdge, QuickStates
from .runner import read_file, which
from .support import Refusals

# What Slurm cannot carry out (schedulers/support.py): PBS's own options.
REFUSALS = Refusals(
    not_carried_out={
        "pbs_flavour": "it is for PBS (leave it out, or --scheduler pbs)",
        "pbs_resources": "it is a PBS site resource (leave it out, or --scheduler pbs)",
        "pbs_chunk": "it is a PBS select-chunk resource (leave it out, or --scheduler pbs)",
        "project": "it is PBS's -P project (leave it out; --account is the account charged)",
        "pbs_request": "it chooses how a PBS job asks for resources (leave it out, or --scheduler pbs)",
        "pbs_queues": "it chooses a PBS queue by node count (leave it out; --partition chooses the partition)",
        "mpiexec_args": "under Slurm srun starts the ranks (leave it out, or --scheduler pbs)",
    },
    values={"mpi": (SRUN_MPI_TYPES, "srun's --mpi plugin type")},
)


SCRIPT_SUFFIX = "sbatch"


def available() -> bool:
    return shutil.which("sbatch") is not None


def controller_answers(timeout: float = 10.0) -> tuple[bool, str]:
    """Whether a Slurm controller answers `scontrol ping` (an installed client alone is no cluster)."""
    try:
        out = run_command(["scontrol", "ping"], timeout=timeout).stdout
    except SchedulerError as e:
        return False, str(e)
    return "UP" in out, out.strip()


# What every Slurm client says when it finds no configuration at all: no SLURM_CONF, no slurm.conf at the
# compiled-in path, no configless cache (/run/slurm/conf), no SLURM_CONF_SERVER, and no DNS SRV record
# _slurmctld._tcp (read_config.c's order). "DNS SRV lookup failed": no record, as opposed to a configless
# site whose record names a controller that does not answer (then only "failed to fetch config").
_NO_CONFIG = ("Could not establish a configuration source", "DNS SRV lookup failed")


def cluster_configured(ping_output: str) -> bool:
    """Whether `scontrol ping`'s output (or the error it failed with) shows a configured Slurm cluster: every
    answer except the client's own "no configuration source at all" does, a silent controller included."""
    return not all(words in ping_output for words in _NO_CONFIG)


def auto_check() -> tuple[bool, str]:
    """--scheduler auto with sbatch on PATH: Slurm where a controller answers `scontrol ping`; not where no
    cluster is configured (an installed client alone); SchedulerError where one is configured and its
    controller is silent: never run a cluster's job on the submitting host (a login node) because its
    controller blinked."""
    up, said = controller_answers()
    if up:
        return True, "slurmctld answers"
    if cluster_configured(said):
        raise SchedulerError(
            f"--scheduler auto: a Slurm cluster is configured here{_conf_shown()} but its controller does "
            f"not answer ({_first_words(said)}); nothing was run: retry when "
            f"`scontrol ping` says UP, or pass --scheduler local to run on this machine")
    return False, "no Slurm cluster is configured here"


def _conf_shown() -> str:
    conf = os.environ.get("SLURM_CONF")
    return f" (SLURM_CONF={conf})" if conf else ""


def _first_words(said: str) -> str:
    """scontrol's answer without its banner of asterisks ("RESTORE SLURMCTLD DAEMON TO SERVICE")."""
    parts = [p.strip() for p in re.split(r"\n| \| ", said)]
    return " | ".join(p for p in parts if any(c.isalnum() for c in p) and "RESTORE SLURMCTLD" not in p) or "no output"


# A token of ours in every job's comment: after sbatch failed without Slurm's answer (a stalled controller
# takes the job once it wakes up), squeue finds the job by it. The comment, not the name (the user's, shown
# everywhere) nor --wckey (ignored unless the site sets TrackWCKey): squeue shows every user's job's comment
# (%k) whatever the site's configuration, for MinJobAge seconds after its end.
TOKEN_MARK = "slurmlaunch-submit:"
TOKEN_SHOWN = "TOKEN"  # what --dry-run shows in its place: each submission draws its own
LOOKUP_S = 60.0  # how long a failed submission waits for the controller to say whether it took the job
_NO_ANSWER = ("timed out", "Unable to contact", "connect failure", "Zero Bytes were transmitted", "no answer within",
              "Connection refused", "Connection reset", "Communication connection failure")


def new_token() -> str:
    return secrets.token_hex(8)


def sbatch_command(spec: JobSpec, script_path: str, token: str = TOKEN_SHOWN) -> list[str]:
    # sbatch's command line beats the script's #SBATCH lines: a --comment the user gave keeps its words
    given = next((a.partition("=")[2] for a in reversed(spec.site.sbatch_args) if a.startswith("--comment=")), "")
    return [
        "sbatch", "--parsable",
        f"--job-name={spec.name}",
        f"--output={JobFiles(spec.log_dir, file_tag(spec)).batch_log}",
        f"--chdir={spec.program.workdir}",
        f"--comment={given + ' ' if given else ''}{TOKEN_MARK}{token}",
        script_path,
    ]


def find_by_token(token: str) -> str | None:
    """The id of this user's job whose comment carries ``token`` (squeue knows ended jobs MinJobAge seconds
    more), or None; SchedulerError when the controller does not answer."""
    out = run_command(["squeue", "-h", "--me", "-t", "all", "-o", "%F|%k"], timeout=30).stdout
    for line in out.splitlines():
        job_id, _, comment = line.partition("|")
        if f"{TOKEN_MARK}{token}" in comment.split() and job_id.isdigit():
            return job_id
    return None


def accepted_after(error: SchedulerError, token: str, poll: float = 2.0) -> tuple[str, str] | None:
    """After sbatch failed: the job Slurm accepted all the same (its id, and a line saying so), or None
    where Slurm refused it or twice answered that it has no job with ``token`` (a stalled controller may
    still take a request it read before it answers the first squeue). SchedulerError naming the token when
    the controller stays silent for LOOKUP_S seconds."""
    said = str(error)
    bound = LOOKUP_S
    if not any(words in said for words in _NO_ANSWER):
        return None  # Slurm's own answer (Invalid partition, ...): nothing was queued
    deadline = time.monotonic() + bound
    misses = 0
    last = said
    while True:
        try:
            job_id = find_by_token(token)
        except SchedulerError as e:
            last = str(e)
        else:
            if job_id is not None:
                return job_id, (f"sbatch failed ({said}), but Slurm accepted the job all the same: it is job "
                                f"{job_id} (found by its comment {TOKEN_MARK}{token})")
            misses += 1
            if misses == 2:
                return None
        if time.monotonic() + poll > deadline:
            raise SchedulerError(
                f"{said}; whether Slurm accepted the job cannot be known: its controller did not answer for "
                f"{bound:.0f}s (last: {last}); before submitting again, look for it with: squeue --me -t all "
                f"-o '%i %k' | grep {TOKEN_MARK}{token}")
        time.sleep(poll)


def parse_job_id(out: str) -> str | None:
    """The job id in what sbatch --parsable printed ("1234" or "1234;cluster"), or None."""
    job_id = out.split(";")[0]
    return job_id if job_id.isdigit() else None


def command_id(out: str) -> str:
    """1234;cluster is 1234 to squeue and scancel."""
    return parse_job_id(out) or out


def mpi_plugins(listing: str) -> list[str]:
    """The --mpi types in what `srun --mpi=list` printed: the plugin names (one per indented line) and the
    versioned ones of its "specific pmix plugin versions available: pmix_v4,..." line."""
    names = []
    for line in listing.splitlines():
        if line[:1] in (" ", "\t") and line.strip():
            names.append(line.strip())
        elif "versions available:" in line:
            names += [v.strip() for v in re.split(r"[,\s]+", line.split("available:", 1)[1]) if v.strip()]
    return names


def check_mpi_plugin(mpi: str) -> None:
    """SpecError when this cluster's srun has no mpi plugin ``mpi`` (else the job would wait in the queue to fail
    at its step); when `srun --mpi=list` itself fails, the step decides."""
    try:
        listing = run_command(["srun", "--mpi=list"], timeout=30)
    except SchedulerError:
        return
    found = mpi_plugins(listing.stdout + listing.stderr)
    if found and mpi not in found:
        raise SpecError(f"--mpi {mpi}: this cluster's srun has no such mpi plugin (expected one of "
                        f"{', '.join(found)}, as `srun --mpi=list` shows)")


def submit(spec: JobSpec, script_text: str) -> Submission:
    """Save the script beside the logs, sbatch it, and keep a record; SchedulerError when Slurm refuses,
    SpecError (nothing submitted) when --mpi names a plugin this cluster's srun lacks. When sbatch fails
    without Slurm's answer, the job is looked up by its token before failing: a job the controller took
    after all is recorded, never left to run unknown (a retry would run it twice)."""
    if spec.launch.mpi is not None:
        check_mpi_plugin(spec.launch.mpi)
    token = new_token()
    return submit_with(spec, script_text, "slurm", SCRIPT_SUFFIX, lambda s, path: sbatch_command(s, path, token),
                       parse_job_id, lambda error: accepted_after(error, token), held=HELD, command_id=command_id)


# How a submission is held until its record and files are in place: a begin time ahead, not --hold: Slurm
# skips its check of the request against the nodes for a held job (seen on 22.05: `sbatch --hold
# --gres=gpu:8` on nodes of 2 is taken, and would wait forever), not for one that is to begin later (sbatch
# refuses it as it would refuse it now); and `scontrol hold` + `release` leaves a begin time as it was. Minutes,
# not an hour: where Slurm refuses to move the begin time to now, the job waits no longer than this, and what
# must be in place before it may start (the batch log, its --output) is made first, in seconds.
HOLD_S = 300
HOLD = f"--begin=now+{HOLD_S}"


def _users_own_start(spec: JobSpec) -> bool:
    """Whether the user's --sbatch-arg holds the job or sets its begin time: then it is theirs to release."""
    return any(arg.split("=", 1)[0] in ("--hold", "-H", "--begin", "-b") for arg in spec.site.sbatch_args)


def _hold(spec: JobSpec, command: list[str]) -> list[str]:
    return command if _users_own_start(spec) else [*command[:-1], HOLD, command[-1]]


def cluster() -> dict[str, str]:
    """Which cluster this is: its ClusterName and its controller (the first SlurmctldHost and SlurmctldPort), as
    `scontrol show config` says; {} where it cannot be asked."""
    try:
        out = run_command(["scontrol", "show", "config"], timeout=30).stdout
    except SchedulerError:
        return {}
    fields = dict(re.findall(r"^(ClusterName|SlurmctldHost\[0\]|SlurmctldPort)\s*=\s*(\S+)", out, re.M))
    found = {"name": fields.get("ClusterName", ""),
             "controller": f"{fields.get('SlurmctldHost[0]', '')}:{fields.get('SlurmctldPort', '')}"}
    return found if any(found.values()) else {}


_TOKEN_IN = re.compile(rf"{TOKEN_MARK}([0-9a-f]+)(?:\||$)")


def identity(job_id: str) -> dict[str, str] | None:
    """What Slurm says of job ``job_id`` that a later job given the same id (another cluster, a cluster started
    again) cannot share: its submit time and name, and while squeue knows it the submission's token in its
    comment ("comment": "" for a job that has none: not one of ours); sacct's submit time and name after
    that, with every run's submit time ("submits": a requeued job's first run is the submitted one); None when
    Slurm knows no such job. SchedulerError, naming the command and its error, when Slurm cannot be asked
    (a controller or slurmdbd that does not answer is no answer that the job is gone)."""
    try:
        lines = run_command(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%V|%k|%j"]).stdout.splitlines()
    except SchedulerError as e:
        if "Invalid job id" not in str(e):
            raise
        lines = []  # squeue forgets a job MinJobAge seconds after it ended
    line = next((ln for ln in lines if ln.count("|") >= 2), "")
    if line:
        submitted, _, rest = line.partition("|")
        found = _TOKEN_IN.search(rest)
        name = rest[found.end():] if found else rest.rpartition("|")[2]
        return {"submitted": submitted, "name": name, "comment": found[1] if found else ""}
    if not which("sacct"):
        return None
    try:
        # -D: a requeued job's every run, each with the submit time its requeue gave it
        out = run_command(["sacct", "-n", "-X", "-D", "-P", "-j", job_id, "-o", "Submit,JobName"],
                          timeout=SACCT_S).stdout
    except SchedulerError as e:
        if no_accounting(str(e)):
            return None  # no accounting: squeue's word is the last, and it no longer knows the job
        raise
    runs = [ln.partition("|")[::2] for ln in out.splitlines() if "|" in ln]
    if not runs:
        return None
    submitted, name = runs[-1]
    return {"submitted": submitted, "name": name, "submits": " ".join(at for at, _ in runs)}


# How long sacct may take: it asks slurmdbd, which asks its database. sacct itself waits MessageTimeout + 35 s
# for each answer of slurmdbd (Slurm's dbd_conn.c: 45 s at Slurm's default MessageTimeout=10, 40 s on the dev
# cluster), then fails with its own error; a bound of 30 s here cut a slow but working sacct short on a loaded
# machine (seen: "gone" in a CI run). 60 s: sacct's own bound comes first where MessageTimeout <= 25 s.
SACCT_S = 60.0
# What sacct says where the cluster keeps no accounting: a lasting fact, unlike a slurmdbd that does not answer.
_NO_ACCOUNTING = ("accounting storage is disabled",)


def no_accounting(error: str) -> bool:
    """Whether sacct's failure ``error`` says the cluster keeps no accounting (then a job squeue forgot is
    forgotten for good), rather than that slurmdbd could not be asked now."""
    return any(words in error for words in _NO_ACCOUNTING)


def prepare(spec: JobSpec, job_id: str, short: str, log_dir: str) -> None:
    """Before the held job may start: its batch log(s) created new here (O_EXCL|O_NOFOLLOW: slurmd opens the
    file following links, so nothing planted is written through), and where the job's files are in a directory
    of their own, sbatch's --output pointed there."""
    files = JobFiles(log_dir, short)
    logs = [files.element(i).batch_log for i in spec.array_indices] if spec.is_array else [files.batch_log]
    mode = 0o666 & ~(current_umask() | 0o022)
    for path in logs:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode))
    if log_dir != spec.log_dir:
        run_command(["scontrol", "update", f"JobId={job_id}",
                     f"StdOut={JobFiles(log_dir, file_tag(spec)).batch_log}"], timeout=30)


def release(spec: JobSpec, job_id: str) -> None:
    """Let the held job go (its begin time now), unless the user's --sbatch-arg holds it or sets its begin
    time. SchedulerError where Slurm refuses (a job its partition cannot run now may be refused), saying when
    the job begins all the same: the submission keeps the job and says this in its note."""
    if _users_own_start(spec):
        return
    try:
        run_command(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], timeout=30)
    except SchedulerError as e:
        raise SchedulerError(f"{e}; it may begin within {HOLD_S // 60} minutes of its submission, or at once "
                             f"after `scontrol update JobId={job_id} StartTime=now`") from None


# A job neither squeue, sacct nor scontrol knows, whose script wrote no exit code: it has ended (Slurm forgets a
# job MinJobAge seconds after its end), how is not known.
ENDED = "ENDED"
FORGOTTEN = ("Slurm no longer knows the job and has no accounting of it, and no exit-code file of its batch script "
             "was found: how it ended is unknown")
_FIELD = re.compile(r"\b(JobState|ExitCode|NodeList|RunTime)=(\S+)")


def status(job_id: str, log_dir: str | None = None) -> JobStatus:
    """squeue while the job is known to it; after that sacct where accounting exists, else scontrol (which
    forgets the job MinJobAge seconds after it ended). The exit code comes from the file the batch script
    writes at its end (the first failing rank's, exact even without accounting), else from Slurm's ExitCode."""
    try:
        line = run_command(["squeue", "-h", "-j", job_id, "-o", "%T %M %N %r"], timeout=30).stdout.strip()
    except SchedulerError as e:
        if "Invalid job id" not in str(e):
            raise
        line = ""  # squeue forgets a job MinJobAge seconds after it ended
    if line:
        state, _, rest = line.partition(" ")
        elapsed, _, rest = rest.partition(" ")
        nodes, _, reason = rest.partition(" ")  # no nodes yet: two spaces; the reason may have spaces
        if not is_final(state):
            return JobStatus(state, None, nodes or None, elapsed=elapsed or None,
                             note=_live_note(job_id, state, nodes, reason.strip()))
    unasked: SchedulerError | None = None
    try:
        fields = _accounting(job_id)
    except SchedulerError as e:
        fields, unasked = {}, e
    fields = fields or _scontrol(job_id)
    code: int | None = None
    if log_dir:
        code = _exit_code(JobFiles(log_dir, job_id).exit_code)
    if not fields and code is None:
        if unasked is not None:  # not "Slurm no longer knows it": its accounting could not be asked
            raise SchedulerError(f"how job {job_id} ended cannot be told now: squeue no longer shows it and "
                                 f"sacct could not be asked ({unasked})")
        return JobStatus(ENDED, None, note=FORGOTTEN)
    state = fields.get("JobState") or ("COMPLETED" if code == 0 else "FAILED")
    if code is None and "ExitCode" in fields:
        status_code, _, signal = fields["ExitCode"].partition(":")
        code = int(status_code) if status_code.isdigit() else None
        if code == 0 and signal.isdigit() and int(signal):
            code = 128 + int(signal)
    if code is None or (code == 0 and state != "COMPLETED"):
        code = 0 if state == "COMPLETED" else 1
    assigned = fields.get("NodeList")
    return JobStatus(state, code, assigned if assigned not in (None, "None assigned", "(null)") else None,
                     elapsed=fields.get("Elapsed"))


# The states in which a job holds nodes whose loss matters to it (its step daemons run there).
_ON_NODES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"})
_NO_REASON = ("", "None", "(null)")


def _live_note(job_id: str, state: str, nodes: str, reason: str) -> str | None:
    """Slurm's word on a live job, or None: its nodes that are not healthy (not responding, down, drained,
    failing: sinfo's state and reason), a requeue and what ended the run before it (sacct's NODE_FAIL), and
    squeue's reason for a waiting job. Questions Slurm cannot answer now leave their part out."""
    parts: list[str] = []
    if state == "PENDING":
        ended, nodes = _requeued(job_id)
        if ended:
            parts.append(f"Slurm requeued it after {ended}" + (f" of its run on {nodes}" if nodes else ""))
    if reason not in _NO_REASON:
        parts.append(f"Slurm's reason: {reason}")
    if nodes and (state in _ON_NODES or parts):
        parts += _node_trouble(nodes)
    return "; ".join(parts) or None


def _requeued(job_id: str) -> tuple[str | None, str]:
    """How the job's last run ended and on which nodes, where Slurm requeued it (sacct lists each run of a
    requeued job with -D); (None, "") where it was not, or there is no accounting."""
    if not which("sacct"):
        return None, ""
    try:
        out = run_command(["sacct", "-n", "-X", "-P", "-D", "-j", job_id, "-o", "State,NodeList"], timeout=30).stdout
    except SchedulerError:
        return None, ""
    runs = [line.split("|") for line in out.splitlines() if line.count("|") == 1]
    ended = [(state.split()[0], nodes) for state, nodes in runs[:-1] if state and is_final(state.split()[0])]
    return ended[-1] if ended else (None, "")


def _node_trouble(nodes: str) -> list[str]:
    """What sinfo says of each of ``nodes`` that is not healthy: "node2 not responding", "node2 down (Not
    responding)". A node whose state ends in "*" has not answered the controller's last ping."""
    try:
        out = run_command(["sinfo", "-h", "-N", "-n", nodes, "-o", "%N|%T|%E"], timeout=30).stdout
    except SchedulerError:
        return []
    said: dict[str, str] = {}
    for line in out.splitlines():
        name, _, rest = line.partition("|")
        state, _, why = rest.partition("|")
        words = state.rstrip("*~#!%$@^-").replace("+", " ").split()
        trouble = [w for w in words if w in ("down", "drained", "draining", "fail", "failing", "unknown")]
        if state.endswith("*") and not trouble:
            trouble = ["not responding"]
        if trouble and name not in said:
            said[name] = f"{name} {' and '.join(trouble)}" + (f" ({why})" if why not in _NO_REASON + ("none",) else "")
    return list(said.values())


def _exit_code(path: str) -> int | None:
    """The code in the exit-code file the batch script wrote (read where the job ran: through the runner)."""
    text = read_file(path, limit=64)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _accounting(job_id: str) -> dict[str, str]:
    """The job's line from sacct, or {} where there is no accounting (or it does not know the job yet);
    SchedulerError where sacct could not be asked (slurmdbd does not answer, sacct timed out)."""
    if not which("sacct"):
        return {}
    try:
        out = run_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,Elapsed,NodeList,ExitCode"],
                          timeout=SACCT_S).stdout
    except SchedulerError as e:
        if no_accounting(str(e)):
            return {}
        raise
    line = next((ln for ln in out.splitlines() if ln.count("|") == 3), "")
    if not line:
        return {}
    state, elapsed, nodes, exit_code = line.split("|")
    # "CANCELLED by 0" -> CANCELLED; elapsed [D-]HH:MM:SS
    return {"JobState": state.split()[0], "Elapsed": elapsed, "NodeList": nodes, "ExitCode": exit_code}


def accounted_states(job_ids: list[str]) -> dict[str, str]:
    """sacct's state of each of ``job_ids`` (plain jobs or job arrays), in one call: job id -> its state word
    (CANCELLED of "CANCELLED by 1000"); an array is COMPLETED when every element is, else the state of its
    first element (by index) that is not. {} where there is no accounting; a job sacct does not know is left
    out."""
    if not job_ids or not which("sacct"):
        return {}
    try:
        out = run_command(["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,State"],
                          timeout=30).stdout
    except SchedulerError:
        return {}  # "Slurm accounting storage is disabled", or slurmdbd is down
    elements: dict[str, list[tuple[int, str]]] = {}
    for line in out.splitlines():
        tag, sep, state = line.partition("|")
        base, _, index = tag.partition("_")
        if sep and base in job_ids and state.split():
            # an element's index, or a range of elements never started ("[3-5]"): after the started ones
            elements.setdefault(base, []).append((int(index) if index.isdigit() else 1 << 62, state.split()[0]))
    out_states: dict[str, str] = {}
    for base, states in elements.items():
        states.sort()
        unfinished = [state for _, state in states if state != "COMPLETED"]
        out_states[base] = unfinished[0] if unfinished else "COMPLETED"
    return out_states


def _scontrol(job_id: str) -> dict[str, str]:
    try:
        shown = run_command(["scontrol", "show", "job", "-o", job_id], timeout=30).stdout
    except SchedulerError:
        return {}  # the record is gone after MinJobAge; the exit-code file is all there is
    # JobName, free text that could read "JobState=...", comes before UserId; the fields we want after.
    fields = dict(reversed(_FIELD.findall(shown.split(" UserId=", 1)[-1])))
    if "RunTime" in fields:
        fields["Elapsed"] = fields.pop("RunTime")
    return fields


def array_status(job_id: str, log_dir: str, indices: list[int]) -> JobStatus:
    """A job array as one job: running while any element is, then FAILED with the first failing element's
    exit code (in index order), or COMPLETED. ``elements`` maps each index to "STATE" or "STATE CODE"."""
    try:
        lines = run_command(["squeue", "-h", "-r", "-j", job_id, "-o", "%i %T %N"], timeout=30).stdout.split("\n")
    except SchedulerError as e:
        if "Invalid job id" not in str(e):
            raise
        lines = []
    live: dict[int, tuple[str, str]] = {}
    for line in lines:
        tag, _, rest = line.strip().partition(" ")
        state, _, nodes = rest.partition(" ")
        index = tag.rpartition("_")[2]
        if index.isdigit() and state and not is_final(state):
            live[int(index)] = (state, nodes)
    return array_outcome(job_id, log_dir, indices, live, {}, "cancelled or timed out")


def cancel(job_id: str) -> None:
    run_command(["scancel", job_id], timeout=30)


def queue_lines(job_ids: Sequence[str], fields: str, timeout: float = 60.0) -> list[str] | None:
    """squeue -t all's lines (``fields``: its -o format) for ``job_ids``, ended jobs included while slurmctld
    keeps them (MinJobAge); [] when squeue knows none of them ("Invalid job id"), None when it could not be
    asked."""
    try:
        out = run_command(["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", fields], timeout=timeout)
    except SchedulerError as e:
        return [] if "Invalid job id" in str(e) else None
    return out.stdout.splitlines()


def queue_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """squeue -t all's state of each of ``job_ids`` that slurmctld still knows (an ended one until MinJobAge),
    in one call; None when squeue could not be asked (the Python API's early end, app/api/job.py)."""
    lines = queue_lines(job_ids, "%i %T")
    if lines is None:
        return None
    pairs = (line.split(None, 1) for line in lines)
    return {pair[0]: pair[1].strip() for pair in pairs if len(pair) == 2}


def quick_states(job_ids: Sequence[str] | None) -> QuickStates:
    """`list`'s states: this user's queued and running jobs in one `squeue --me` (SchedulerError when it
    fails), and the ended ones in one sacct where there is accounting: of ``job_ids`` that squeue no longer
    shows (an array's state as :func:`accounted_states` sums it up), or with None, every job of the last 30
    days."""
    out = run_command(["squeue", "-h", "--me", "-o", "%F|%T|%V|%k"], timeout=30).stdout
    rows = [(line.split("|", 3) + ["", ""])[:4] for line in out.splitlines() if "|" in line]
    live = {job: state for job, state, _, _ in rows}
    seen = {job: _queue_identity(at, comment) for job, _, at, comment in rows if at}
    if job_ids is not None:
        return QuickStates(live, accounted_states([j for j in job_ids if j not in live]), seen)
    ended = ""
    if which("sacct"):
        try:
            ended = run_command(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,State", "-S", "now-30days"],
                                timeout=30).stdout
        except SchedulerError:
            pass  # no accounting there: the queue alone
    return QuickStates(live, {job: state.split()[0] for job, _, state in (line.partition("|") for line in
                                                                          ended.splitlines()) if state.strip()},
                       seen)


def _queue_identity(submitted: str, comment: str) -> dict[str, str]:
    """A live job's identity from squeue's submit time and comment (:func:`identity`'s fields)."""
    found = _TOKEN_IN.search(comment)
    return {"submitted": submitted, "comment": found[1] if found else ""}


def _rank_log(spec: JobSpec, job_id: str, rank: int) -> str | None:
    return None if spec.is_array else rank_log(spec, job_id, rank)  # srun writes one file per rank


def _batch_log(spec: JobSpec, job_id: str) -> str | None:
    return None if spec.is_array else JobFiles(spec.log_dir, job_id).batch_log


def _output_log(log_dir: str, job: str, printed_id: str) -> str:
    return JobFiles(log_dir, job).batch_log  # the batch script's own output (sbatch --output)


def node_commands(job_id: str, nodes: str, argv: Sequence[str]) -> dict[str, list[str]]:
    """A step of one task on each node of the running job, sharing the ranks' resources (--overlap, Slurm
    20.11+): it runs in the job's cgroup, as the job's user, so it may signal the ranks there."""
    return {node: ["srun", "--overlap", f"--jobid={job_id}", f"--nodelist={node}", "--nodes=1", "--ntasks=1",
                   "--quiet", *argv] for node in expand(nodes)}


HELD = Held(hold=_hold, cluster=cluster, identity=identity, prepare=prepare, release=release, cancel=cancel)

# The slurm edge as a Scheduler (schedulers.interface)
EDGE = QueuedEdge(
    name="slurm", title="Slurm", client="sbatch", readers=("read_slurm",), refusals=REFUSALS,
    script_suffix=SCRIPT_SUFFIX, is_available=available, check_auto=auto_check, render_script=render_script,
    submit_script_command=sbatch_command, submit_script=submit, parse_id=parse_job_id, job_status=status,
    array_status=array_status, cancel_job=cancel, rank_log_of=_rank_log, batch_log_of=_batch_log,
    output_log_of=_output_log, node_commands_of=node_commands, quick_states_of=quick_states,
    queue_states_of=queue_states,
    command_id_of=command_id, identity_of=identity, cluster_of=cluster,
    rank_requeue="scontrol requeue",  # Lightning's rank 0 runs it itself (app/submit.py adapt_to_client)
    gpu_request_styles=GPU_FLAGS,  # --gpus-per-node or --gres, as `slurmlaunch doctor` found the cluster wants
    submitit_executor="slurm",
    doctor_checks="command",  # app/doctor/command.py: the controller, the partitions, the GPU request style
)
