"""Command-line front end. `launch` takes a fast path with no argparse; everything else uses argparse.

Errors of the SlurmLaunchError family become one line on stderr and exit code 2, and so do the OSError and
UnicodeError that bad input causes (a file where a directory should be, a full disk, bytes that are not
UTF-8); a reader that goes away (`| head -1`) ends the command quietly, as it ends Unix tools.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .core.errors import SlurmLaunchError
from .core.limits import MAX_NODES, MAX_PER_NODE, MAX_WORLD, Count, Seconds, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn


def _fail(message: str, code: int = 2) -> int:
    sys.stderr.write(f"slurmlaunch: error: {message}\n")
    return code


def _silence_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush (of what could not be
    written) does not print a second error after ours."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _os_error(e: OSError) -> str:
    """"what failed: the path" for an OSError, in one line."""
    what = e.strerror or str(e)
    paths = [shown(str(p), 1000) for p in (e.filename, e.filename2) if p is not None]
    return what + (": " + " -> ".join(paths) if paths else "")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("launch", "torchrun-node") and os.environ.get("SLURMLAUNCH_SCHEDULER"):
        # A task of the local scheduler (the one that marks its tasks, schedulers/local.py): its pid is known
        # only here (slurmstepd sets it in the forked task).
        os.environ.setdefault("SLURM_TASK_PID", str(os.getpid()))
    try:
        if args and args[0] == "launch":
            from .allocation.launch import main as launch_main

            return launch_main(args[1:])
        if args and args[0] == "torchrun-node":
            from .allocation.torchrun_mode import main as torchrun_node_main

            return torchrun_node_main(args[1:])
        if args and args[0] == "stacks-node":
            from .allocation.stacks import node_main

            return node_main(args[1:])
        if args and args[0] == "warn-node":
            from .allocation.warning import node_main as warn_node_main

            return warn_node_main(args[1:])
        if args and args[0] == "batch-step":
            from .allocation.batch_step import main as batch_step_main

            return batch_step_main(args[1:])
        if args and args[0].endswith("-job"):  # NAME-job: a process of scheduler NAME's jobs (its job_main)
            from .schedulers.registry import canonical, scheduler

            name = args[0][:-len("-job")]
            if name and canonical(name) == name:
                return scheduler(name).job_main(args[1:])
        if args and args[0] == "stacks-summary":
            from .allocation.stacks import summary_main

            return summary_main(args[1:])
        try:
            code = _dispatch(args)
        except SystemExit:  # argparse's --help and usage errors: their output is flushed below too
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, not at exit: a full disk or a closed pipe is still ours to report
        return code
    except SlurmLaunchError as e:
        return _fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("slurmlaunch: interrupted\n")
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 141  # the reader is gone (`| head -1`): quiet, with the status a shell shows for SIGPIPE
    except OSError as e:
        import errno

        if e.filename is None and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
            _silence_stdout()  # most likely standard output itself (> /dev/full); its flush would fail again
            return _fail(f"cannot write: {_os_error(e)}")
        return _fail(_os_error(e))
    except UnicodeError as e:
        return _fail(f"text that is not valid UTF-8 (or not encodable): {e}")


def _parser(profiles: bool = False, command: str | None = None) -> Any:
    """The argparse tree; ``profiles``: prepare `submit` for merging with the config files (only then is
    the profile machinery imported: the other commands stay quick to start). ``command``: the only command
    that will be parsed; `run`'s options (and their module) are then added only for `run` itself, and
    `submit`'s (whose defaults are read from core.spec's fields) only for `submit`."""
    parser_class = _parser_class()
    top = parser_class(prog="slurmlaunch", allow_abbrev=False,
                       description="Multi-node PyTorch on Slurm, PBS and this machine, without hand-written scripts.")
    sub = top.add_subparsers(dest="command", required=True, parser_class=parser_class, metavar="COMMAND")
    _add_allocation_commands(sub)
    _add_submit(sub, profiles, options=command is None or command == "submit" or command.startswith("-"))
    _add_doctor(sub)
    _add_config_and_job_commands(sub)
    _add_tools(sub, run_options=command is None or command == "run" or command.startswith("-"))
    _add_examples(top, sub)
    return top


def _parser_class() -> Any:
    """argparse's parser with slurmlaunch's usage errors (one line, exit 2)."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
            self.given = list(sys.argv[1:] if args is None else args)  # for error: what the user typed
            return super().parse_known_args(_glue_dash_values(self, self.given), namespace)

        def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too)
            if message.startswith("the following arguments are required"):
                # argparse says the missing positional first: `submit --nodez 2` would say SCRIPT is missing
                # and never name the option that was mistyped
                given = getattr(self, "given", [])
                words = given[:given.index("--")] if "--" in given else given
                unknown = [w for w in words if w.startswith("-") and w != "-" and not w[1:2].isdigit()
                           and w.split("=", 1)[0] not in self._option_string_actions]
                if unknown:
                    message = f"unrecognized arguments: {' '.join(unknown)} ({message[0].lower()}{message[1:]})"
            if message.startswith("unrecognized arguments: "):
                message += _hints(self, message.removeprefix("unrecognized arguments: ").split())
            sys.stderr.write(f"{self.prog}: error: {message}\n")
            raise SystemExit(2)

        def _get_values(self, action: Any, arg_strings: list[str]) -> Any:
            # `--opt=--` (or `--opt --`): argparse drops the '--' and hands the option an empty list
            # instead of the string '--' (Python 3.11), which no option's code expects.
            if action.option_strings and action.nargs is None and arg_strings == ["--"]:
                value = self._get_value(action, "--")
                self._check_value(action, value)
                return value
            return super()._get_values(action, arg_strings)

    return Parser


