# The runner each rank's Python script goes through (script_runner.py says why and when). Not imported: its text
# is run in the rank's __main__ by `python -u -c '-0;_f=open(THIS FILE);exec(_f.read())' [-m] SCRIPT ARGS...`
# (script_runner.RUNNER), so that `ps`, `top` and `pgrep -f` show SCRIPT and its arguments, not this code. Hence no
# docstring (it would become the script's __doc__) and no name left behind at module level: the five functions
# remove themselves from the script's globals before the script runs. Standard library only, and only inside
# the functions; the file names (.exit, .dump, .stopped, .ended, .pid) are core/__init__.py's, spelled here because
# nothing of slurmlaunch is importable in the rank (tests/allocation/test_teardown.py checks they agree).


def _slurmlaunch_arm(stacks: str) -> None:
    # SIGWINCH appends every thread's stack to RANK.dump; the stop signals write it to RANK.stopped and go on
    # to the handler there was (script_runner.py: why these signals, and why not the warning's USR1/USR2).
    import os

    try:
        import _signal  # type: ignore[import-not-found]  # not `signal`: its enums cost ~10 ms at start-up
        import faulthandler

        base = os.path.join(stacks, os.environ.get("RANK", "rank"))

        def fresh(path: str) -> int:
            try:
                os.unlink(path)
            except OSError:
                pass
            how = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
            return os.open(path, how, 0o600)

        winch = int(_signal.SIGWINCH)
        stops = [int(_signal.SIGTERM), int(_signal.SIGHUP)]
        faulthandler.register(winch, fresh(base + ".dump"), all_threads=True)
        stop = fresh(base + ".stopped")
        for s in stops:
            faulthandler.register(s, stop, all_threads=True, chain=True)

        def forked() -> None:
            for s in (winch, *stops):
                faulthandler.unregister(s)

        os.register_at_fork(after_in_child=forked)
        with open("/proc/self/stat", "rb") as f:
            start = f.read().rsplit(b")", 1)[1].split()[19].decode()
        host = "".join((os.environ.get("SLURMD_NODENAME") or os.uname().nodename).split()) or "?"
        fd = fresh(base + ".pid")
        os.write(fd, f"{os.getpid()} {start} {host}\n".encode())
        os.close(fd)
    except (OSError, ValueError, IndexError, RuntimeError, AttributeError):
        pass


def _slurmlaunch_timeline(where: str) -> None:
    # The rank's moments after the launcher's (allocation/timeline.py: one line, one write, per moment): when
    # `import torch` finished and when torch.distributed.init_process_group first returned. A finder first on
    # sys.meta_path answers None for every module but "torch"; for that one it wraps the loader's exec_module
    # and leaves sys.meta_path at once, so the modules torch imports never ask it: a script pays one Python
    # call for each module it imports before torch (none after), one that never imports torch one per module.
    import os
    import sys
    import time

    rank = os.environ.get("RANK", "")
    if not rank.isdigit():
        return
    path = os.path.join(where, rank)
    host = "".join((os.environ.get("SLURMD_NODENAME") or os.uname().nodename).split()) or "?"
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC

    def note(kind: str) -> None:
        try:
            fd = os.open(path, flags, 0o600)
            try:
                os.write(fd, f"{time.time_ns()} {host} {kind}\n".encode())
            finally:
                os.close(fd)
        except OSError:
            pass

    def patch(module: object) -> None:
        original = getattr(module, "init_process_group", None)
        if original is None or getattr(original, "_slurmlaunch_timed", False):
            return
        done: list[bool] = []

        def init_process_group(*args: object, **kwargs: object) -> object:
            result = original(*args, **kwargs)
            if not done:
                done.append(True)
                note("rendezvous")
            return result

        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(init_process_group, name, getattr(original, name, None))
        init_process_group.__wrapped__ = original  # type: ignore[attr-defined]  # inspect.signature follows it
        init_process_group._slurmlaunch_timed = True  # type: ignore[attr-defined]
        # the name bound where torch.distributed's own modules imported it (device_mesh, ...), too
        for name, loaded in list(sys.modules.items()):
            if name.startswith("torch.distributed") and getattr(loaded, "init_process_group", None) is original:
                loaded.init_process_group = init_process_group  # type: ignore[attr-defined]

    class Finder:
        wanted = "torch"

        @classmethod
        def find_spec(cls, name: str, search: object = None, target: object = None) -> object:
            if name != cls.wanted:
                return None
            try:  # off the path at once: the modules torch itself imports (a thousand) never ask it
                sys.meta_path.remove(cls)  # type: ignore[arg-type]
            except ValueError:
                pass
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(name, search, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
            loader = getattr(spec, "loader", None)
            run = getattr(loader, "exec_module", None)
            if run is None:
                return spec

            def exec_module(module: object) -> None:
                run(module)
                if name == "torch":
                    note("torch")
                if "torch.distributed" in sys.modules:  # torch imports it (2.x); else wait for it alone
                    patch(sys.modules["torch.distributed"])
                elif name == "torch":
                    cls.wanted = "torch.distributed"
                    sys.meta_path.insert(0, cls)  # type: ignore[arg-type]

            loader.exec_module = exec_module  # type: ignore[union-attr]
            return spec

    if "torch.distributed" in sys.modules:  # imported already (the API's rank unpickled its function): too late
        patch(sys.modules["torch.distributed"])  # to say when, in time for the rendezvous
        return
    sys.meta_path.insert(0, Finder)  # type: ignore[arg-type]


def _slurmlaunch_settle() -> None:
    # torch's gloo workers destroy each finished all-reduce themselves, and with it a Python object that
    # the backward pass left in the work's thread-local state: a worker still on its way there when the
    # interpreter finalizes is ended by CPython 3.11-3.13 inside a C++ destructor, and that is SIGABRT
    # (docs: Teardown aborts). Before finalizing, give them the GIL until none is running (at most 0.5 s).
    # names taken from builtins here: this runs with the script's globals, which may rebind them
    # (`from os import *` brings os.open); best effort, so nothing it meets ends the process
    import builtins
    import os
    import sys

    if "torch" not in sys.modules:
        return
    import time

    fail, reader = builtins.Exception, builtins.open
    quiet, deadline = 0, time.monotonic() + 0.5
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(0.002)
        quiet += 1
        try:
            tids = os.listdir("/proc/self/task")
        except fail:
            return
        for tid in tids:
            try:  # a thread that ended since the listing is skipped
                with reader("/proc/self/task/" + tid + "/stat", "rb") as f:
                    stat = f.read()
                end = stat.rindex(b")")
                if stat[stat.index(b"(") + 1:end].startswith(b"pt_gloo") and stat[end + 2:end + 3] == b"R":
                    quiet = 0
            except fail:
                continue


def _slurmlaunch_ended(stacks: str, error: BaseException) -> None:
    # The script ended with an exception: its stack, as faulthandler writes one, into RANK.ended. Why: when a
    # job is stopped, its ranks are not signalled at once (srun, then node by node); a rank whose peer died
    # first sees its all_reduce fail, and the stop then finds it in its teardown (settle, garbage collection)
    # with no frame of the job's: the summary takes this stack instead (allocation/stacks.py: saved). First
    # thing on the way out, and no import: the stop may come any moment now.
    import os

    frames, tb = [], error.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    lines = ["Current thread 0x0 (most recent call first):"]
    for tb in reversed(frames):
        code = tb.tb_frame.f_code
        lines.append(f'  File "{code.co_filename}", line {tb.tb_lineno} in {code.co_name}')
    outer = frames[0].tb_frame.f_back if frames else None
    while outer is not None:  # the RUNNER's own frames below the try, down to its <module>
        lines.append(f'  File "{outer.f_code.co_filename}", line {outer.f_lineno} in {outer.f_code.co_name}')
        outer = outer.f_back
    path = os.path.join(stacks, os.environ.get("RANK", "rank") + ".ended")
    try:
        try:
            os.unlink(path)
        except OSError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, ("\n".join(lines[:101]) + "\n").encode("utf-8", errors="replace"))
        finally:
            os.close(fd)
    except OSError:
        pass


