#!/usr/bin/env bash
# Installs the current Slurm the tests run beside Debian's 22.05 (tests/real/test_slurm_current.py): SchedMD's
# 25.11.7 built for Debian 12, unpacked from the shared tarball into /opt/slurm-25.11 (its prefix, plugin and
# configuration directories are compiled in, so it lives there or nowhere), with the runtime packages it
# links against that Debian's own Slurm does not bring. Idempotent: a second run checks and changes nothing.
# Usage: bash tests/install_slurm_current.sh [DIR]
#   DIR: the folder with slurm-25.11.7-debian12-amd64.tar.xz and SHA256SUMS (default $SLURMLAUNCH_SLURM_DIR,
#   else ../shared/slurm beside this checkout). Not root, or no tarball: says so and exits 0 (the tests
#   then skip, and fail under CI=true); a tarball whose checksum does not match, or an install that does
#   not run, exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

version=25.11.7
prefix=/opt/slurm-25.11
tarball=slurm-$version-debian12-amd64.tar.xz
dir="${1:-${SLURMLAUNCH_SLURM_DIR:-$(cd .. && pwd)/shared/slurm}}"
# The shared README's list: what slurmctld, slurmd, slurmdbd, the clients and their plugins load.
packages=(munge libmunge2 libjson-c5 libyaml-0-2 libhwloc15 libmariadb3 libjwt0 libhttp-parser2.9 libpmix2
          libdbus-1-3 libnuma1 libjansson4 libb64-0d liblz4-1 xz-utils)
say() { echo "tests/install_slurm_current.sh: $*" >&2; }

installed_version() {  # the version the installed slurmctld reports, empty when it does not run
    "$prefix/sbin/slurmctld" -V 2>/dev/null | awk '{print $2}' || true
}

if [ "$(id -u)" -ne 0 ]; then
    say "not root, cannot install Slurm $version into $prefix: the Slurm $version tests will skip"
    exit 0
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq  # a fresh machine has no package lists
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Workers and engineers of one machine may run this at once: one unpacks, the others wait and find it done.
exec 9>/tmp/slurmlaunch-install-slurm-current.lock
flock -w 300 9 || { say "waited 300 s for another install of Slurm $version (/tmp/slurmlaunch-install-slurm-current.lock)"; exit 1; }

if [ "$(installed_version)" = "$version" ]; then
    say "Slurm $version already in $prefix"
else
    if [ ! -f "$dir/$tarball" ]; then
        say "no $dir/$tarball (set SLURMLAUNCH_SLURM_DIR): Slurm $version not installed, its tests will skip"
        exit 0
    fi
    (cd "$dir" && sha256sum --quiet -c SHA256SUMS) || { say "$dir/$tarball: checksum does not match SHA256SUMS"; exit 1; }
    # Unpacked beside its place and moved there whole: an interrupted run leaves no half-filled prefix.
    staging="$(mktemp -d /opt/.slurm-25.11-staging.XXXXXX)"
    trap 'rm -rf "$staging"' EXIT
    tar -xJf "$dir/$tarball" -C "$staging"
    rm -rf "$prefix"
    mv "$staging/slurm-25.11" "$prefix"
    say "Slurm $version unpacked into $prefix"
fi

# It runs: the controller reports its version, and the daemons, the clients and the plugins the dev cluster
# loads resolve every library (a missing one shows here, not in the first test).
got="$(installed_version)"
[ "$got" = "$version" ] || { say "$prefix/sbin/slurmctld -V says '${got:-nothing}', not $version"; exit 1; }
unresolved="$(ldd "$prefix"/sbin/* "$prefix"/bin/* \
    "$prefix"/lib/slurm/{accounting_storage_mysql,select_cons_tres,gres_gpu,mpi_pmix}.so 2>&1 |
    awk '/^\//{file=$1} /not found/{print file, $1}' || true)"
[ -z "$unresolved" ] || { say "libraries missing for Slurm $version: $unresolved"; exit 1; }