def _glue_dash_values(parser: Any, args: list[str]) -> list[str]:
    """``args`` with `--sbatch-arg --mem=4G` as `--sbatch-arg=--mem=4G`, the form argparse takes: the options
    whose metavar starts with '-' (--OPTION=VALUE: a flag passed through to sbatch, qsub or mpiexec) take the
    word after them even where it starts with '-' (argparse would read it as an option of ours and say
    "expected one argument"). Only before SCRIPT (the first word that is no option nor an option's value) and
    before '--': SCRIPT's own arguments are never changed."""
    actions = parser._option_string_actions
    if not any(str(a.metavar or "").startswith("-") for a in actions.values()):
        return args
    out, i = list(args), 0
    while i < len(out):
        word = out[i]
        if word == "--" or not word.startswith("-") or word == "-":
            break
        action = actions.get(word)
        if action is None or action.nargs == 0:  # a flag, `--opt=value`, `-N2`, or unknown
            i += 1
            continue
        value = out[i + 1] if i + 1 < len(out) else None
        if value is not None and value.startswith("-") and str(action.metavar or "").startswith("-"):
            out[i:i + 2] = [f"{word}={value}"]
            i += 1
        else:
            i += 2 if value is not None and not value.startswith("-") else 1
    return out


def _hints(parser: Any, words: list[str]) -> str:
    """For the unrecognized ``words``: what a torchrun or sbatch user's flags are here (app/flag_hints.py),
    as " (HINT; HINT)", or nothing."""
    import argparse

    from .app.flag_hints import hint

    command, given = parser.prog.rsplit(" ", 1)[-1], getattr(parser, "given", [])
    for action in parser._actions:  # the top parser reports its subcommand's leftovers: ask that one
        if isinstance(action, argparse._SubParsersAction) and given and given[0] in action.choices:
            parser, command = action.choices[given[0]], given[0]
    found = [h for h in (hint(w, parser._option_string_actions, command) for w in words if w.startswith("-"))
             if h is not None]
    return "".join(f"; {h}" for h in dict.fromkeys(found))


def _add_allocation_commands(sub: Any) -> None:
    """launch and torchrun-node (run before argparse: their entries are for --help), env, hostnames."""
    sub.add_parser("launch", help="inside an allocation: map the task's variables and exec SCRIPT "
                   "(see slurmlaunch launch --help)", add_help=False)

    sub.add_parser("torchrun-node", help="inside an allocation, once per node: exec torchrun with a c10d "
                   "rendezvous on the first node (what submit --mode torchrun runs)", add_help=False)

    env = sub.add_parser("env", allow_abbrev=False, help="show what `launch` would export here")
    env.add_argument("--json", action="store_true", help="one JSON object of the exported variables")

    hosts = sub.add_parser("hostnames", allow_abbrev=False,
                           help="expand a Slurm node list, one host per line (like scontrol show hostnames)")
    hosts.add_argument("expression", nargs="?", help="node list; default $SLURM_JOB_NODELIST")


