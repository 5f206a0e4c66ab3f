"""`slurmlaunch run`: torchrun's (and torch.distributed.launch's) flags on machines without a scheduler.

Each node runs `slurmlaunch run --nnodes N --node-rank K --master-addr A ...`; it starts M local ranks,
each through `slurmlaunch launch` (same mapping, checks and exec), under the supervisor the local
scheduler uses. The classic traps become one-line refusals before anything starts.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping

from ..allocation.net import HeldPort, all_loopback, bindable, holds_connection, resolve, wait_listening
from ..allocation.reasons import RDZV_TIMEOUT
from ..core.distenv import check_master_addr
from ..core.errors import SpecError
from ..core.limits import MAX_NODES, MAX_PER_NODE, Count, Seconds, bounded_int, parse_count, shown
from ..core.rdzv import RDZV_TIMEOUT_VAR, parse_rendezvous_timeout

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: every argparse command imports this module
    from typing import Any

DEFAULT_PORT = 29500  # torchrun's
DEFAULT_MASTER_TIMEOUT = 300.0  # seconds, --master-timeout

# torchrun's flags that `run` does not carry out, each with what to use instead (docs: slurmlaunch run). Kept
# in step with `python -m torch.distributed.run --help` by tests/app/test_everyday.py. (flags, takes a value, advice)
REFUSED: tuple[tuple[tuple[str, ...], bool, str], ...] = (
    (("--max-restarts", "--max_restarts"), True,
     "restarts need torchrun's agent: use `slurmlaunch submit --mode torchrun --max-restarts N`, or torchrun itself"),
    (("--rdzv-conf", "--rdzv_conf"), True,
     "the rendezvous is static (env://): use --master-timeout SECONDS for how long the ranks wait for the master"),
    (("--event-log-handler", "--event_log_handler"), True,
     "there is no elastic agent to log events; drop the flag, or use torchrun itself"),
    (("--role",), True, "every rank has torchrun's default role; drop the flag"),
    (("--run-path", "--run_path"), False,
     "each rank is its own `python SCRIPT` process; drop the flag (-m for a module)"),
    (("-r", "--redirects"), True,
     "use --log-dir LOG_DIR: every rank's output goes to LOG_DIR/rank-N.log and, prefixed, to the terminal"),
    (("-t", "--tee"), True,
     "use --log-dir LOG_DIR: every rank's output goes to LOG_DIR/rank-N.log and, prefixed, to the terminal"),
    (("--local-ranks-filter", "--local_ranks_filter"), True,
     "every rank's output is shown with its rank prefix; use --log-dir LOG_DIR for one file per rank"),
    (("--duplicate-stdout-filters", "--duplicate_stdout_filters"), True,
     "use --log-dir LOG_DIR and search the rank logs"),
    (("--duplicate-stderr-filters", "--duplicate_stderr_filters"), True,
     "use --log-dir LOG_DIR and search the rank logs"),
    (("--local-addr", "--local_addr"), True,
     "the ranks reach the master at --master-addr and this node's own address is not needed: drop the flag"),
    (("--logs-specs", "--logs_specs"), True, "use --log-dir LOG_DIR for one file per rank"),
    (("--numa-binding", "--numa_binding"), True,
     "bind in the script, or use --no-python with a binding tool (e.g. numactl ... python SCRIPT)"),
    (("--signals-to-handle", "--signals_to_handle"), True,
     "SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are always forwarded to every rank; drop the flag"),
    (("--virtual-local-rank", "--virtual_local_rank"), False,
     "each rank's device follows from LOCAL_RANK and CUDA_VISIBLE_DEVICES (docs: the GPU rule); drop the flag"),
)


def _refusal(advice: str) -> Any:
    import argparse

    class Refuse(argparse.Action):
        """Refuses the flag when argparse meets it: one line that says what to use instead."""

        def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
            raise SpecError(f"{option_string} is a torchrun flag that `slurmlaunch run` does not carry out: {advice}")

    return Refuse


class FromEnv(str):
    """A default `run` read from a PET_* variable (as torchrun does): a bad one is named as such."""


class PetCount(Count):
    """Count, naming the PET_* variable when the value came from it and the option when the command line gave it
    (argparse passes a string default through the same type)."""

    def __init__(self, flag: str, name: str, minimum: int, maximum: int) -> None:
        super().__init__(flag, minimum, maximum)
        self.from_env = f"{flag} (from PET_{name})"

    def __call__(self, text: str) -> int:
        return parse_count(self.from_env if isinstance(text, FromEnv) else self.what, text, self.minimum,
                           self.maximum)


def add_run_options(p: Any, environ: Mapping[str, str]) -> None:
    import argparse

    def pet(name: str, default: object) -> object:
        value = environ.get(f"PET_{name}")  # torchrun reads its flags from PET_* too
        return default if value is None else FromEnv(value)

    # String defaults go through `type` too (argparse converts them after parsing): a bad PET_* value is
    # one line when the command runs, not a traceback while the parser is built.
    p.add_argument("--nnodes", default=pet("NNODES", "1"), help="number of nodes (N, or N:N)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=PetCount("--node-rank", "NODE_RANK", 0,
                   MAX_NODES - 1), default=pet("NODE_RANK", "0"))
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default=pet("MASTER_ADDR", "127.0.0.1"))
    p.add_argument("--master-port", "--master_port", dest="master_port",
                   type=PetCount("--master-port", "MASTER_PORT", 1, 65535),
                   default=pet("MASTER_PORT", str(DEFAULT_PORT)))
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default=pet("RDZV_ENDPOINT", None),
                   help="HOST:PORT, the same as --master-addr HOST --master-port PORT")
    p.add_argument("--rdzv-backend", "--rdzv_backend", dest="ignored", default=None,
                   help="accepted for torchrun compatibility; the rendezvous is always static (env://)")
    p.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", default=pet("RDZV_ID", "none"),
                   help="the job's id, exported as TORCHELASTIC_RUN_ID (default: torchrun's, none)")
    p.add_argument("--monitor-interval", "--monitor_interval", dest="ignored", default=None,
                   help="accepted for torchrun compatibility; a rank's exit is noticed at once")
    p.add_argument("--start-method", "--start_method", dest="ignored", choices=["spawn", "fork", "forkserver"],
                   default=None, help="accepted for torchrun compatibility; every rank is a new process (as spawn)")
    p.add_argument("--shutdown-timeout", "--shutdown_timeout", dest="shutdown_timeout",
                   type=Seconds("--shutdown-timeout"), default=10.0,
                   help="seconds the other ranks get after SIGTERM before SIGKILL, once one failed (default 10)")
    for flags, takes_value, advice in REFUSED:
        p.add_argument(*flags, dest="refused", nargs="?" if takes_value else 0, action=_refusal(advice),
                       default=None, help=argparse.SUPPRESS)
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc", default=pet("NPROC_PER_NODE", "1"),
                   help="processes on this node: a number, gpu (one per visible GPU), cpu (one per core) or auto")
    p.add_argument("--standalone", action="store_true", default=pet("STANDALONE", "") not in ("", "0"),
                   help="a single node on 127.0.0.1 with a free port")
    p.add_argument("--cpu", action="store_true", help="run the processes on the CPU even with GPUs visible")
    p.add_argument("--allow-loopback", action="store_true",
                   help="accept a loopback --master-addr with --nnodes > 1 (all 'nodes' on this one machine)")
    p.add_argument("--master-timeout", type=Seconds("--master-timeout"), default=None,
                   help=f"seconds a rank other than 0 waits for the master to listen before it is stopped, unless "
                        f"it connected elsewhere (a rendezvous of its own) (default: {RDZV_TIMEOUT_VAR}, else "
                        f"{DEFAULT_MASTER_TIMEOUT:.0f}; 0: no bound)")
    p.add_argument("--log-dir", "--log_dir", dest="log_dir", help="also write each rank's output to LOG_DIR/rank-N.log")
    p.add_argument("--use-env", "--use_env", dest="use_env", action="store_true",
                   help="accepted for torch.distributed.launch compatibility (the variables are always set)")
    p.add_argument("--print-env", action="store_true", help="each rank prints its variables (secrets masked)")
    p.add_argument("--legacy-local-rank-arg", action="store_true", help="pass --local-rank=N to the script")
    p.add_argument("-m", "--module", action="store_true", help="SCRIPT is a Python module")
    p.add_argument("--no-python", "--no_python", dest="no_python", action="store_true", help="SCRIPT is an executable")
    p.add_argument("script", metavar="SCRIPT")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")


def parse_nnodes(text: str) -> int:
    lo, _, hi = str(text).partition(":")
    nnodes = bounded_int(lo, MAX_NODES)
    if not nnodes or (hi and hi != lo):
        raise SpecError(f"--nnodes {shown(str(text))} is not valid (expected a number 1..{MAX_NODES}; elastic "
                        f"MIN:MAX ranges are not supported by `run`)")
    return nnodes


def plan_processes(nproc: str, use_cpu: bool, environ: Mapping[str, str]) -> tuple[int, bool, str | None]:
    """(processes on this node, run on the CPU?, a note to print once)."""
    from ..allocation.gpus import visible_gpus

    gpus = len(visible_gpus(environ))
    if nproc == "auto":
        nproc = "gpu" if gpus else "cpu"
    if nproc == "gpu":
        if gpus == 0:
            raise SpecError("--nproc-per-node gpu: no GPU is visible on this machine (use a number, or cpu)")
        return gpus, False, None
    if nproc == "cpu":
        return os.cpu_count() or 1, True, None
    # Checked before anything is built: one process (and its bookkeeping) per rank follows from it.
    count = bounded_int(nproc, MAX_PER_NODE)
    if not count:
        raise SpecError(f"--nproc-per-node {shown(nproc)} is not valid (expected a number 1..{MAX_PER_NODE}, "
                        f"gpu, cpu or auto)")
    if use_cpu:
        return count, True, None
    if gpus == 0:
        return count, True, f"no GPU visible: the {count} process(es) run on the CPU"
    if count > gpus:
        raise SpecError(f"--nproc-per-node {count} is more than the {gpus} GPU(s) visible here "
                        f"(use --nproc-per-node gpu, or --cpu to run CPU processes)")
    return count, False, None


def resolve_master(addr: str) -> list[str]:
    try:
        return resolve(addr)
    except (OSError, UnicodeError) as e:
        raise SpecError(f"--master-addr {addr!r} does not resolve ({e}): give a host name or address that every "
                        f"node can resolve") from None


REPORT_EVERY = 10.0  # seconds between "still waiting" lines: a silent wait of minutes looks like a hang


def master_timeout(ns: Any, environ: Mapping[str, str]) -> tuple[float, str]:
    """The ranks' rendezvous bound and where it came from: --master-timeout, else $SLURMLAUNCH_RDZV_TIMEOUT
    (core.rdzv; a bad value is refused in one line), else DEFAULT_MASTER_TIMEOUT. 0: no bound."""
    if ns.master_timeout is not None:
        return ns.master_timeout, "--master-timeout"
    if environ.get(RDZV_TIMEOUT_VAR, "").strip():
        return parse_rendezvous_timeout(environ[RDZV_TIMEOUT_VAR]), RDZV_TIMEOUT_VAR
    return DEFAULT_MASTER_TIMEOUT, "--master-timeout"


def report_master(addr: str, port: int, timeout: float, source: str, node_rank: int, stop: Any) -> None:
    """On a node other than 0, while its ranks run: says on stderr what they wait for (at the start, every
    REPORT_EVERY s with the time so far, and when the master answered) until the master answers, the ranks
    hold a TCP connection (a rendezvous of their own: they joined a world elsewhere), ``stop`` (a
    threading.Event) is set, or the bound passed. It stops nothing: whether a rank gave up is its own
    watchdog's decision (allocation.launch.start_watchdog), which stops only a rank that reached nobody."""
    me = os.getpid()
    start = time.monotonic()
    deadline = start + timeout if timeout > 0 else float("inf")
    bound = f"at most {timeout:.0f}s, {source}" if timeout > 0 else f"no bound, {source} 0"
    say = sys.stderr.write
    say(f"slurmlaunch: node {node_rank}: waiting for the master (node 0) to listen at {addr}:{port} ({bound}); "
        f"the ranks start now, and one is stopped only if nothing listened there by then and it connected to "
        f"nothing else\n")
    while True:
        failed = wait_listening(addr, port, min(deadline, time.monotonic() + REPORT_EVERY), 0.5,
                                give_up=lambda: stop.is_set() or holds_connection(me))
        if failed is not None and not stop.is_set() and holds_connection(me):
            failed = wait_listening(addr, port, time.monotonic(), 0)  # one more try: the master answers first
            if failed is not None:
                say(f"slurmlaunch: node {node_rank}: nothing listens at {addr}:{port} after "
                    f"{time.monotonic() - start:.0f}s, but the ranks hold TCP connections (a rendezvous of their "
                    f"own): no longer waiting for the master there\n")
                return
        elapsed = time.monotonic() - start
        if failed is None:
            say(f"slurmlaunch: node {node_rank}: the master at {addr}:{port} answered after {elapsed:.0f}s\n")
            return
        if stop.is_set() or time.monotonic() >= deadline:
            return  # the ranks ended, or their watchdogs decide now; cmd_run says what came of it
        total = f"of {timeout:.0f}s" if timeout > 0 else "so far"
        say(f"slurmlaunch: node {node_rank}: still waiting for the master at {addr}:{port} "
            f"({elapsed:.0f}s {total}; last: {failed})\n")


