"""What --stage-env saves one rank (issue 42), counted on the client: the file-system calls that
`import torch, torch.distributed` makes on the environment's prefix, run from the prefix itself (the shared
copy) and from an unpacked copy of the pack --stage-env makes (the node-local copy). strace -f counts them.

    python benchmarks/stage_env_ops.py [PREFIX]      # default: this interpreter's sys.prefix

It also times and counts the content key (what decides whether the cache has the pack) and times the
first pack. Not a timed test: one run, numbers printed. The server-side count on a latency file system (issue
42 part 2) is not measured here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from slurmlaunch.allocation.stage import content_key, ensure_pack

IMPORT = "import torch, torch.distributed"
_PATH = re.compile(r'^(?:\d+ +)?\w+\((?:AT_FDCWD, |-?\d+, )?"([^"]*)"')  # strace -f -o: "PID  call("path"


def calls_under(python: str, root: str) -> tuple[int, int]:
    """(file-system calls naming a path under ``root``, all file-system calls) of one import."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as log:
        subprocess.run(["strace", "-f", "-qq", "-e", "trace=%file,read", "-o", log.name, python, "-c", IMPORT],
                       check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        lines = log.read().splitlines()
    under = sum(1 for ln in lines if (m := _PATH.match(ln)) and m[1].startswith(root.rstrip("/") + "/"))
    return under, len(lines)


def key_calls(prefix: str) -> int:
    """The file-system calls (strace -f -c -e trace=%file,getdents64) of content_key(prefix), less those of
    the same interpreter doing nothing."""
    def count(code: str) -> int:
        done = subprocess.run(["strace", "-f", "-c", "-e", "trace=%file,getdents64", sys.executable, "-c", code],
                              capture_output=True, text=True, check=True)
        total = [ln for ln in done.stderr.splitlines() if ln.rstrip().endswith("total")]
        return int(total[-1].split()[3]) if total else 0
    base = "import slurmlaunch.allocation.stage"
    return count(f"{base}; slurmlaunch.allocation.stage.content_key({prefix!r})") - count(base)


def main() -> int:
    prefix = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else sys.prefix)
    work = tempfile.mkdtemp(prefix="stage-bench-")
    try:
        t = time.monotonic()
        content_key(prefix)
        print(f"content key of {prefix}: {time.monotonic() - t:.2f} s, {key_calls(prefix)} file-system calls")
        t = time.monotonic()
        pack, packed, _ = ensure_pack(prefix, os.path.join(work, "cache"), lambda c: subprocess.run(c).returncode)
        print(f"first pack: {packed / 2**20:.0f} MiB in {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        again = ensure_pack(prefix, os.path.join(work, "cache"), lambda c: 1)
        print(f"second job: pack found (made={again[2]}) in {time.monotonic() - t:.2f} s")
        local = os.path.join(work, "node-local")
        os.mkdir(local)
        subprocess.run(["tar", "-C", local, "-xf", pack], check=True)
        shared_under, shared_all = calls_under(os.path.join(prefix, "bin", "python"), prefix)
        staged_shared, staged_all = calls_under(os.path.join(local, "bin", "python"), prefix)
        staged_local, _ = calls_under(os.path.join(local, "bin", "python"), local)
        print(f"one rank's `{IMPORT}`: from the shared prefix {shared_under} calls on it ({shared_all} in all); "
              f"staged: {staged_shared} on the shared prefix, {staged_local} on the node-local copy "
              f"({staged_all} in all)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
