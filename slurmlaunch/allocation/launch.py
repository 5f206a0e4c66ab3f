"""The in-allocation launcher (`slurmlaunch launch`): reads this task's os.environ, maps it (core.detect) and
execs the rank's script, so that the script is the task. It is not the only module here that execs: torchrun
mode (torchrun_mode.py, once per node: torchrun), torchrun's workers (torchrun_worker.py) and PBS's rsh agent
for Open MPI (tmrsh.py) do too, each after reading the variables it needs.

Runs once per rank on possibly thousands of ranks, so it imports only small standard-library modules:
no torch, jinja2, submitit, argparse or subprocess.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module (no stub): `signal` loads enum at import
import os
import sys
import time
from collections.abc import Mapping, Sequence

from ..core.detect import Context, detect
from ..core.distenv import DistEnv, check_master_addr, mask
from ..core.errors import EnvironmentMappingError, HostlistError, PreflightError, SlurmLaunchError
from ..core.rdzv import RDZV_TIMEOUT_VAR, parse_rendezvous_timeout
from .net import GIVEN_UP, all_loopback, bindable, free_port, holds_connection, wait_listening
from .net import resolve as resolve_addresses
from .script_runner import RETURNED_DIR as RETURNED_DIR  # torchrun_mode's too
from .script_runner import python_argv as python_argv  # torchrun_mode imports it from here

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

USAGE = """usage: slurmlaunch launch [options] SCRIPT [ARGS...]

Map the scheduler's variables of this task onto torch's (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...)
and exec SCRIPT, so that the training process is the task itself.

