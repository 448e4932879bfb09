#!/usr/bin/env bash
# The README's first command on a machine that has never seen the project:
# a minimal Debian 12 root (debootstrap --variant=minbase), a clone of this
# checkout's HEAD in it, and `./scripts/demo.sh` run there under chroot
# (with /proc, /sys, /dev and /dev/pts mounted). The run must install what
# it needs itself and end with the demo's table and the Python package's
# call from .venv.
#
#   scripts/fresh_machine.sh [VARIANT ...]      (default: libblas-dev)
#
# Variants: `bare` (the minbase root as it is) and `libblas-dev` (the
# reference BLAS installed first: its cblas.h must not stand in for
# OpenBLAS). Needs root, debootstrap and Debian's package mirror.
#
# Cache (FXA_FRESH_CACHE, default build-fresh/ in the checkout): the
# bootstrapped root as a tarball, made once, and the .deb files apt
# downloads, kept between runs so that each package is fetched once per
# cache. Every root starts again from the tarball, so the check still sees a
# machine without any of the project's dependencies installed.
#
# Each variant first runs the command with an apt-get that installs
# nothing: scripts/deps.sh must then name the missing OpenBLAS and fail
# before CMake runs. Then the real run, which must find OpenBLAS missing
# (whatever BLAS is there), install it and end with the demo's table.
#
# Every mount is removed and the root deleted on exit, also on failure or
# interruption (each command inside the root runs under FXA_FRESH_TIMEOUT
# seconds, default 1200, so the script ends a stuck run itself); processes still running inside the root (by PID, found by
# their root folder) are ended first. Exit 0 when every variant printed the
# demo's table, else 1.
set -euo pipefail
# The whole script is one compound command, read before it runs, so that
# editing this file while a check runs cannot change what the run does.
{
cd "$(dirname "$0")/.."
src=$(pwd)
mirror=${FXA_FRESH_MIRROR:-http://deb.debian.org/debian}
cache=${FXA_FRESH_CACHE:-$src/build-fresh}
limit=${FXA_FRESH_TIMEOUT:-1200} # seconds for each command run inside the root
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(libblas-dev)
for v in "${variants[@]}"; do
    case "$v" in bare | libblas-dev) ;; *)
        echo "fresh_machine.sh: unknown variant '$v' (bare, libblas-dev)" >&2
        exit 2
        ;;
    esac
done
if [ "$(id -u)" -ne 0 ]; then # debootstrap, chroot and mount need root
    command -v sudo >/dev/null || { echo "fresh_machine.sh: needs root or sudo" >&2; exit 2; }
    exec sudo FXA_FRESH_MIRROR="$mirror" FXA_FRESH_CACHE="$cache" FXA_FRESH_TIMEOUT="$limit" \
        "$0" "$@"
fi
command -v debootstrap >/dev/null || { echo "fresh_machine.sh: needs debootstrap" >&2; exit 2; }
git -C "$src" rev-parse HEAD >/dev/null

mkdir -p "$cache/apt-archives/partial"
tarball=$cache/debian12-minbase.tar

work=""
root=""
# Folders mounted under $root, innermost last (unmounted in reverse).
mounts=()

in_root_pids() {
    local p r
    for p in /proc/[0-9]*; do
        r=$(readlink "$p/root" 2>/dev/null) || continue
        [ "$r" = "$root" ] && echo "${p#/proc/}"
    done
    return 0
}

cleanup() {
    local rc=0 i pids
    set +e
    if [ -n "$root" ]; then
        pids=$(in_root_pids)
        [ -n "$pids" ] && kill $pids 2>/dev/null && sleep 1
        pids=$(in_root_pids)
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null
        for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
            umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}"
        done
        mounts=()
        if grep -q " $root[/ ]" /proc/self/mountinfo; then
            echo "fresh_machine.sh: error: mounts left under $root; not deleting it" >&2
            rc=1
        else
            rm -rf --one-file-system "$work"
        fi
        root=""
    fi
    set -e
    return $rc
}
trap 'rc=$?; cleanup || rc=1; exit $rc' EXIT
trap 'exit 130' INT TERM

bootstrap() {
    [ -s "$tarball" ] && return 0
    local t0=$SECONDS tmp
    tmp=$(mktemp -d /var/tmp/fxa-bootstrap.XXXXXX)
    echo "fresh_machine.sh: debootstrap --variant=minbase bookworm ($mirror)"
    if ! timeout -k 10 "$limit" debootstrap --variant=minbase bookworm "$tmp/root" "$mirror" \
        >"$cache/debootstrap.log" 2>&1; then
        tail -20 "$cache/debootstrap.log" >&2
        rm -rf --one-file-system "$tmp"
        echo "fresh_machine.sh: error: debootstrap failed" >&2
        return 1
    fi
    tar -C "$tmp/root" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf --one-file-system "$tmp"
    echo "fresh_machine.sh: bootstrapped and cached in $((SECONDS - t0)) s"
}