def cmd_run(ns: Any, environ: Mapping[str, str] = os.environ) -> int:
    """`slurmlaunch run`: every refusal before anything starts, then this node's ranks under the supervisor."""
    nnodes = parse_nnodes(ns.nnodes)
    if ns.module and ns.no_python:
        raise SpecError("-m/--module and --no-python cannot be used together")
    held = _choose_master(ns, nnodes)
    try:
        _check_arguments(ns, nnodes)
        nproc, on_cpu, note = plan_processes(str(ns.nproc), ns.cpu, environ)
        _check_master(ns, nnodes)
        ns.master_timeout, ns.master_timeout_source = master_timeout(ns, environ)
        if ns.log_dir:  # before the note: a refusal stays the only line
            try:
                os.makedirs(ns.log_dir, mode=0o750, exist_ok=True)
            except OSError as e:
                raise SpecError(f"--log-dir {shown(ns.log_dir)} cannot be made a directory ({e.strerror})") \
                    from None
        if note:
            sys.stderr.write(f"slurmlaunch: {note}\n")
        return start_ranks(ns, nnodes, nproc, on_cpu, environ)
    finally:
        if held is not None:
            held.close()


def _choose_master(ns: Any, nnodes: int) -> HeldPort | None:
    """ns.master_addr and ns.master_port from --rdzv-endpoint HOST:PORT, or 127.0.0.1 and a free port with
    --standalone: that one held by this process until the ranks end (returned; None otherwise)."""
    if ns.rdzv_endpoint:
        host, _, port_text = ns.rdzv_endpoint.rpartition(":")
        port = bounded_int(port_text, 65535)
        if not host or not port:
            raise SpecError(f"--rdzv-endpoint {shown(ns.rdzv_endpoint)} is not valid (expected HOST:PORT, PORT "
                            f"1-65535)")
        ns.master_addr, ns.master_port = host, port
    if ns.standalone:
        if nnodes != 1:
            raise SpecError(f"--standalone is for one node, not --nnodes {nnodes}")
        held = HeldPort()
        ns.master_addr, ns.master_port = "127.0.0.1", held.port
        return held
    return None


