#!/usr/bin/env bash
# Installs everything the test suite needs and runs all of it:
#   - Debian's Slurm (slurmctld, slurmd, slurm-client) for the real multi-node cluster the tests start,
#     with accounting (slurmdbd on MariaDB) so that sacct, which submitit polls, sees exact states,
#     iproute2 (`ip`) for the networked cluster (each node its own network namespace and address),
#     Open MPI (openmpi-bin) for a real mpirun, PMIx's development files (libpmix-dev: its unversioned
#     libpmix.so is what Slurm's mpi/pmix plugin loads, so that `srun --mpi=pmix` starts MPI ranks; mpi4py's
#     wheel loads Open MPI's libmpi.so.40 itself, no compiler needed), and OpenSSH (server and client) with
#     rsync for --remote (the tests start their own sshd on 127.0.0.1, never the system service);
#   - OpenPBS in /opt/pbs for the real multi-host PBS cluster (slurmlaunch dev-cluster up --scheduler pbs);
#   - a virtual environment .venv with torch==2.13.0 (the CPU build where pip's configuration finds one, as on the
#     project's machines; PyPI's own is the CUDA one) and slurmlaunch with its test and docs extras.
#   - the unit layer (tests/core, tests/render) on Python 3.10 and 3.13 as well (pyenv's; each its own venv),
#     and the sdist and wheel as users get them (tests/check_wheel.sh).
# It prints the wall time of each phase at the end, failed or not, and pytest prints the slowest tests.
# Usage: bash tests/run.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

run_start=$(date +%s)
phase_start=$run_start
phase="install"
phases=()
phase_done() {  # the phase that just ended, then the name of the next one
    local now
    now=$(date +%s)
    phases+=("$(printf '%-52s %5d s' "$phase" $((now - phase_start)))")
    phase_start=$now
    phase="$1"
}
print_phases() {
    local rc=$?
    [ "$phase" = "done" ] || phases+=("$(printf '%-52s %5d s  (ended here, exit %d)' "$phase" $(($(date +%s) - phase_start)) "$rc")")
    echo "tests/run.sh: wall time per phase"
    printf '  %s\n' "${phases[@]}"
    printf '  %-52s %5d s\n' "total" $(($(date +%s) - run_start))
}
trap print_phases EXIT

packages=(slurmctld slurmd slurm-client openmpi-bin libpmix-dev slurmdbd slurm-wlm-mysql-plugin mariadb-server-core
          mariadb-client-core iproute2 openssh-server openssh-client rsync)
# mkfs.ext4: the output-directory fault tests build a small shared file system (tests/real/test_batch_faults.py)
packages+=(e2fsprogs)
# sshfs: the latency shared file system of issue 42 (tests/real/test_sharedfs.py, benchmarks/stage_env_fs.py)
packages+=(sshfs)
# Slurm's Torque-style qsub/qstat/qdel (tests/real/test_pbs_torque_wrappers.py): their Perl libraries from apt; the
# wrappers themselves are unpacked below, never installed, so that no /usr/bin/qsub stands before OpenPBS's
packages+=(libslurm-perl libslurmdb-perl libswitch-perl)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "tests/run.sh: not root, cannot install ${missing[*]}: the real-Slurm tests will skip" >&2
    fi
fi

# slurm-wlm-torque unpacked (dpkg -x) into /opt/slurm-wlm-torque: installed, it would put Slurm's qsub in
# /usr/bin for every test and register its mpirun as an alternative; its qsub runs the sbatch beside it.
torque=/opt/slurm-wlm-torque
if [ "$(id -u)" -eq 0 ] && [ ! -x "$torque/usr/bin/qsub" ]; then
    deb_dir="$(mktemp -d)"
    (cd "$deb_dir" && chown _apt "$deb_dir" 2>/dev/null; apt-get download -qq slurm-wlm-torque) &&
        dpkg -x "$deb_dir"/slurm-wlm-torque_*.deb "$torque" &&
        for tool in sbatch salloc srun; do ln -sf "/usr/bin/$tool" "$torque/usr/bin/$tool"; done ||
        echo "tests/run.sh: could not unpack slurm-wlm-torque into $torque" >&2
    rm -rf "$deb_dir"
fi

