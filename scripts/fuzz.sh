#!/usr/bin/env bash
# Build the libFuzzer targets (tests/fuzz/) with clang -fsanitize=fuzzer,address,undefined and
# run them one after another on a fresh copy of their committed seed corpus.
#
#   scripts/fuzz.sh [SECONDS]   fuzz each target for SECONDS (default 60)
#   scripts/fuzz.sh --smoke     CI: each target once over its corpus (-runs=0), then 2000 runs
#
# Prints, per target: executions, exec/s, and whether it crashed (the fuzzer exited non-zero;
# crash inputs land in $FUZZ_BUILD_DIR/work/TARGET/artifacts/ and are shown as hex).
# The committed corpus (tests/fuzz/corpus/) is only read; new inputs go to the copy.
# Exit status: 0 all targets clean; 1 a target crashed or did not build; 2 bad usage;
# 77 no clang with libFuzzer here (a skip; FUZZ_REQUIRE_CLANG=1 makes it 1 instead).
# Environment: FUZZ_CC (compiler; default clang, else clang-14), FUZZ_BUILD_DIR (default
# build-fuzz), FUZZ_TARGETS (default "npy args safetensors"; e.g. FUZZ_TARGETS=safetensors
# scripts/fuzz.sh 60 runs one target), FUZZ_TMPDIR (where fuzz_npy makes its private folder;
# default /dev/shm when writable, else the target's work folder).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root="$(pwd)"

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
    exit 2
}

smoke=0
seconds=60
case "${1:-}" in
"") ;;
--smoke) smoke=1 ;;
-h | --help) usage ;;
*)
    if [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -gt 0 ]; then
        seconds="$1"
    else
        usage
    fi
    ;;
esac
[ $# -le 1 ] || usage

build="${FUZZ_BUILD_DIR:-build-fuzz}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
targets="${FUZZ_TARGETS:-npy args safetensors}"

skip() {
    echo "fuzz.sh: $*" >&2
    if [ "${FUZZ_REQUIRE_CLANG:-0}" = 1 ]; then
        echo "fuzz.sh: FUZZ_REQUIRE_CLANG=1: failing instead of skipping" >&2
        exit 1
    fi
    echo "fuzz.sh: SKIPPED (install clang with libFuzzer: apt-get install clang)" >&2
    exit 77
}

# ---- compiler -----------------------------------------------------------------------------
cc="${FUZZ_CC:-}"
if [ -z "$cc" ]; then
    for c in clang clang-14; do
        if command -v "$c" >/dev/null 2>&1; then
            cc="$c"
            break
        fi
    done
fi
if [ -z "$cc" ] || ! command -v "$cc" >/dev/null 2>&1; then
    skip "no clang found (FUZZ_CC=${FUZZ_CC:-unset})"
fi

mkdir -p "$build/obj" || exit 1
san="-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cat >"$build/obj/probe.c" <<'EOF'
int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);
int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n)
{
    (void)d;
    (void)n;
    return 0;
}
EOF
# shellcheck disable=SC2086
if ! "$cc" $san -o "$build/obj/probe" "$build/obj/probe.c" >"$build/obj/probe.log" 2>&1; then
    cat "$build/obj/probe.log" >&2
    skip "$cc cannot build a libFuzzer target (-fsanitize=fuzzer,address,undefined)"
fi

# ---- build --------------------------------------------------------------------------------
# fxattn.h includes the generated fxattn_version.h: made here from its template
# with the version of the top-level CMakeLists.txt, as CMake's configure_file does.
version=$(sed -n 's/^project(fxattn VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
IFS=. read -r v_major v_minor v_patch <<<"$version"
mkdir -p "$build/include"
sed -e "s/@PROJECT_VERSION_MAJOR@/$v_major/; s/@PROJECT_VERSION_MINOR@/$v_minor/" \
    -e "s/@PROJECT_VERSION_PATCH@/$v_patch/; s/@PROJECT_VERSION@/$version/" \
    include/fxattn_version.h.in >"$build/include/fxattn_version.h"
cflags="-std=c11 -D_GNU_SOURCE -g -O1 $san -Iinclude -I$build/include -Itools/fxattn/cli -Itools/fxattn/cmd -Isrc"
warn="-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wmissing-prototypes -Wstrict-prototypes"

target_sources() { # the fuzz target first, then the library files it tests
    case "$1" in
    npy) echo "tests/fuzz/fuzz_npy.c src/io/npy.c src/io/staged.c src/io/file_io.c" ;;
    args) echo "tests/fuzz/fuzz_args.c tools/fxattn/cli/cli_args.c tools/fxattn/cli/cmd_opts.c" ;;
    safetensors)
        echo "tests/fuzz/fuzz_safetensors.c src/io/safetensors.c src/io/json.c src/io/file_io.c src/core/convert.c"
        ;;
    *) return 1 ;;
    esac
}
max_len() { case "$1" in npy | safetensors) echo 4096 ;; args) echo 2048 ;; esac; }