def _add_submit(sub: Any, profiles: bool, options: bool = True) -> None:
    s = sub.add_parser("submit", allow_abbrev=False, help="submit SCRIPT as a distributed job",
                       usage="%(prog)s [OPTIONS] SCRIPT [ARGS ...]",  # the options are listed below, by group
                       description="Render a batch script for SCRIPT and submit it: with sbatch (Slurm), qsub\n"
                                   "(PBS) or, with neither, on this machine. --wait follows the job to its end;\n"
                                   "on this machine, a job runs in the terminal unless --wait or --no-wait\n"
                                   "detaches it. --dry-run prints the script only. Examples at the end.")
    if not options:
        return
    from .app.options import add_submit_options

    add_submit_options(s)
    if profiles:
        from .app.profiles import defer_defaults

        s.set_defaults(options_table=defer_defaults(s))


def _add_doctor(sub: Any) -> None:
    doc = sub.add_parser("doctor", allow_abbrev=False,
                         help="check what this Slurm or PBS site accepts before spending an allocation; --allocate N "
                              "runs a tiny job that checks MASTER_ADDR, the port, GPUs and torch from every rank")
    doc.add_argument("--partition", "-p", help="check requests against this partition (default: the default one)")
    doc.add_argument("--allocate", type=Count("--allocate", 1, MAX_NODES), metavar="N",
                     help="also run a probe job on N nodes")
    doc.add_argument("--gpus-per-node", type=Count("--gpus-per-node", 0, MAX_PER_NODE), default=0,
                     help="with --allocate: GPUs (= ranks) per node")
    doc.add_argument("--timeout", type=Seconds("--timeout"), default=300.0,
                     help="with --allocate: seconds to wait for the probe job, queueing included (default 300; "
                          "it is cancelled after)")
    doc.add_argument("--json", action="store_true")
    doc.add_argument("--scheduler", choices=("auto", "slurm", "pbs"), default="auto",
                     help="whose site to check: auto (default) is PBS where qsub is on PATH and sbatch is not")
    doc.add_argument("--remote", metavar="[USER@]HOST[:DIR]",
                     help="run the checks on that login node over ssh (this slurmlaunch is sent along to DIR, "
                          "default as for submit --remote)")
    doc.add_argument("--remote-setup", action="append", default=[], metavar="'SHELL LINE'",
                     help="with --remote: a shell line run first there, e.g. 'module load slurm' (repeatable)")
    doc.add_argument("--python", metavar="PATH",
                     help="with --remote: the interpreter there, the training environment's (default python3)")


def _add_config_and_job_commands(sub: Any) -> None:
    cfg = sub.add_parser("config", allow_abbrev=False,
                         help="show the submit options merged from profiles, and where each came from")
    cfg.add_argument("action", choices=["show", "profiles"], help="show: the merged options and their origins; "
                     "profiles: the profile names the config files define")
    cfg.add_argument("--profile", help="the profile to merge (default: $SLURMLAUNCH_PROFILE or the files' profile =)")
    cfg.add_argument("--json", action="store_true")

    lst = sub.add_parser("list", allow_abbrev=False, help="every job you submitted, from any directory, with its "
                         "state (? and ENDED: explained under the table)")
    lst.add_argument("name", nargs="?", metavar="NAME",
                     help="only the jobs whose name or id is NAME (a glob: 'train*')")
    lst.add_argument("--state", action="append", default=[], metavar="STATE[,STATE]",
                     help="only jobs in STATE (FAILED keeps 'FAILED 7'; repeatable), e.g. RUNNING,PENDING")
    lst.add_argument("--since", metavar="WHEN", help="only jobs submitted since WHEN: 2026-12-01, "
                     "2026-12-01T10:00 or an age (30m, 12h, 3d, 2w)")
    lst.add_argument("--before", metavar="WHEN", help="only jobs submitted before WHEN (as --since)")
    lst.add_argument("--prune", action="store_true",
                     help="remove the jobs listed (those that ended) from the list; their logs stay")
    lst.add_argument("--json", action="store_true")
    st = sub.add_parser("status", allow_abbrev=False, help="a job's state, nodes and exit code")
    st.add_argument("job")
    st.add_argument("--json", action="store_true")
    lg = sub.add_parser("logs", allow_abbrev=False, help="a job's output (the batch log, or --rank N's)")
    lg.add_argument("job")
    lg.add_argument("--rank", type=Count("--rank", 0, MAX_WORLD - 1))
    lg.add_argument("--follow", "-f", action="store_true", help="follow until the job ends")
    cn = sub.add_parser("cancel", allow_abbrev=False, help="cancel a job (scancel / qdel)")
    cn.add_argument("job")
    cn.add_argument("--stacks", action="store_true",
                    help="print the ranks' stacks, grouped, before cancelling (see `slurmlaunch stacks`)")
    sk = sub.add_parser("stacks", allow_abbrev=False,
                        help="where a running job's ranks are: every rank's Python stacks, grouped by the main "
                             "thread's (the odd ones first, with their node); no ptrace needed")
    sk.add_argument("job")
    sk.add_argument("--rank", type=Count("--rank", 0, MAX_WORLD - 1), help="every thread of this rank only")
    sk.add_argument("--json", action="store_true", help="the grouping and every rank's threads as JSON")
    sk.add_argument("--timeout", type=Seconds("--timeout"), default=10.0,
                    help="seconds each node's ranks get to answer (default 10; a node's collector gets 30 more "
                         "to start); a rank that does not is named as such")
    tl = sub.add_parser("timeline", allow_abbrev=False,
                        help="where a job's start-up went, per rank: a chart of every rank's phases (launch, "
                             "exec, import torch, rendezvous, first mark), the slowest named, and an SVG picture")
    tl.add_argument("job")
    tl.add_argument("--json", action="store_true", help="every rank's phases as JSON")
    tl.add_argument("--svg", metavar="PATH", help="where to write the picture (default: job-ID.timeline.svg in the "
                    "job's output directory)")