python3 -m venv .venv
# Byte-compiled on both cores (compileall -j 0) instead of by pip on one: 28 + 16 s against pip's 54 s (measured
# 2026-12-07). Compiled they must be: under PYTHONDONTWRITEBYTECODE (set on the project's machines) nothing else
# writes them, and every rank would compile torch's modules again (a CI run without them took 216 s longer)
.venv/bin/python -m pip install -q --no-compile --disable-pip-version-check torch==2.13.0 -e ".[test,docs]"
# It exits 1 for the few files in a newer Python's syntax (torch/testing/_internal/py312_intrinsics.py), as pip's did
# silently; any other failure shows as a missing .pyc, which costs time, not correctness
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    > /dev/null || true
# OpenPBS for the real PBS cluster (tests/conftest.py pbs_cluster): an existing /opt/pbs, else the shared .deb
# (its Depends from apt; about 40 s), else a build of the shared source (about 7 minutes); it says which.
# SLURMLAUNCH_OPENPBS_DIR names the directory with them (default ../shared/openpbs, beside this checkout).
export SLURMLAUNCH_OPENPBS_DIR="${SLURMLAUNCH_OPENPBS_DIR:-$(cd .. && pwd)/shared/openpbs}"
if [ "$(id -u)" -eq 0 ]; then
    .venv/bin/python -c "from slurmlaunch.app.devcluster.pbs import install; print('tests/run.sh:', install())"
else
    echo "tests/run.sh: not root, cannot install OpenPBS: the real-PBS tests will skip" >&2
fi
bash tests/install_slurm_current.sh  # Slurm 25.11 in /opt/slurm-25.11, beside Debian's 22.05 (tests/slurm_current.py)
# The unit layer on the other Python versions the package claims (pyproject's classifiers), in the background
# beside pytest, at a lower priority. No torch wheel of 2.13.0 for them here: the few unit tests that need torch or
# mpi4py skip there (CI unset for that run) and run on 3.11 below.
unit_pids=()
for version in 3.10 3.13; do
    interp="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/python 2>/dev/null | tail -1)"
    if [ -z "$interp" ]; then
        if [ "${CI:-}" = "true" ]; then echo "tests/run.sh: no Python $version (pyenv) for the unit layer" >&2; exit 1; fi
        echo "tests/run.sh: no Python $version (pyenv): its unit layer is not run" >&2
        continue
    fi
    (
        renice -n 10 -p "$BASHPID" > /dev/null
        "$interp" -m venv ".venv-py$version" &&
        { ".venv-py$version/bin/python" -m pip install -q --disable-pip-version-check -e ".[unit]" 2>&1 |
              grep -v -e "is ignored" -e "DEPRECATION" || true; } &&
        env -u CI ".venv-py$version/bin/python" -m pytest -q -n 0 -p no:cacheprovider --durations=0 --durations-min=60 \
            tests/core tests/render > ".venv-py$version/unit.log" 2>&1
    ) &
    unit_pids+=("$!:$version")