build_target() {
    local t="$1" srcs objs="" first=1 src obj extra
    srcs="$(target_sources "$t")" || { echo "fuzz.sh: unknown target '$t'" >&2; return 1; }
    for src in $srcs; do
        obj="$build/obj/$(basename "${src%.c}").o"
        # The fuzz target must be warning-free; library files only show their warnings.
        extra=""
        [ "$first" = 1 ] && extra="-Werror"
        first=0
        # shellcheck disable=SC2086
        "$cc" $cflags $warn $extra -c -o "$obj" "$src" || return 1
        objs="$objs $obj"
    done
    # shellcheck disable=SC2086
    "$cc" $san -o "$build/fuzz_$t" $objs -lm -lpthread || return 1
}

echo "fuzz.sh: building with $("$cc" --version | head -n 1) into $build"
for t in $targets; do
    if ! build_target "$t"; then
        echo "fuzz.sh: building fuzz_$t failed" >&2
        exit 1
    fi
done

# ---- run ----------------------------------------------------------------------------------
# Runs the fuzzer, appending to $log; prints nothing. Returns the fuzzer's exit status.
run_fuzzer() {
    local t="$1"
    shift
    local work="$build/work/$t" tmpdir="$build/work/$t/tmp"
    # fuzz_npy rewrites one file per input: tmpfs is faster than a disk.
    if [ -n "${FUZZ_TMPDIR:-}" ]; then
        tmpdir="$FUZZ_TMPDIR"
    elif [ -d /dev/shm ] && [ -w /dev/shm ]; then
        tmpdir=/dev/shm
    fi
    TMPDIR="$tmpdir" \
        ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" \
        UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
        "$build/fuzz_$t" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -dict="tests/fuzz/$t.dict" -artifact_prefix="$work/artifacts/" \
        "$@" "$work/corpus" >>"$work/log" 2>&1
}

# Sum of stat::number_of_executed_units over the runs in a log (0 if none printed).
executions() {
    awk '/^stat::number_of_executed_units:/ { n += $2 } END { print n + 0 }' "$1"
}

summary=()
failed=0
for t in $targets; do
    work="$build/work/$t"
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/artifacts" "$work/tmp"
    cp "tests/fuzz/corpus/$t/"* "$work/corpus/" 2>/dev/null || true
    : >"$work/log"
    start=$(date +%s.%N)
    if [ "$smoke" = 1 ]; then
        seeds=$(find "$work/corpus" -type f | wc -l)
        echo "fuzz.sh: fuzz_$t: smoke run over $seeds seeds, then 2000 runs"
        run_fuzzer "$t" -runs=0 && run_fuzzer "$t" -runs=2000 -seed=1
        rc=$?
    else
        echo "fuzz.sh: fuzz_$t: fuzzing for ${seconds}s (log: $work/log)"
        run_fuzzer "$t" -max_total_time="$seconds"
        rc=$?
    fi
    wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    runs=$(executions "$work/log")
    if [ "$runs" = 0 ]; then # crashed before the final stats: take the last "#N" status line
        runs=$(grep -oE '^#[0-9]+' "$work/log" | tail -n 1 | tr -d '#')
        runs=${runs:-0}
    fi
    # exec/s over the wall time of the fuzzer runs (start-up and corpus loading included).
    rate=$(awk -v n="$runs" -v s="$wall" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')
    if [ "$rc" = 0 ]; then
        verdict="no crash"
    else
        verdict="CRASHED (exit $rc)"
        failed=1
        echo "fuzz.sh: fuzz_$t exited $rc; end of its log:" >&2
        tail -n 60 "$work/log" >&2
        for f in "$work/artifacts"/*; do
            [ -f "$f" ] || continue
            echo "fuzz.sh: crash input $f ($(wc -c <"$f") bytes), reproduce: $build/fuzz_$t $f" >&2
            od -An -tx1 -v "$f" | head -n 64 >&2
        done
    fi
    summary+=("$(printf '%-16s %12s executions %9s exec/s %7ss wall  %s' "fuzz_$t" "$runs" \
        "$rate" "$wall" "$verdict")")
done

echo "fuzz.sh: results ($([ "$smoke" = 1 ] && echo smoke || echo "${seconds}s per target")):"
for line in "${summary[@]}"; do
    echo "  $line"
done
exit "$failed"