def _add_tools(sub: Any, run_options: bool) -> None:
    """dev-cluster, run (its options only with ``run_options``) and completion."""
    dc = sub.add_parser("dev-cluster", allow_abbrev=False,
                        help="a real multi-node Slurm (or OpenPBS) on this machine, to try jobs before the shared "
                             "cluster (root and Debian's slurmctld/slurmd/slurm-client; OpenPBS in /opt/pbs)")
    dc.add_argument("action", choices=["up", "down", "status"])
    dc.add_argument("--scheduler", choices=["slurm", "pbs"], default="slurm",
                    help="pbs: a head host (server, scheduler, comm, datastore) and one MoM per node, each its own "
                         "host on a private network; installs OpenPBS when /opt/pbs is missing (down and status "
                         "find a PBS cluster by themselves)")
    dc.add_argument("--dir", default="/tmp/slurmlaunch-dev-cluster", help="its state, logs and pid files")
    # slurmd daemons on this one machine, each with its own port: a few dozen is already a lot.
    dc.add_argument("--nodes", type=Count("--nodes", 1, 256), default=4)
    dc.add_argument("--gpus-per-node", type=Count("--gpus-per-node", 0, 64), default=4,
                    help="fake GPUs (/dev/null stand-ins)")
    dc.add_argument("--cpus", type=Count("--cpus", 1, MAX_PER_NODE), default=8, help="CPUs each node claims")
    dc.add_argument("--accounting", action="store_true", help="MariaDB + slurmdbd too, so that sacct works")
    dc.add_argument("--netns", nargs="?", const="auto", metavar="SUBNET",
                    help="each node its own address on a private bridge, in network namespaces (SUBNET: a "
                         "private /24 to use; default: a free one of 10.213.0.0/16); clients in DIR/bin")

    r = sub.add_parser("run", allow_abbrev=False, help="torchrun's flags, without a scheduler: start this "
                       "node's ranks (swap `torchrun` or `python -m torch.distributed.launch` for `slurmlaunch run`)")
    if run_options:
        from .app.run import add_run_options

        add_run_options(r, os.environ)

    comp = sub.add_parser("completion", allow_abbrev=False, help="print a shell completion script")
    comp.add_argument("shell", choices=["bash", "zsh", "fish"])


def _add_examples(top: Any, sub: Any) -> None:
    import argparse

    for name, p in [("slurmlaunch", top), *sub.choices.items()]:
        if name in EXAMPLES:
            p.epilog = "examples:\n" + "\n".join("  " + line for line in EXAMPLES[name])
            p.formatter_class = argparse.RawDescriptionHelpFormatter


