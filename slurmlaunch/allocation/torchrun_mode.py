"""--mode torchrun: one task per node runs torchrun, which starts that node's ranks.

`slurmlaunch torchrun-node [options] SCRIPT [ARGS...]` runs once per node inside the allocation. It reads
the Slurm step with the launcher's own reader (core.detect.read_slurm: this node's task is rank NODEID of a
world of one task per node) and execs ``python -m torch.distributed.run`` with a c10d rendezvous where the
launcher would put rank 0: endpoint MASTER_ADDR if set, else the step's first node; port MASTER_PORT if set,
else the one derived from the job and step ids; rendezvous id the job id. The node that runs the step's
rank 0 is told it hosts the rendezvous store (is_host), so nothing depends on the node name matching the
machine's host name. The warning signal
is added to the signals torchrun passes on to its workers (PET_SIGNALS_TO_HANDLE, torch >= 2.9), and
SLURMLAUNCH_RDZV_TIMEOUT (--rdzv-timeout) becomes the rendezvous' join_timeout.
Standard library only, like the launcher.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence

from ..core.detect import Context, read_slurm, slurm_step_ids
from ..core.distenv import DistEnv, omp_note, omp_threads
from ..core.errors import SlurmLaunchError
from ..core.limits import MAX_JOB_ID, bounded_int
from ..core.parse import parse_signal
from ..core.rdzv import RDZV_TIMEOUT_VAR, parse_rendezvous_timeout
from .launch import RETURNED_DIR, context, python_argv
from .torchrun_worker import AS_WORKER

USAGE = """usage: slurmlaunch torchrun-node --nproc-per-node N [--nnodes N|MIN:MAX] [--max-restarts N]
                              [--forward-signal NAME] [-m|--no-python] [--legacy-local-rank-arg]
                              SCRIPT [ARGS...]
Inside a Slurm step with one task per node: exec torchrun with a c10d rendezvous on the step's first node.

example (what `slurmlaunch submit --mode torchrun` writes into the batch script):
  srun --ntasks-per-node=1 python -m slurmlaunch torchrun-node --nproc-per-node=4 --max-restarts=3 train.py