done
# Lint, types, contracts, the docs build and the wheel's check run beside pytest (at a lower priority: they fill
# the CPU the suite leaves while it waits on Slurm's timers), each timed on its own; their verdict comes after.
checks_log=.venv/checks.log
(
    renice -n 10 -p "$BASHPID" > /dev/null
    children_cpu() {  # sets cpu: the CPU seconds (user + system) of this shell's waited-for children so far, from
        times > .venv/checks.cpu  # bash's times, redirected: in a pipe or $(...) it would count a subshell's children
        cpu=$(tail -1 .venv/checks.cpu | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }
                                                printf "%d", t }')
    }
    check() {  # NAME COMMAND...: one line with its own wall and CPU time; the first failure ends the chain
        local name="$1" t0 c0 rc=0
        shift
        t0=$(date +%s)
        children_cpu
        c0=$cpu
        "$@" || rc=$?
        children_cpu
        printf '  %-52s %5d s  (%d s CPU)%s\n' "$name (beside pytest)" $(($(date +%s) - t0)) $((cpu - c0)) \
            "$([ "$rc" -eq 0 ] || echo "  (exit $rc)")" >> .venv/checks.times
        return "$rc"
    }
    : > .venv/checks.times
    check "lint, types, layer contracts" sh -c '.venv/bin/python -m ruff check slurmlaunch tests examples benchmarks docs/hooks &&
        .venv/bin/python -m mypy && .venv/bin/lint-imports --no-cache' &&  # layers: docs/explanation/architecture.md
    # The documentation site: a broken internal link, a missing page or a page outside the nav fails (mkdocs.yml)
    check "docs build" env NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir .venv/docs-site &&
    check "sdist, wheel, a job from the wheel" bash tests/check_wheel.sh .venv/bin/python
) > "$checks_log" 2>&1 &
checks_pid=$!
phase_done "pytest"
export PATH="$PWD/.venv/bin:$PATH"
# Workers (pytest-xdist): much of the suite's time is spent waiting on Slurm (time limits, requeues, sacct),
# so workers overlap those waits: 4 on 2 cores. Clean-clone CI runs of the same tree, idle machine (2026-12-07):
# 3 workers pytest 1179 s, the CPUs idle 25% of it; 4 workers 1027 s, idle 12%. (An earlier try of 4, before the
# slow tests went first and the checks beside pytest, took as long as 3.) Each worker
# is a session of its own with its own clusters and sshd (tests/conftest.py), its ports and job ids from a slot of
# its own on this machine (tests/ports.py). -n 0 runs it in one process.
cpu_ticks() {  # the machine's busy and idle (idle + iowait) clock ticks so far, from /proc/stat's cpu line
    local _ user nice system idle iowait irq softirq steal
    read -r _ user nice system idle iowait irq softirq steal _ < /proc/stat
    echo "$((user + nice + system + irq + softirq + steal)) $((idle + iowait))"
}
# CPU seconds per test, each worker's own and its children's (tests/cpu_account.py): printed after the durations
export SLURMLAUNCH_TEST_CPU_DIR="$PWD/.venv/test-cpu"
rm -rf "$SLURMLAUNCH_TEST_CPU_DIR"
# each failure as it comes: a line on stderr, the whole report in this file (tests/conftest.py)
export SLURMLAUNCH_TEST_FAILURES_LOG="$PWD/.venv/failures.log"
rm -f "$SLURMLAUNCH_TEST_FAILURES_LOG"
read -r busy0 idle0 < <(cpu_ticks)
# and every minute's idle share, to tell idle at the start (clusters coming up), in the middle (every worker
# waiting on a timer at once) and at the end (the last tests alone)
(while sleep 60; do cpu_ticks; done > .venv/cpu.ticks) &
sampler_pid=$!
rc=0
.venv/bin/python -m pytest -n "${SLURMLAUNCH_TEST_WORKERS:-4}" --dist loadgroup "$@" || rc=$?
read -r busy1 idle1 < <(cpu_ticks)
kill "$sampler_pid" 2> /dev/null || true
echo "tests/run.sh: the CPUs' idle % in each minute of pytest:" \
     "$( { echo "$busy0 $idle0"; cat .venv/cpu.ticks; } | awk 'NR > 1 { b = $1 - pb; i = $2 - pi; printf "%d ", 100 * i / (b + i + 1) }
                                                               { pb = $1; pi = $2 }')"
# Whether more workers could help: a suite that leaves the CPUs idle waits on timers, not on the CPUs
echo "tests/run.sh: the CPUs were idle $(( 100 * (idle1 - idle0) / (busy1 - busy0 + idle1 - idle0 + 1) ))% of pytest's time;" \
     "busy for $(( (busy1 - busy0) / $(getconf CLK_TCK) )) CPU s (the workers' share: above)"
phase_done "the checks and unit layers beside pytest (the rest)"
if ! wait "$checks_pid"; then
    cat "$checks_log"
    echo "tests/run.sh: lint, types, contracts, the docs build or the wheel's check failed (above)" >&2
    rc=1
fi
while IFS= read -r line; do phases+=("${line#  }"); done < .venv/checks.times
for entry in "${unit_pids[@]}"; do
    if ! wait "${entry%%:*}"; then
        tail -30 ".venv-py${entry#*:}/unit.log"
        echo "tests/run.sh: the unit layer failed on Python ${entry#*:} (.venv-py${entry#*:}/unit.log)" >&2
        rc=1
    else
        echo "tests/run.sh: unit layer on Python ${entry#*:}: $(tail -1 ".venv-py${entry#*:}/unit.log")"
    fi
done
phase_done "done"
exit "$rc"