EXAMPLES = {
    "slurmlaunch": ["slurmlaunch submit --nodes 2 --gpus-per-node 4 --wait train.py --lr 0.1",
                    "slurmlaunch <command> --help      (every command has examples)"],
    "env": ["srun -N2 --ntasks-per-node=4 slurmlaunch env      # what each task would get"],
    "hostnames": ["slurmlaunch hostnames 'gpu[01-03,07],cpu5'"],
    "submit": ["slurmlaunch submit --nodes 2 --gpus-per-node 4 --time 4:00:00 --partition gpu --wait train.py --lr 0.1",
               "slurmlaunch submit --profile booster --sweep lr=0.1,0.01 --sweep bs=32,64 train.py",
               "slurmlaunch submit --mode torchrun --nodes 2:4 --gpus-per-node 8 --max-restarts 3 train.py",
               "slurmlaunch submit --apptainer torch.sif --nodes 2 --gpus-per-node 4 -m pkg.train",
               "slurmlaunch submit --dry-run --nodes 2 --gpus-per-node 4 train.py    # print the script only"],
    "list": ["slurmlaunch list --json | jq -r '.[-1].job_id'",
             "slurmlaunch list --state FAILED --since 3d 'train*'",
             "slurmlaunch list --prune --before 30d        # forget the jobs older than 30 days"],
    "status": ["slurmlaunch status 1234", "slurmlaunch status 1234_3 --json     # element 3 of an array"],
    "logs": ["slurmlaunch logs 1234 --rank 3 --follow"],
    "cancel": ["slurmlaunch cancel 1234", "slurmlaunch cancel --stacks 1234     # where each rank was, then cancel"],
    "stacks": ["slurmlaunch stacks 1234", "slurmlaunch stacks 1234 --rank 3 --json"],
    "timeline": ["slurmlaunch timeline 1234", "slurmlaunch timeline 1234 --json --svg /tmp/startup.svg"],
    "dev-cluster": ["sudo slurmlaunch dev-cluster up --nodes 2 --gpus-per-node 2 && "
                    "export SLURM_CONF=/tmp/slurmlaunch-dev-cluster/slurm.conf SLURMLAUNCH_ALLOW_LOOPBACK=1",
                    "slurmlaunch dev-cluster down",
                    "sudo slurmlaunch dev-cluster up --scheduler pbs --nodes 3 --dir /tmp/pbs && "
                    "export PATH=/tmp/pbs/bin:$PATH      # qsub, qstat... of a real OpenPBS"],
    "run": ["slurmlaunch run --nproc-per-node 4 train.py --lr 0.1             # one machine",
            "slurmlaunch run --nnodes 2 --node-rank 0 --master-addr 10.1.2.3 --nproc-per-node 8 train.py"],
    "doctor": ["slurmlaunch doctor --partition gpu",
               "slurmlaunch doctor --allocate 2 --gpus-per-node 4 --partition gpu"],
    "config": ["slurmlaunch config show --profile booster", "slurmlaunch config profiles"],
    "completion": ["eval \"$(slurmlaunch completion bash)\"      # in ~/.bashrc (zsh: completion zsh)",
                   "slurmlaunch completion fish > ~/.config/fish/completions/slurmlaunch.fish"],
}