"""
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's own default
# torchrun's failure summary: "  rank      : 3 (local_rank: 1)" then "  exitcode  : -6 (pid: 812) ..."
_FAILED_WORKER = re.compile(r"^ *rank *: (\d+) \(local_rank: \d+\)\n *exitcode *: (-?\d+) ", re.M)
SIGABRT_CODE = 128 + 6  # the shell's and the supervisor's code for a process killed by SIGABRT


# `python -c RELAY ARGV...`: run one torchrun worker (ARGV: the interpreter's options and SCRIPT, or with
# --no-python the executable and its arguments) with its stdout and stderr on pipes of its own, and pass them
# on whole lines at a time. Why: the workers of a node share torchrun's stdout, and `python -u` writes a
# print()'s text and its newline with two write()s, so another worker's line lands in between
# ("...Steps: 16[GPU1] Epoch 2"). A pipe keeps a write of at most PIPE_BUF (4096) bytes whole, so lines are
# passed on in writes of at most that size, split only between lines; a single longer line goes in one
# write(), whole in a file, whole in a pipe unless the pipe is full. \r ends a line too (progress bars).
# The worker stays in the relay's process group, which torchrun signals as a whole (killpg): the relay
# only waits, relays to the end, and then exits as the worker did (the same code, or the same signal, so
# torchrun's failure summary is unchanged). What the worker's own children still hold open after it ends
# gets 2 more seconds. Used only when a node runs several workers.
RELAY = """-0  # torchrun names a failed worker by its first argument without a leading "-": the script, not this
def _slurmlaunch_relay():
    import os, select, signal, sys, time
    from slurmlaunch.allocation.torchrun_worker import as_worker, worker_argv
    as_worker(os.environ)  # the worker's Slurm task variables (see AS_WORKER)
    argv = worker_argv(sys.argv[1:])
    def ident(fd):
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        return st.st_dev, st.st_ino
    merged = ident(1) is not None and ident(1) == ident(2)
    pipes = [os.pipe()] if merged else [os.pipe(), os.pipe()]
    pid = os.fork()
    if pid == 0:
        for s in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; an exec'd program expects neither
            signal.signal(s, signal.SIG_DFL)
        os.dup2(pipes[0][1], 1)
        os.dup2(pipes[-1][1], 2)
        for r, w in pipes:
            os.close(r)
            os.close(w)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, f"slurmlaunch: cannot run {argv[0]!r}: {e.strerror}\\n".encode())
        os._exit(127)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, lambda *_: None)  # the worker got it too (torchrun signals the group)
    live = {}
    for (r, w), out in zip(pipes, (1, 2)):
        os.close(w)
        live[r] = [out, b"", True]
    def emit(entry, data):
        batch = b""
        for line in data.splitlines(keepends=True) + [b""]:
            if batch and (not line or len(batch) + len(line) > select.PIPE_BUF):
                view = memoryview(batch)
                while view and entry[2]:
                    try:
                        view = view[os.write(entry[0], view):]
                    except OSError:
                        entry[2] = False  # the reader went away: keep draining, so the worker never blocks
                batch = b""
            batch += line
    status, drain_until = None, None
    while live:
        ready = select.select(list(live), [], [], 0.2)[0]
        for fd in ready:
            entry = live[fd]
            chunk = os.read(fd, 65536)
            if not chunk:
                emit(entry, entry[1])
                os.close(fd)
                del live[fd]
                continue
            data = entry[1] + chunk
            cut = max(data.rfind(b"\\n"), data.rfind(b"\\r")) + 1
            if len(data) - cut > 65536:  # a "line" this long without an end: pass it on, memory stays bounded
                cut = len(data)
            entry[1] = data[cut:]
            emit(entry, data[:cut])
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status, drain_until = st, time.monotonic() + 2.0
        elif time.monotonic() > drain_until:
            for entry in live.values():
                emit(entry, entry[1])
            break
    if status is None:
        status = os.waitpid(pid, 0)[1]
    sys.stdout.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            import resource
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the worker dumped its own core, if any
        except (ImportError, ValueError, OSError):
            pass
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
_slurmlaunch_relay()
"""


def parse(argv: Sequence[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """(values of --nproc-per-node/--nnodes/--max-restarts/--forward-signal, flags, SCRIPT + ARGS)."""
    values: dict[str, str] = {}
    flags: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--nproc-per-node", "--nnodes", "--max-restarts", "--forward-signal"):
            if not eq:
                if i + 1 >= len(argv):
                    raise SlurmLaunchError(f"torchrun-node: {name} needs a value")
                i += 1
                value = argv[i]
            values[name[2:]] = value
        elif arg in ("-m", "--module", "--no-python", "--legacy-local-rank-arg"):
            flags.append("-m" if arg == "--module" else arg)
        elif arg == "--":
            i += 1
            break
        elif arg.startswith("-"):
            raise SlurmLaunchError(f"torchrun-node: unknown option {arg!r} (valid: --nproc-per-node, --nnodes, "
                                   f"--max-restarts, --forward-signal, -m, --no-python, --legacy-local-rank-arg)")
        else:
            break
        i += 1
    if "nproc-per-node" not in values:
        raise SlurmLaunchError("torchrun-node: --nproc-per-node is required")
    if i >= len(argv):
        raise SlurmLaunchError("torchrun-node: no SCRIPT given")
    return values, flags, list(argv[i:])


def read_step(env: Mapping[str, str], ctx: Context | None = None) -> tuple[int, DistEnv]:
    """(job id, this node's task's place) as the launcher reads a task of a step (core.detect.read_slurm): a
    bad or inconsistent variable is the launcher's one line."""
    ids = slurm_step_ids(env)
    step = read_slurm(env, ctx or Context()) if ids is not None else None
    if ids is None or step is None:
        raise SlurmLaunchError("torchrun-node: not inside a Slurm step (SLURM_JOB_ID or SLURM_STEP_ID is unset); "
                               "it is what `slurmlaunch submit --mode torchrun` runs on each node")
    return ids[0], step


def _hosts_store(step: DistEnv) -> bool:
    """This node runs the step's rank 0, where the launcher puts MASTER_ADDR (read_slurm's this_host: by
    SLURMD_NODENAME when set, else by SLURM_NODEID)."""
    return step.this_host == step.rank0_host


def rendezvous_conf(env: Mapping[str, str], is_host: bool) -> str:
    """torchrun's --rdzv-conf: is_host, and SLURMLAUNCH_RDZV_TIMEOUT (--rdzv-timeout) as join_timeout when it
    is set and not 0 (unset: torchrun's own default). The variable is read as the launcher reads it
    (core.rdzv): a bad value is the same one-line error."""
    conf = f"is_host={int(is_host)}"
    text = env.get(RDZV_TIMEOUT_VAR)
    if text is not None and text.strip():
        timeout = parse_rendezvous_timeout(text)
        if timeout > 0:
            conf += f",join_timeout={timeout:g}"
    return conf


def _worker_command(env: Mapping[str, str], nproc: str, flags: Sequence[str], script: Sequence[str],
                    python: str) -> tuple[list[str], list[str]]:
    """(flags, script) as torchrun should start each worker: the legacy --local-rank argument, the launcher's
    RUNNER (marks "the script returned"), the worker's Slurm variables (AS_WORKER) or, when several workers
    share the node, the line relay, which sets them too."""
    if "--legacy-local-rank-arg" in flags:
        # right after SCRIPT, where torch.distributed.launch put it; torchrun puts each worker's local rank
        # in place of the macro (torch.distributed.elastic.utils.macros)
        flags = [f for f in flags if f != "--legacy-local-rank-arg"]
        script = [script[0], "--local-rank=${local_rank}", *script[1:]]
    if env.get(RETURNED_DIR) and "--no-python" not in flags:
        # each worker through the launcher's RUNNER, which marks "the script returned" (torchrun adds -u
        # itself only when it runs Python)
        script = [*python_argv(python, "-m" in flags, script[0], env), *script[1:]]
        flags = ["--no-python"]
    # Every worker starts with its Slurm task variables made torchrun's (AS_WORKER, core.workerenv); when
    # several workers share this node's output, through the line relay, which does the same (see RELAY).
    if "--no-python" in flags:
        # the interpreter's options first (RUNNER's command): the wrapper puts the interpreter back in front
        inner = script[1:] if script[0] == python and script[1:2] and script[1].startswith("-") else script
    else:
        inner = [*python_argv(python, "-m" in flags, script[0], {})[1:], *script[1:]]
    wrapper = RELAY if (bounded_int(nproc, MAX_JOB_ID) or 0) > 1 else AS_WORKER
    return ["--no-python"], [python, "-c", wrapper, *inner]