def _check_arguments(ns: Any, nnodes: int) -> None:
    """The node rank, the port, SCRIPT, the master's address and --log-dir as written (no network yet)."""
    if not 0 <= ns.node_rank < nnodes:
        raise SpecError(f"--node-rank {ns.node_rank} is not valid with --nnodes {nnodes} (expected 0..{nnodes - 1})")
    if not 1 <= ns.master_port <= 65535:
        raise SpecError(f"--master-port {ns.master_port} is not valid (expected 1-65535)")
    from .resolve import check_script

    check_script(ns.script, ns.module, ns.no_python, os.getcwd())
    # getaddrinfo takes '127.0.0.1\n' (inet_aton stops at the newline), and every rank would get it.
    if not ns.master_addr or any(c.isspace() or not c.isprintable() for c in ns.master_addr):
        raise SpecError(f"--master-addr {shown(ns.master_addr)} is not valid (expected a host name or address, "
                        f"without spaces or control characters)")
    if not ns.rdzv_id or any(c.isspace() or not c.isprintable() for c in ns.rdzv_id):
        raise SpecError(f"--rdzv-id {shown(ns.rdzv_id)} is not valid (expected an id without spaces or control "
                        f"characters; it becomes TORCHELASTIC_RUN_ID)")
    if ns.log_dir is not None and (not ns.log_dir or not ns.log_dir.isprintable()):
        raise SpecError(f"--log-dir {shown(ns.log_dir)} is not valid (expected a directory name without control "
                        f"characters such as newlines)")