options:
  -m, --module              SCRIPT is a Python module name (python -m SCRIPT)
  --no-python               SCRIPT is an executable; run it without the Python interpreter
  --print-env               print this rank's place and exported variables on stderr before exec
  --legacy-local-rank-arg   pass --local-rank=N to the script (torch.distributed.launch style)
  --no-preflight            skip the checks before exec (MASTER_ADDR, rank 0's host and MASTER_PORT)
                            and the rendezvous watchdog (also: SLURMLAUNCH_NO_PREFLIGHT=1)
environment:
  SLURMLAUNCH_RDZV_TIMEOUT  seconds a rank other than 0 waits for MASTER_ADDR:MASTER_PORT to listen
                            before it is stopped with a message, unless it connected elsewhere (a
                            rendezvous of its own) (default 900; 0: no bound)
  SLURMLAUNCH_ALLOW_LOOPBACK=1  accept a loopback MASTER_ADDR for a job on several "nodes" of one machine
  SLURMLAUNCH_DEVICE=cpu    run on the CPU even when GPUs are visible
  SLURMLAUNCH_REASONS_DIR   when this launcher stops the rank itself, it leaves one line here saying
                            why (set by the batch script, which reports the first such line)
  SLURMLAUNCH_RETURNED_DIR  run SCRIPT through a small runner that leaves an empty file named by the rank
                            here when SCRIPT returns, and RANK.exit holding N when it calls sys.exit(N),
                            N != 0 (set by the batch script: tells a SIGABRT in torch's teardown at
                            interpreter exit from one in the training, and keeps an exit 140 asked for)
  SLURMLAUNCH_TIMELINE_DIR  record this rank's start-up moments in a file named by the rank there: the
                            launcher's start and exec; through the runner, `import torch` done and
                            init_process_group returned (`slurmlaunch timeline`; set by the batch script)
  SLURMLAUNCH_STACKS_DIR    run SCRIPT through the runner, which arms faulthandler: every thread's stack
                            into RANK.dump here on SIGWINCH (`slurmlaunch stacks`), into RANK.stopped at
                            SIGTERM/HUP (then the signal acts as before); RANK.pid says which
                            process (set by the batch script); the warning signal reaches only a
                            rank whose script handles it (slurmlaunch warn-node reads RANK.pid)
  -h, --help                show this help
Everything after SCRIPT is passed to it unchanged.

exit codes when this launcher stops the rank itself (otherwise the rank's code is SCRIPT's):
  2   bad use of `slurmlaunch launch` (unknown option, SCRIPT missing)
  65  the scheduler's variables are malformed or inconsistent (SLURM_PROCID='abc', ...)
  69  nothing listened at MASTER_ADDR:MASTER_PORT within SLURMLAUNCH_RDZV_TIMEOUT and the rank holds
      no TCP connection at all (the batch script reports 69 for the rank; the process itself ends by
      SIGTERM)
  78  a pre-flight check refused (MASTER_ADDR, MASTER_PORT, rank 0's host, GPUs per node)

example (what `slurmlaunch submit` writes into the batch script):
  srun --ntasks-per-node=4 python -m slurmlaunch launch train.py --lr 0.1
"""


class LaunchOptions:
    __slots__ = ("module", "no_python", "print_env", "legacy_local_rank", "preflight", "script", "args")

    def __init__(self) -> None:
        self.module = False
        self.no_python = False
        self.print_env = False
        self.legacy_local_rank = False
        self.preflight = True
        self.script = ""
        self.args: list[str] = []


def parse_launch_args(argv: Sequence[str]) -> LaunchOptions | None:
    """Options up to the first non-option (SCRIPT); everything after it is the script's. None: --help."""
    opts = LaunchOptions()
    flags = {
        "-m": "module", "--module": "module", "--no-python": "no_python", "--no_python": "no_python",
        "--print-env": "print_env", "--legacy-local-rank-arg": "legacy_local_rank",
    }
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            return None
        if arg == "--":
            i += 1
            break
        if arg in flags:
            setattr(opts, flags[arg], True)
        elif arg == "--no-preflight":
            opts.preflight = False
        elif arg.startswith("-") and arg != "-":
            raise SlurmLaunchError(
                f"launch: unknown option {arg!r} (valid: -m, --no-python, --print-env, "
                f"--legacy-local-rank-arg, --no-preflight; put the script's own options after SCRIPT)"
            )
        else:
            break
        i += 1
    if i >= len(argv):
        raise SlurmLaunchError("launch: no SCRIPT given (usage: slurmlaunch launch [options] SCRIPT [ARGS...])")
    if opts.module and opts.no_python:
        raise SlurmLaunchError("launch: -m and --no-python cannot be used together")
    opts.script = argv[i]
    opts.args = list(argv[i + 1 :])
    return opts


def command(opts: LaunchOptions, dist: DistEnv, environ: Mapping[str, str] | None = None) -> list[str]:
    """The argv to exec; like torchrun, Python runs unbuffered (-u) so logs follow the training."""
    if opts.no_python:
        cmd = [opts.script]
    else:
        cmd = python_argv(sys.executable, opts.module, opts.script, environ if environ is not None else {})
    if opts.legacy_local_rank:
        cmd.append(f"--local-rank={dist.local_rank}")
    return cmd + opts.args


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20)  # the first host is on the first line; never read a huge file whole
    except OSError as e:
        raise SlurmLaunchError(f"cannot read {path!r}: {e.strerror}") from None


def _device_count() -> int:
    from .gpus import device_count  # asked only when no CUDA_VISIBLE_DEVICES says it: off the common start path

    return device_count(os.environ)


def context() -> Context:
    return Context(hostname=os.uname().nodename, read_file=_read_file, gpu_device_count=_device_count)


_LOOPBACK_HINT = (
    "the other nodes cannot reach a loopback address; Debian maps a machine's own name to 127.0.1.1 in "
    "/etc/hosts: set MASTER_ADDR to an address on the nodes' network, and NCCL_SOCKET_IFNAME / "
    "GLOO_SOCKET_IFNAME to its interface (SLURMLAUNCH_ALLOW_LOOPBACK=1 if all nodes really are this machine)"
)


def check_master_address(dist: DistEnv, environ: dict[str, str] | os._Environ[str]) -> None:
    """Every rank: MASTER_ADDR resolves here, and is no loopback address when the job spans several nodes."""
    if dist.owned_by_torchrun or dist.world_size == 1:
        return
    try:
        addresses = resolve_addresses(dist.master_addr, dist.master_port)
    except (OSError, UnicodeError) as e:
        raise PreflightError(
            f"MASTER_ADDR={dist.master_addr!r} does not resolve on {dist.this_host or 'this host'} ({e}): "
            f"every rank must resolve the master's name (set MASTER_ADDR to an address if DNS lacks it)"
        ) from None
    if (dist.num_nodes > 1 and all_loopback(addresses)
            and environ.get("SLURMLAUNCH_ALLOW_LOOPBACK") != "1"):
        raise PreflightError(
            f"MASTER_ADDR={dist.master_addr!r} resolves to {', '.join(addresses)} on "
            f"{dist.this_host or 'this host'} but the job spans {dist.num_nodes} nodes: {_LOOPBACK_HINT}"
        )


def rendezvous_timeout(environ: Mapping[str, str]) -> float:
    """The watchdog's bound: $SLURMLAUNCH_RDZV_TIMEOUT (core.rdzv), 900 s when unset, 0 for none."""
    return parse_rendezvous_timeout(environ.get(RDZV_TIMEOUT_VAR))


WATCHDOG_NAME = b"rdzv-watchdog"  # the watchdog's /proc/PID/comm (at most 15 bytes)


def start_watchdog(dist: DistEnv, timeout: float) -> None:
    """A rank other than 0 that neither reached MASTER_ADDR:MASTER_PORT nor made any TCP connection within
    ``timeout`` seconds is stopped with a message naming what it waited for, instead of hanging in
    init_process_group until the job's time limit. Why both: a script may rendezvous its own way (its own
    MASTER_PORT, init_method="tcp://host:PORT" or "file://..."), and then nothing ever listens at the port
    slurmlaunch chose; but every rendezvous torch offers ends with the rank holding a TCP connection (to a
    TCPStore, or gloo's and NCCL's links between ranks), so a rank (or a process it started) that holds
    one may have joined its world and is never stopped (net.holds_connection). Stopped is only a rank that
    reached nobody: its rendezvous has certainly not happened.
    The check runs in a forked child (it stays in the task's process tree, where Slurm tracks it), so the
    training process starts at once; the child exits as soon as the master answers, the rank holds a
    connection or ends, and holds none of the rank's output streams (it would delay the end of the task's
    output)."""
    if timeout <= 0 or dist.rank == 0 or dist.world_size == 1 or dist.owned_by_torchrun:
        return
    target = os.getpid()
    if os.fork() != 0:
        return
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 65536)
        try:  # die with the rank (PR_SET_PDEATHSIG); in the forked child only: off the rank's path
            import ctypes

            libc = ctypes.CDLL(None)
            libc.prctl(1, _signal.SIGKILL)
            # PR_SET_NAME: ps's argv still reads "slurmlaunch launch SCRIPT" (the fork's), its comm says what
            # it is. Once it ended it stays a zombie until the rank ends: a script that never waits for its
            # children never reaps it (a "launcher" that seems to outlive SIGTERM is this one, already ended).
            libc.prctl(15, WATCHDOG_NAME)
        except (OSError, AttributeError):
            pass
        me = os.getpid()
        # gives up when the rank has ended, or holds a connection (it rendezvoused, maybe its own way)
        last = wait_listening(dist.master_addr, dist.master_port, time.monotonic() + timeout, 0.25,
                              give_up=lambda: os.getppid() != target or holds_connection(target, me))
        # A connection once seen is enough: it may be closed again by the deadline (a short job that
        # rendezvoused, reduced and destroyed its group between two probes of the master's port).
        if last is None or last == GIVEN_UP or os.getppid() != target or holds_connection(target, me):
            os._exit(0)
        reason = (
            f"nothing listened at MASTER_ADDR:MASTER_PORT={dist.master_addr}:{dist.master_port} within "
            f"{timeout:.0f}s ({last}) and this rank connected to nothing else: its rendezvous never happened; "
            f"rank 0 ({dist.rank0_host or 'the master'}) never started it "
            f"(SLURMLAUNCH_RDZV_TIMEOUT sets the bound)")
        message = f"slurmlaunch: rank {dist.rank} on {dist.this_host}: {reason}. Stopping this rank.\n"
        # Before the SIGTERM: the batch script reads the reason once the step has ended, and the rank,
        # dying by a signal, has no exit code of its own to tell why.
        from .reasons import RDZV_TIMEOUT, record

        record(os.environ, RDZV_TIMEOUT, dist.rank, dist.this_host or os.uname().nodename, reason)
        try:  # the rank's own stderr, reopened only now
            err = os.open(f"/proc/{target}/fd/2", os.O_WRONLY | os.O_APPEND)
            os.write(err, message.encode(errors="replace"))
            os.close(err)
        except OSError:
            pass
        os.kill(target, _signal.SIGTERM)
        for _ in range(100):
            time.sleep(0.1)
            if os.getppid() != target:
                os._exit(0)
        os.kill(target, _signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os._exit(0)


def preflight(dist: DistEnv, environ: dict[str, str] | os._Environ[str]) -> DistEnv:
    """Every rank: MASTER_ADDR resolves and is sensible. Rank 0: it runs where everybody expects it,
    and it can listen on MASTER_PORT."""
    if dist.owned_by_torchrun:
        return dist
    if (dist.rank == 0 and not environ.get("MASTER_ADDR") and dist.rank0_host and dist.this_host
            and dist.rank0_host != dist.this_host):
        raise PreflightError(
            f"rank 0 runs on {dist.this_host!r} but every rank computed MASTER_ADDR={dist.rank0_host!r}: "
            f"the others would wait for a master that is not there (a hostfile or distribution that puts "
            f"rank 0 elsewhere? set MASTER_ADDR to the host of rank 0)"
        )
    check_master_address(dist, environ)
    if dist.rank != 0:
        return dist
    err = bindable(dist.master_port)
    if err is not None:
        raise PreflightError(
            f"rank 0 cannot listen on MASTER_PORT={dist.master_port} on {dist.this_host or 'this host'} "
            f"({err.strerror}): another job may hold it; set MASTER_PORT (or submit --master-port) "
            f"to a free port outside 32768-60999"
        )
    return dist


def resolve(environ: dict[str, str] | os._Environ[str]) -> DistEnv:
    """This process's distributed environment; a world of 1 gets a free port here. MASTER_ADDR (the
    user's or the derived one) must be a host name or an IP address: a URL is refused without echoing
    its credentials."""
    dist = detect(environ, context())
    if not dist.owned_by_torchrun:  # torchrun's own values are left alone, as everywhere else
        check_master_addr(dist.master_addr)
    if dist.master_port == 0 and not dist.owned_by_torchrun:
        dist = dist.replace(master_port=free_port())
    return dist


_INPUT_PREFIXES = ("SLURM_", "SLURMD_", "CUDA_", "NCCL_", "GLOO_", "OMP_", "TORCH_", "PET_", "MASTER_")


def describe(dist: DistEnv, exports: dict[str, str], environ: dict[str, str] | os._Environ[str]) -> str:
    """One line: this rank's place, what it exports, and the inputs that matter for debugging a launch
    (scheduler, CUDA, NCCL/gloo variables). distenv.mask decides what is hidden: values of credential-like
    names show as ****, and so does the userinfo of any URL; such variables are listed even outside the
    prefixes, masked, so that the line says they are set."""
    exported = " ".join(f"{k}={mask(k, v)}" for k, v in exports.items())
    inputs = " ".join(
        f"{k}={mask(k, v)!r}" for k, v in sorted(environ.items())
        if k not in exports and (k.startswith(_INPUT_PREFIXES) or mask(k, v) != v)
    )
    return f"{dist.summary()} :: {exported} :: {inputs}"


_RANK_VARIABLES = ("SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PALS_RANKID", "RANK")


def _stated_rank(environ: Mapping[str, str]) -> int | None:
    """The rank the first rank variable says, when it is a plain number: the best name for a task whose
    variables could not be mapped (the mapping is what failed)."""
    for name in _RANK_VARIABLES:
        value = environ.get(name, "")
        if value.isascii() and value.isdigit() and len(value) < 10:
            return int(value)
    return None


def stop_code(error: SlurmLaunchError) -> int:
    """The documented exit code of a rank this launcher refused to start."""
    from .reasons import BAD_LAUNCH, MAPPING, PREFLIGHT  # the refusal's path only, as record below
    if isinstance(error, PreflightError):
        return PREFLIGHT
    if isinstance(error, (EnvironmentMappingError, HostlistError)):  # in the launcher, a node list is a variable
        return MAPPING
    return BAD_LAUNCH


def note_launch(dist: DistEnv, environ: dict[str, str] | os._Environ[str]) -> None:
    """This rank's launcher start and its exec, now, into $SLURMLAUNCH_TIMELINE_DIR (docs: Where start-up
    goes); nothing, and nothing imported, when it is unset."""
    if environ.get("SLURMLAUNCH_TIMELINE_DIR"):
        from .timeline import launched, process_start_ns

        launched(environ, dist.rank, process_start_ns())


def main(argv: Sequence[str]) -> int | NoReturn:
    """`slurmlaunch launch`: detect, check, export, exec. Returns only on --help. A refusal raises its error
    with the rank's documented exit code (``stop_code``), after leaving its reason for the batch script."""
    placed: list[DistEnv] = []
    try:
        here = _main(argv, placed)
    except SlurmLaunchError as e:
        e.exit_code = stop_code(e)
        environ = os.environ
        rank: int | None = placed[0].rank if placed else _stated_rank(environ)
        host = placed[0].this_host if placed else environ.get("SLURMD_NODENAME", "")
        from .reasons import record

        record(environ, e.exit_code, rank, host or os.uname().nodename, f"refused to start the rank: {e}")
        raise
    if here is None:
        return 0
    run_here(here)  # outside the refusal's handling above: what the program raises is its own, not the launcher's


def in_process(opts: LaunchOptions) -> bool:
    """Whether the rank's program runs in this interpreter rather than an exec'd one: a module of this package
    (``-m slurmlaunch.…``: the Python API's rank, app/api/rank.py). A second interpreter would start again
    what this one has started (about 30-50 ms of CPU a rank, which every rank of every short job pays: issue
    39); such a module is written to run after the launcher's work, in the process the launcher is."""
    return opts.module and not opts.no_python and opts.script.startswith("slurmlaunch.")


def run_here(cmd: Sequence[str]) -> NoReturn:
    """Run ``cmd`` (``python -u -c CODE ARGS`` or ``python -u -m MODULE ARGS``: python_argv's) in this
    interpreter as the exec'd interpreter would run it: unbuffered, in a new __main__, with its argv; an
    exception it lets out is printed and the process exits 1, as Python's own top level does."""
    import io

    for name in ("stdout", "stderr"):  # what -u makes of them
        stream = getattr(sys, name)
        raw = io.FileIO(stream.fileno(), "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(raw, encoding=stream.encoding, errors=stream.errors, write_through=True))
    how, what, *args = cmd[2:] if cmd[1:2] == ["-u"] else cmd[1:]
    try:
        if how == "-c":
            import types

            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            sys.argv[:] = ["-c", *args]
            exec(compile(what, "<string>", "exec"), main.__dict__)
        else:
            import runpy

            sys.argv[:] = ["-m", *args]
            runpy._run_module_as_main(what)  # type: ignore[attr-defined]  # what `python -m` itself calls
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__  # the program's frames only, as Python shows them: not this function's, not runpy's
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        raise SystemExit(1) from None
    raise SystemExit(0)


def _main(argv: Sequence[str], placed: list[DistEnv]) -> list[str] | None | NoReturn:
    """The launcher's work; then exec, or the command to run in this interpreter (in_process), or None (--help)."""
    opts = parse_launch_args(argv)
    if opts is None:
        sys.stdout.write(USAGE)
        return None
    if not opts.no_python and not opts.module and not os.path.exists(opts.script):
        raise SlurmLaunchError(f"launch: script {opts.script!r} not found (cwd {os.getcwd()!r})")
    environ = os.environ
    if environ.get("SLURMLAUNCH_NO_PREFLIGHT") == "1":  # as --no-preflight (doctor's probe reports instead)
        opts.preflight = False
    watchdog_timeout = rendezvous_timeout(environ)
    dist = resolve(environ)
    placed.append(dist)
    if opts.preflight:
        dist = preflight(dist, environ)
    exports = dist.exports(environ)
    for note in dist.notes:
        sys.stderr.write(f"slurmlaunch: {note}\n")
    omp_note = dist.omp_note(environ)  # rank 0 only: once per job
    if omp_note:
        sys.stderr.write(f"slurmlaunch: {omp_note}\n")
    if opts.print_env:
        sys.stderr.write(describe(dist, exports, environ) + "\n")
    cmd = command(opts, dist, environ)
    environ.update(exports)
    sys.stdout.flush()
    sys.stderr.flush()
    if opts.preflight:
        start_watchdog(dist, watchdog_timeout)
    note_launch(dist, environ)
    if in_process(opts):
        return cmd
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        raise SlurmLaunchError(f"launch: cannot run {cmd[0]!r}: {e.strerror}") from None