def _extra_env(env: Mapping[str, str], values: Mapping[str, str], step: DistEnv) -> dict[str, str]:
    """The variables torchrun_command adds: PET_SIGNALS_TO_HANDLE with the warning signal, OMP_NUM_THREADS."""
    extra: dict[str, str] = {}
    warning = parse_signal(values.get("forward-signal"))  # the name render/launch.py wrote, as the core reads it
    if warning:
        handled = env.get("PET_SIGNALS_TO_HANDLE", TORCHRUN_SIGNALS)
        wanted = "SIG" + warning[0]  # torchrun's spelling (signal.Signals' names)
        if wanted not in handled.split(","):
            extra["PET_SIGNALS_TO_HANDLE"] = f"{handled},{wanted}"
    nproc = bounded_int(values["nproc-per-node"], MAX_JOB_ID)
    # The launcher's rule (core.distenv.omp_threads), this node task's CPUs shared among its workers; torchrun
    # would set 1 itself with several workers, but then every node's torchrun would say so.
    threads = omp_threads(env, step.omp_num_threads, nproc, nproc) if nproc else None
    if threads is not None:
        extra["OMP_NUM_THREADS"] = str(threads)
    return extra


def torchrun_command(env: Mapping[str, str], values: Mapping[str, str], flags: Sequence[str],
                     script: Sequence[str], python: str, ctx: Context | None = None
                     ) -> tuple[list[str], dict[str, str]]:
    """(the torchrun argv, variables to add). Reads the step as the launcher does (core.detect.read_slurm,
    which names the variables and their precedence; ``ctx`` reads SLURM_HOSTFILE), and
    SLURMLAUNCH_RDZV_TIMEOUT, OMP_NUM_THREADS, PET_SIGNALS_TO_HANDLE."""
    job, step = read_step(env, ctx)
    conf = rendezvous_conf(env, _hosts_store(step))
    nnodes = values.get("nnodes") or str(step.num_nodes)
    flags, script = _worker_command(env, values["nproc-per-node"], flags, script, python)
    argv = [python, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
            f"--nproc-per-node={values['nproc-per-node']}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={step.master_addr}:{step.master_port}", f"--rdzv-id={job}", f"--rdzv-conf={conf}",
            f"--max-restarts={values.get('max-restarts', '0')}", *flags, *script]
    return argv, _extra_env(env, values, step)


def first_node_note(env: Mapping[str, str], values: Mapping[str, str], ctx: Context | None = None) -> str | None:
    """core.distenv.omp_note for this node's workers, said by the node that hosts the store only."""
    _, step = read_step(env, ctx)
    nproc = bounded_int(values["nproc-per-node"], MAX_JOB_ID)
    if not nproc or not _hosts_store(step):
        return None
    return omp_note(env, step.omp_num_threads, nproc)


def aborted_workers(log_text: str) -> list[int]:
    """The ranks torchrun's failure summary in ``log_text`` reports as killed by SIGABRT (exitcode -6)."""
    return sorted({int(rank) for rank, code in _FAILED_WORKER.findall(log_text) if code == "-6"})


def teardown_aborts(aborted: Sequence[int], returned_dir: str) -> list[int]:
    """Of the ranks killed by SIGABRT, those whose script had returned (the launcher's RUNNER left their
    marker in ``returned_dir``): they died in torch's teardown at interpreter exit, not in the training."""
    return [r for r in aborted if os.path.exists(os.path.join(returned_dir, str(r)))]


def teardown_message(rank: int) -> str:
    return (f"rank {rank} aborted in torch's teardown after the script returned (SIGABRT at interpreter exit, "
            f"its work had finished; docs: Debugging, 'Teardown aborts'); the job counts as failed")


def main(argv: Sequence[str]) -> int:
    if any(a in ("-h", "--help") for a in argv[:1]):
        sys.stdout.write(USAGE)
        return 0
    values, flags, script = parse(argv)
    ctx = context()
    cmd, extra = torchrun_command(os.environ, values, flags, script, sys.executable, ctx)
    note = first_node_note(os.environ, values, ctx)
    if note:
        sys.stderr.write(f"slurmlaunch: {note}\n")
    os.environ.update(extra)
    if os.environ.get("SLURMLAUNCH_PRINT_TORCHRUN"):
        sys.stderr.write("slurmlaunch: " + " ".join(cmd) + "\n")
    sys.stdout.flush()
    os.execv(cmd[0], cmd)
    return 127  # not reached
