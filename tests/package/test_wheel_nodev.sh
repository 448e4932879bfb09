#!/usr/bin/env bash
# The manylinux wheel on a machine that has only a Python: a minimal Debian
# 12 root (the tarball scripts/fresh_machine.sh bootstraps and caches, made
# here when missing) with python3 and python3-venv installed and nothing
# else: no compiler, no -dev package, no OpenBLAS, oneDNN or Open MPI. The
# wheel (from test_package's WHEELDIR) goes into a virtual environment there
# (numpy from PyPI), and under chroot:
#   - fxattn.attention on numpy arrays against an fp64 numpy reference, and
#     the Wan layer (the bundled OpenBLAS, oneDNN and libgomp);
#   - `fxattn info`, and `fxattn attn` on .npy files against the same
#     reference (the console script runs fxattn-nompi: no libmpi here);
#   - `import fxattn.mpi` raises ImportError naming Open MPI's runtime and
#     the apt-get command, `fxattn attn --ulysses 2` fails naming it too.
# Needs root, Debian's package mirror and PyPI (the host's PIP_* settings
# and resolv.conf are copied in, as fresh_machine.sh does).
# Usage: test_wheel_nodev.sh WHEELDIR
# Cache: FXA_FRESH_CACHE (default build-fresh/ in the checkout), shared with
# fresh_machine.sh (ctest runs the two under one RESOURCE_LOCK).
set -euo pipefail
{
src=$(cd "$(dirname "$0")/../.." && pwd)
wheel=$(ls "$1"/fxattn-*-py3-none-manylinux_*_x86_64.whl)
mirror=${FXA_FRESH_MIRROR:-http://deb.debian.org/debian}
cache=${FXA_FRESH_CACHE:-$src/build-fresh}
limit=${FXA_FRESH_TIMEOUT:-600}
tarball=$cache/debian12-minbase.tar
fail() { echo "test_wheel_nodev: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, chroot, mount)"
command -v debootstrap >/dev/null || fail "needs debootstrap"
mkdir -p "$cache/apt-archives/partial"
t0=$SECONDS

if [ ! -s "$tarball" ]; then # the same root as fresh_machine.sh's bootstrap
    tmp=$(mktemp -d /var/tmp/fxa-bootstrap.XXXXXX)
    timeout -k 10 "$limit" debootstrap --variant=minbase bookworm "$tmp/root" "$mirror" \
        >"$cache/debootstrap.log" 2>&1 || { tail -20 "$cache/debootstrap.log" >&2; rm -rf --one-file-system "$tmp"; fail "debootstrap"; }
    tar -C "$tmp/root" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf --one-file-system "$tmp"
fi

work=$(mktemp -d /var/tmp/fxa-nodev.XXXXXX)
root=$work/root
mounts=()
cleanup() {
    local i p r
    set +e
    for p in /proc/[0-9]*; do # processes still inside the root
        r=$(readlink "$p/root" 2>/dev/null) && [ "$r" = "$root" ] && kill -9 "${p#/proc/}" 2>/dev/null
    done
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}"
    done
    if grep -q " $root[/ ]" /proc/self/mountinfo; then
        echo "test_wheel_nodev: mounts left under $root; not deleting it" >&2
    else
        rm -rf --one-file-system "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mount_into() { mkdir -p "$1" && mount "${@:2}" "$1" && mounts+=("$1"); }

mkdir "$root"
tar -C "$root" -xf "$tarball"
cp /etc/resolv.conf "$root/etc/resolv.conf"
[ -z "${PIP_CERT:-}" ] || cp "$PIP_CERT" "$root/etc/fxa-host-pip-ca.crt"
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" && chmod +x "$root/usr/sbin/policy-rc.d"
mount_into "$root/proc" -t proc proc
mount_into "$root/dev" --bind /dev
mount_into "$root/var/cache/apt/archives" --bind "$cache/apt-archives"
mkdir -p "$root/opt/wheel"
cp "$wheel" "$root/opt/wheel/"
cp "$src/tests/package/nodev_check.py" "$root/opt/nodev_check.py"
pip_env=()
while IFS= read -r line; do
    case "$line" in PIP_CERT=*) pip_env+=("PIP_CERT=/etc/fxa-host-pip-ca.crt") ;; *) pip_env+=("$line") ;; esac
done < <(env | grep '^PIP_[A-Z_]*=' || true)
in_root() {
    timeout -k 10 "$limit" chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
        PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${pip_env[@]}" "$@" &
    wait $!
}
log=$work/log
{
    in_root apt-get update -qq &&
        in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv
} >"$log" 2>&1 || { tail -20 "$log"; fail "apt-get install python3 python3-venv"; }

# What the root does not have.
in_root bash -c '! command -v cc && ! command -v gcc && ! command -v mpirun' >/dev/null ||
    fail "the root has a compiler or mpirun"
devs=$(in_root dpkg-query -W -f '${Package}\n' | grep -E -- '-dev$|^(gcc|g\+\+|cpp|clang)(-[0-9]+)?$|^(lib)?openmpi|^libopenblas|^libdnnl' || true)
[ -z "$devs" ] || fail "the root has packages it must not have: $devs"
libs=$(in_root /sbin/ldconfig -p | grep -E 'libmpi\.so|libopenblas|libdnnl|libgomp' || true)
[ -z "$libs" ] || fail "the root has libraries it must not have: $libs"
echo "ok: Debian 12 root with python3 and python3-venv only (no compiler, -dev package, OpenBLAS, oneDNN, Open MPI)"

in_root python3 -m venv /opt/venv >>"$log" 2>&1 || { tail -20 "$log"; fail "python3 -m venv"; }
in_root pip install --quiet "/opt/wheel/$(basename "$wheel")" >>"$log" 2>&1 ||
    { tail -20 "$log"; fail "pip install $(basename "$wheel")"; }
echo "ok: pip install $(basename "$wheel") (numpy from PyPI)"
in_root bash -c 'mkdir -p /opt/run && cd /opt/run && python /opt/nodev_check.py' || fail "nodev_check.py"
echo "test_wheel_nodev: passed in $((SECONDS - t0)) s"
}
