#!/usr/bin/env bash
# Packaging as users get it (tests/run.sh runs this): build the sdist and the wheel (no setuptools warning about
# the project's own configuration), install the wheel into a fresh venv outside the checkout, and run a 2-node job
# on the local default (in the foreground: every rank's output) from another directory, with a script of its own;
# every rank must report its place.
# Usage: bash tests/check_wheel.sh PYTHON   (PYTHON: the one with `build` installed, .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-.venv/bin/python}"
work="$(mktemp -d /tmp/slurmlaunch-wheel-XXXXXX)"
trap 'rm -rf "$work"' EXIT
"$py" -m build --outdir "$work/dist" . > "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
# Any warning but the one PYTHONDONTWRITEBYTECODE brings (byte-compiling disabled, an environment's choice); the
# lines that only name a file the build copies or adds (allocation/warning.py) are no warning
if grep -iE "warning|Package would be ignored" "$work/build.log" | grep -v "byte-compiling is disabled" |
        grep -vE "^(copying|adding) "; then
    echo "check_wheel: the build warns about the project's configuration (above; whole log: python -m build)" >&2
    exit 1
fi
wheel=("$work"/dist/slurmlaunch-*.whl)
[ -f "$work"/dist/slurmlaunch-*.tar.gz ] || { echo "check_wheel: no sdist in $work/dist" >&2; exit 1; }
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "${wheel[0]}" 2>&1 | grep -v "is ignored" || true
"$work/venv/bin/python" -c "import slurmlaunch" || { echo "check_wheel: the wheel did not install" >&2; exit 1; }
mkdir "$work/elsewhere"
cat > "$work/elsewhere/where_am_i.py" <<'PY'
import os
print("place", os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["NODE_RANK"], os.environ["LOCAL_RANK"],
      flush=True)
PY
(cd "$work/elsewhere" && env -u SLURM_CONF -u PBS_SERVER PATH="$work/venv/bin:/usr/bin:/bin" \
    slurmlaunch submit --scheduler local --nodes 2 --tasks-per-node 2 where_am_i.py) > "$work/job.log" 2>&1 ||
    { cat "$work/job.log"; echo "check_wheel: the 2-node job failed" >&2; exit 1; }
got="$(grep -o 'place [0-9 ]*' "$work/job.log" | sort | tr '\n' ';')"
want="place 0 4 0 0;place 1 4 0 1;place 2 4 1 0;place 3 4 1 1;"
if [ "$got" != "$want" ]; then
    cat "$work/job.log"
    echo "check_wheel: ranks reported '$got', expected '$want'" >&2
    exit 1
fi
echo "check_wheel: sdist and wheel built; the wheel ran a 2-node job of 4 ranks from $work/elsewhere"