def _slurmlaunch_main() -> None:
    import os
    import sys

    where, argv = os.environ.get("SLURMLAUNCH_RETURNED_DIR", ""), sys.argv[1:]
    main = sys.modules["__main__"].__dict__
    opened = main.pop("_f", None)  # the file this text was read from (script_runner.RUNNER)
    if opened is not None:
        opened.close()
    del main["_slurmlaunch_main"]
    stacks = os.environ.get("SLURMLAUNCH_STACKS_DIR", "")
    if stacks:
        _slurmlaunch_arm(stacks)
    del main["_slurmlaunch_arm"]
    ended = main.pop("_slurmlaunch_ended")
    timeline = os.environ.get("SLURMLAUNCH_TIMELINE_DIR", "")
    if timeline:
        _slurmlaunch_timeline(timeline)
    del main["_slurmlaunch_timeline"]
    settle = main.pop("_slurmlaunch_settle")
    hook = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, tb: object) -> None:
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":  # type: ignore[attr-defined]
            tb = tb.tb_next  # type: ignore[attr-defined]
        hook(kind, value.with_traceback(tb) if isinstance(value, BaseException) else value, tb)  # type: ignore[arg-type]

    sys.excepthook = excepthook

    def returned() -> None:
        if where:
            try:
                os.close(os.open(os.path.join(where, os.environ.get("RANK", "rank")), os.O_WRONLY | os.O_CREAT, 0o644))
            except OSError:
                pass

    def exited(code: object) -> None:
        if where:
            try:
                fd = os.open(os.path.join(where, os.environ.get("RANK", "rank") + ".exit"),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                try:
                    os.write(fd, str(code & 255 if isinstance(code, int) else 1).encode())
                finally:
                    os.close(fd)
            except OSError:
                pass

    try:
        if argv[:1] == ["-m"]:
            import runpy

            sys.argv[:] = ["-m", *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(argv[1])  # type: ignore[attr-defined]
        else:
            path = os.path.abspath(argv[0])
            sys.argv[:] = argv
            sys.path[0] = os.path.dirname(os.path.realpath(path))
            with open(path, "rb") as f:
                code = compile(f.read(), path, "exec", dont_inherit=True)
            main.update(__file__=path, __cached__=None)
            exec(code, main)
    except SystemExit as e:
        if e.code is None or e.code == 0:
            returned()
        else:
            exited(e.code)
        settle()
        raise
    except BaseException as e:
        if stacks:
            ended(stacks, e)
        settle()
        raise
    returned()
    settle()


if __name__ == "__main__":
    _slurmlaunch_main()