mount_into() { # mount_into TARGET mount-args...
    local target=$1
    shift
    mkdir -p "$target"
    mount "$@" "$target"
    mounts+=("$target")
}

# A command inside the root, under a deadline (so that this script, not an
# outer timeout that kills it outright, ends a stuck run and cleans up), in
# the background so that a signal reaches the traps at once.
# The host's pip settings travel with its resolv.conf (the network's, not
# the project's): PIP_* variables, with a CA bundle that PIP_CERT names
# copied in (a registry that re-signs TLS), so that the demo's
# `pip install .` reaches PyPI from the root as from the host.
pip_env=()
while IFS= read -r line; do
    case "$line" in PIP_CERT=*) pip_env+=("PIP_CERT=/etc/fxa-host-pip-ca.crt") ;; *) pip_env+=("$line") ;; esac
done < <(env | grep '^PIP_[A-Z_]*=' || true)
in_chroot() {
    timeout -k 10 "$limit" chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${pip_env[@]}" "$@" &
    wait $!
}

run_variant() {
    local v=$1 t0=$SECONDS log
    work=$(mktemp -d /var/tmp/fxa-fresh.XXXXXX)
    root=$work/root
    log=$cache/$v.log
    mkdir "$root"
    tar -C "$root" -xf "$tarball"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    [ -z "${PIP_CERT:-}" ] || cp "$PIP_CERT" "$root/etc/fxa-host-pip-ca.crt"
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" # no daemons start
    chmod +x "$root/usr/sbin/policy-rc.d"
    mount_into "$root/proc" -t proc proc
    mount_into "$root/sys" -t sysfs sysfs
    mount_into "$root/dev" --bind /dev
    mount_into "$root/dev/pts" --bind /dev/pts
    mount_into "$root/var/cache/apt/archives" --bind "$cache/apt-archives"
    git clone --quiet "$src" "$root/root/fxattn"
    echo "fresh_machine.sh: [$v] $(git -C "$root/root/fxattn" log --oneline -1)"
    # First with an apt-get that installs nothing: deps.sh must name what is
    # still missing and fail before CMake runs.
    mkdir -p "$root/root/noapt"
    printf '#!/bin/sh\nexit 0\n' >"$root/root/noapt/apt-get"
    chmod +x "$root/root/noapt/apt-get"
    local rc=0
    in_chroot env PATH=/root/noapt:/usr/sbin:/usr/bin:/sbin:/bin \
        bash -c 'cd /root/fxattn && ./scripts/demo.sh' >"$log.noapt" 2>&1 || rc=$?
    if [ $rc -eq 0 ] || ! grep -q "deps.sh: error: OpenBLAS library (libopenblas.so) is still missing" "$log.noapt" ||
        [ -e "$root/root/fxattn/build/CMakeCache.txt" ]; then
        cat "$log.noapt"
        echo "fresh_machine.sh: FAIL [$v]: with nothing installed, demo.sh exited $rc" \
            "without naming the missing OpenBLAS before CMake"
        cleanup
        return 1
    fi
    rm -rf "$root/root/noapt"
    rc=0
    {
        if [ "$v" = libblas-dev ]; then
            in_chroot apt-get update -qq &&
                in_chroot env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libblas-dev
        fi &&
            in_chroot bash -c 'cd /root/fxattn && ./scripts/demo.sh'
    } >"$log" 2>&1 || rc=$?
    cleanup || return 1
    tail -12 "$log"
    if [ $rc -ne 0 ]; then
        echo "fresh_machine.sh: FAIL [$v]: the README's first command exited $rc (log: $log)"
        return 1
    fi
    # The demo's table: its header and the three rows.
    if ! grep -q "^mode  *time (s)  *GFLOP/s" "$log" || ! grep -q "^fixed-max (auto) " "$log" ||
        ! grep -q "^online softmax " "$log" || ! grep -q "^fp64 exact max " "$log"; then
        echo "fresh_machine.sh: FAIL [$v]: no demo table in the output (log: $log)"
        return 1
    fi
    # Then the Python package, installed into .venv, called once.
    if ! grep -q "^python: fxattn .* in .venv: attention (1, 256, 8, 64) float32, lse (1, 8, 256)" "$log"; then
        echo "fresh_machine.sh: FAIL [$v]: the Python package did not run from .venv (log: $log)"
        return 1
    fi
    # With the reference BLAS there, OpenBLAS must still have been missing.
    if ! grep -q "deps.sh: missing: OpenBLAS library" "$log"; then
        echo "fresh_machine.sh: FAIL [$v]: deps.sh did not find OpenBLAS missing (log: $log)"
        return 1
    fi
    echo "fresh_machine.sh: ok [$v]: demo table printed, $((SECONDS - t0)) s from a bare root"
}

bootstrap
fail=0
for v in "${variants[@]}"; do
    run_variant "$v" || fail=1
done
exit $fail
}