def _check_master(ns: Any, nnodes: int) -> None:
    """The master's address resolves, is no loopback one for several nodes, and (on node 0) its port is free."""
    check_master_addr(ns.master_addr, "--rdzv-endpoint host" if ns.rdzv_endpoint else "--master-addr")
    addresses = resolve_master(ns.master_addr)
    if nnodes > 1 and all_loopback(addresses) and not ns.allow_loopback:
        raise SpecError(
            f"--master-addr {ns.master_addr!r} is a loopback address ({', '.join(addresses)}) but --nnodes is "
            f"{nnodes}: other machines cannot reach it. Give node 0's name or address on the network shared by the "
            f"nodes (hint: the 127.0.1.1 line of /etc/hosts; NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME pick the "
            f"interface), or --allow-loopback if every node runs on this machine"
        )
    if ns.node_rank == 0 and not ns.standalone and bindable(ns.master_port) is not None:
        raise SpecError(f"--master-port {ns.master_port} is already in use on this machine (the master): "
                        f"choose a free port, or --standalone for a single node")


def torchelastic_env(run_id: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables torchrun's agent gives every worker beyond torch's own (torch 2.13; tests/app/test_run.py
    compares the names with a real torchrun's), with values true of `run`: clients ask them whether torchrun
    started them (idr-torch, Lightning, torch.distributed.is_torchelastic_launched() read TORCHELASTIC_RUN_ID).
    No restarts; no agent store (USE_AGENT_STORE=False: rank 0 hosts the env:// store, as without torchrun);
    the signals the supervisor forwards. TORCHELASTIC_ERROR_FILE is per rank (start_ranks)."""
    from ..schedulers.supervisor import FORWARDED

    out = {"TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
           "TORCHELASTIC_USE_AGENT_STORE": "False",
           "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(signal.Signals(s).name for s in FORWARDED)}
    # torchrun sets it unless the user did: NCCL errors end the process instead of hanging it
    out["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    return out


def start_ranks(ns: Any, nnodes: int, nproc: int, on_cpu: bool, environ: Mapping[str, str]) -> int:
    import dataclasses
    import shutil
    import tempfile
    import threading
    import uuid

    from ..allocation.reasons import REASONS_DIR, stopped_first
    from ..allocation.script_runner import RETURNED_DIR
    from ..allocation.torchrun_mode import SIGABRT_CODE, teardown_aborts, teardown_message
    from ..schedulers.supervisor import RankProcess, supervise

    launch = [sys.executable, "-m", "slurmlaunch", "launch"]
    for flag, on in (("--print-env", ns.print_env), ("--legacy-local-rank-arg", ns.legacy_local_rank_arg),
                     ("-m", ns.module), ("--no-python", ns.no_python)):
        if on:
            launch.append(flag)
    argv = [*launch, ns.script, *ns.args]
    base = {k: v for k, v in environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    errors = tempfile.mkdtemp(prefix="slurmlaunch-run-")  # torchrun's per-run directory of error files
    reasons = os.path.join(errors, "reasons")  # why a rank's watchdog stopped it (allocation.reasons)
    os.mkdir(reasons, 0o700)
    returned = os.path.join(errors, "returned")  # each rank whose script returned leaves a mark (teardown aborts)
    os.mkdir(returned, 0o700)
    # The rendezvous bound is the ranks' own watchdog's (it stops only a rank that reached nobody).
    base.update({RDZV_TIMEOUT_VAR: f"{ns.master_timeout:g}", REASONS_DIR: reasons, RETURNED_DIR: returned})
    base.update(SLURMLAUNCH_RUN="1", SLURMLAUNCH_NNODES=str(nnodes), SLURMLAUNCH_NODE_RANK=str(ns.node_rank),
                SLURMLAUNCH_NPROC_PER_NODE=str(nproc), MASTER_ADDR=ns.master_addr, MASTER_PORT=str(ns.master_port))
    run_id = str(uuid.uuid4()) if ns.standalone else str(ns.rdzv_id)  # torchrun's choice of id
    base.update(torchelastic_env(run_id, environ))
    if on_cpu:
        base["SLURMLAUNCH_DEVICE"] = "cpu"
    if ns.allow_loopback:
        base["SLURMLAUNCH_ALLOW_LOOPBACK"] = "1"
    if ns.log_dir:
        os.makedirs(ns.log_dir, mode=0o750, exist_ok=True)
    ranks = []
    for local in range(nproc):
        rank = ns.node_rank * nproc + local
        log = os.path.join(ns.log_dir, f"rank-{rank}.log") if ns.log_dir else None
        if log and os.path.lexists(log):  # a new run, a new log (made afresh: never through a planted link)
            os.unlink(log)
        os.makedirs(os.path.join(errors, str(local)))
        ranks.append(RankProcess(rank, argv, dict(base, SLURMLAUNCH_LOCAL_RANK=str(local),
                                                  TORCHELASTIC_ERROR_FILE=os.path.join(errors, str(local),
                                                                                       "error.json")), log))
    stop = threading.Event()
    reporter = None
    if ns.node_rank > 0:
        reporter = threading.Thread(target=report_master, daemon=True, args=(
            ns.master_addr, ns.master_port, ns.master_timeout, ns.master_timeout_source, ns.node_rank, stop))
        reporter.start()
    try:
        outcome = supervise(ranks, grace=ns.shutdown_timeout)
        stop.set()
        if reporter is not None:
            reporter.join(timeout=5.0)  # its last line before the outcome's (a probe takes 2 s at most)
        # a rank its watchdog stopped died by SIGTERM, which says nothing of why: its reason file does
        found = stopped_first(outcome.first_failed_rank, reasons)
        stopped = found[1] if found is not None else None
        if found is not None:
            outcome = dataclasses.replace(outcome, exit_code=found[1].code, first_failed_rank=found[0])
        aborted = teardown_aborts([r for r, c in sorted(outcome.codes.items()) if c == SIGABRT_CODE], returned)
    finally:
        stop.set()
        shutil.rmtree(errors, ignore_errors=True)
    if stopped is not None and stopped.code == RDZV_TIMEOUT and outcome.interrupted_by is None:
        hint = ("is node 0 started with the same --master-addr and --master-port, and is the port open?"
                if ns.node_rank > 0 else "did rank 0 reach its rendezvous (init_process_group) in time?")
        sys.stderr.write(
            f"slurmlaunch: node {ns.node_rank}: rank {outcome.first_failed_rank} waited for the master (rank 0, "
            f"node 0) to listen at {ns.master_addr}:{ns.master_port} for {ns.master_timeout:.0f}s "
            f"({ns.master_timeout_source}) and connected to nothing else: its rendezvous never happened, so it "
            f"was stopped and this node's run ends (exit code {RDZV_TIMEOUT}); {hint}\n")
        return RDZV_TIMEOUT
    if outcome.interrupted_by is not None:
        sys.stderr.write(f"slurmlaunch: stopped by {signal.Signals(outcome.interrupted_by).name}; every rank "
                         f"was stopped (exit code {outcome.exit_code})\n")
    elif outcome.first_failed_rank is not None:
        # a rank slurmlaunch refused or stopped (a pre-flight's 78, a bad mapping's 65): its reason, not only
        # its code (the rank's own stderr may be a log file nobody reads)
        why = f" ({stopped.text})" if stopped is not None and stopped.text else ""
        sys.stderr.write(f"slurmlaunch: rank {outcome.first_failed_rank} failed first with exit code "
                         f"{outcome.exit_code}{why}; the other ranks were stopped\n")
    for rank in aborted:
        sys.stderr.write(f"slurmlaunch: {teardown_message(rank)}\n")
    return outcome.exit_code