def _dispatch(args: list[str]) -> int:
    ns = _parser(profiles=args[:1] == ["submit"], command=args[0] if args else None).parse_args(args)
    if ns.command == "launch":  # only reached with no arguments at all
        from .allocation.launch import main as launch_main

        return launch_main([])
    if ns.command == "env":
        return cmd_env(ns.json)
    if ns.command == "hostnames":
        return cmd_hostnames(ns.expression)
    if ns.command == "stacks":
        from .app.jobs.stacks import cmd_stacks

        return cmd_stacks(ns.job, ns.rank, ns.json, ns.timeout)
    if ns.command == "timeline":
        from .app.jobs.timeline import cmd_timeline

        return cmd_timeline(ns.job, ns.json, ns.svg)
    if ns.command in ("list", "status", "logs", "cancel"):
        from .app.jobs import commands as jobs

        if ns.command == "list":
            from .app.jobs import listing

            return jobs.cmd_list(ns.json, listing.Filters(
                listing.parse_states(ns.state),
                None if ns.since is None else listing.parse_when(ns.since, "--since"),
                None if ns.before is None else listing.parse_when(ns.before, "--before"), ns.name), ns.prune)
        if ns.command == "status":
            return jobs.cmd_status(ns.job, ns.json)
        if ns.command == "logs":
            return jobs.cmd_logs(ns.job, ns.rank, ns.follow)
        if ns.stacks:
            from .app.jobs.stacks import print_before_cancel

            print_before_cancel(ns.job, 10.0)
        return jobs.cmd_cancel(ns.job)
    if ns.command == "dev-cluster":
        from pathlib import Path

        from .app.devcluster import pbs as devcluster_pbs
        from .app.devcluster.slurm import cmd

        if ns.scheduler == "pbs" or (ns.action != "up" and devcluster_pbs.is_pbs(Path(ns.dir))):
            return devcluster_pbs.cmd(ns.action, Path(ns.dir), ns.nodes, ns.cpus, ns.gpus_per_node)
        return cmd(ns.action, Path(ns.dir), ns.nodes, ns.gpus_per_node, ns.cpus, ns.accounting, ns.netns)
    if ns.command == "run":
        from .app.run import cmd_run

        return cmd_run(ns)
    if ns.command == "submit":
        from .app.submit import cmd_submit

        return cmd_submit(ns)
    if ns.command == "config":
        return cmd_config(ns.action, ns.profile, ns.json)
    if ns.command == "completion":
        from .app.completion import script

        sys.stdout.write(script(ns.shell, _parser()))
        return 0
    if ns.command == "doctor":
        if ns.remote is not None:
            from .app.remote.doctor import cmd_doctor_remote

            return cmd_doctor_remote(ns.remote, ns.remote_setup, ns.python, ns.partition, ns.json, ns.allocate,
                                     ns.gpus_per_node, ns.timeout, ns.scheduler)
        from .app.doctor.command import cmd_doctor

        return cmd_doctor(ns.partition, ns.json, ns.allocate, ns.gpus_per_node, ns.timeout,
                          remote_setup=ns.remote_setup, python=ns.python, scheduler=ns.scheduler)
    raise AssertionError(ns.command)


def cmd_config(action: str, profile: str | None, as_json: bool) -> int:
    import argparse
    import os

    from .app import profiles
    from .app.options import add_submit_options

    if action == "profiles":
        names = profiles.profile_names(os.environ, os.getcwd())
        sys.stdout.write("".join(n + "\n" for n in names))
        return 0
    submit_parser = argparse.ArgumentParser(add_help=False)
    add_submit_options(submit_parser)
    table = profiles.option_table(submit_parser)
    resolved = profiles.resolve(argparse.Namespace(profile=profile), table, os.environ, os.getcwd())
    sys.stdout.write(profiles.show(resolved, table, as_json))
    return 0


def cmd_env(as_json: bool) -> int:
    import json
    import os

    from .allocation.launch import resolve
    from .core.distenv import mask

    dist = resolve(os.environ)
    exports = dist.exports(os.environ)
    if as_json:
        print(json.dumps({k: mask(k, v) for k, v in exports.items()}, sort_keys=True))
        return 0
    print(f"detected: {dist.source}" + (" (torchrun owns this process; nothing is changed)"
                                        if dist.owned_by_torchrun else ""))
    for note in dist.notes:
        print(f"note: {note}")
    same_as = {"GROUP_RANK": "NODE_RANK", "ROLE_RANK": "RANK", "ROLE_WORLD_SIZE": "WORLD_SIZE"}
    origins = {k: dist.origins.get(k) or dist.origins.get(same_as.get(k, ""), "") for k in exports}
    origins.setdefault("ROLE_NAME", "torchrun's default role")
    if "SLURMLAUNCH_LOCAL_DEVICE" in exports:
        origins["SLURMLAUNCH_LOCAL_DEVICE"] = "CUDA_VISIBLE_DEVICES / LOCAL_RANK (docs: the launcher, GPU rule)"
    rows = [(k, mask(k, v), origins[k] or "fixed for " + dist.source) for k, v in exports.items()]
    width = max((len(k) + len(v) for k, v, _ in rows), default=0) + 1
    for k, v, origin in rows:
        print(f"  {k}={v}".ljust(width + 3) + f" <- {origin}")
    return 0


def cmd_hostnames(expression: str | None) -> int:
    import os

    from .core import hostlist

    expr = expression if expression is not None else os.environ.get("SLURM_JOB_NODELIST")
    if expr is None:
        raise SlurmLaunchError("hostnames: no EXPRESSION given and SLURM_JOB_NODELIST is not set")
    out = sys.stdout
    for host in hostlist.iter_hosts(expr):
        out.write(host + "\n")
    return 0
