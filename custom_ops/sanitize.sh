#!/usr/bin/env bash
# The op library under AddressSanitizer + UndefinedBehaviorSanitizer (`make ops-sanitize`):
#   custom_ops/sanitize.sh [PYTHON]        (PYTHON: default .venv/bin/python of the checkout)
#
# 1. Builds the library and dd_test_kernels with -fsanitize=address,undefined -fno-sanitize-recover=all
#    into build/custom_ops-asan/ (build.sh --sanitize).
# 2. For every kernel set (DIPDEPLOY_OPS_ISA=portable, avx2, and the CPU's best) runs dd_test_kernels
#    and the op tests that feed the library bad and hostile input (ORT_TESTS) against that library
#    ($DIPDEPLOY_OPS_LIB). Python is not built with ASan, so libasan is preloaded, with libstdc++
#    beside it: ASan's exception interceptor needs libstdc++'s __cxa_throw at start-up, and Python
#    loads libstdc++ only later (with onnxruntime). Leak checking is off: the interpreter never frees
#    some of its memory at exit.
#    The Flash store's native reads (src/io/) and the native cache step (src/cache/), no kernel
#    set involved, run once: the native cases of IO_TESTS, the random-trace cases of CACHE_TESTS, and the
#    cache step inside a graph (GRAPH_TESTS: the CacheStep/CacheSettle ops, per token and in a batched
#    prefill, the step split in CacheBegin/CacheEnd, a read-ahead (CachePrefetch) handed to CacheBegin, and
#    the joined decoder with O_DIRECT reads, whose reads overlap the products and the attention, token by
#    token and batched).
# 3. Counts the distinct sanitizer reports in each stage's output; fails on any report or failed test.
# Each stage's log is kept in build/custom_ops-asan/logs/.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
py="${1:-$root/.venv/bin/python}"
out="$root/build/custom_ops-asan"
ORT_TESTS=(tests/test_ops_harness.py tests/test_ops_errors.py tests/test_ops_hostile.py)
IO_TESTS=(tests/test_flash_direct.py -k "(threads or io_uring) and not run_through")
CACHE_TESTS=(tests/test_native_cache.py -k "not engine")
# the cache step inside a graph (CacheStep/CacheSettle, both readers) and one joined decoder reading with O_DIRECT
GRAPH_TESTS=(tests/test_runtime_fused.py -k "cache_step_op or split_the_step or read_ahead_hands or batched_prefill_take or (decodes and direct and standard) or (batched_prefill_is and direct) or (reading_ahead and standard) or draft_mode")
KERNEL_SETS=(portable avx2 default)
# A report's first line (UBSan: file:line:col: runtime error: ...); a failing test may print it twice.
REPORT='[^ ]+:[0-9]+:[0-9]+: runtime error: .*|ERROR: (Address|Leak)Sanitizer: .*|AddressSanitizer: CHECK failed: .*'

[ -x "$py" ] || { echo "no Python at $py (make setup, or pass one)" >&2; exit 2; }
bash "$root/custom_ops/build.sh" --sanitize >/dev/null
cxx="${CXX:-g++}"
libasan="$("$cxx" -print-file-name=libasan.so)"
libstdcxx="$("$cxx" -print-file-name=libstdc++.so.6)"
for f in "$libasan" "$libstdcxx"; do
  [ -f "$f" ] || { echo "$cxx does not find $(basename "$f") (install its sanitizer runtime)" >&2; exit 1; }
done
export ASAN_OPTIONS="detect_leaks=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
logs="$out/logs"
rm -rf "$logs"
mkdir -p "$logs"

failed=0
# reports LOG: the distinct report lines of LOG (addresses and pids masked).
reports() { { grep -oE "$REPORT" "$1" || true; } | sed -E 's/0x[0-9a-f]+/0x_/g; s/pid=[0-9]+|tid=[0-9]+/_/g' | sort -u; }
# stage NAME COMMAND...: runs COMMAND with its output in logs/NAME.log, prints the report count.
stage() {
  local name="$1" log="$logs/$1.log" rc=0 n
  shift
  "$@" >"$log" 2>&1 || rc=$?
  n="$(reports "$log" | wc -l)"
  printf '%-20s exit %-3s distinct sanitizer reports %s\n' "$name" "$rc" "$n"
  if [ "$rc" != 0 ] || [ "$n" != 0 ]; then
    failed=1
    reports "$log" | head -20 >&2
    tail -5 "$log" >&2
  fi
}

cd "$root"
for isa in "${KERNEL_SETS[@]}"; do
  cap="$isa"
  [ "$isa" = default ] && cap=""
  stage "kernels-$isa" env DIPDEPLOY_OPS_ISA="$cap" "$out/dd_test_kernels"
  # --capture=sys: a sanitizer writes to file descriptor 2, which then reaches the log even when it
  # ends the process.
  stage "ort-tests-$isa" env DIPDEPLOY_OPS_ISA="$cap" DIPDEPLOY_OPS_LIB="$out/libdipdeploy_ops.so" \
    LD_PRELOAD="$libasan $libstdcxx" "$py" -m pytest -o addopts= -q --capture=sys -p no:cacheprovider "${ORT_TESTS[@]}"
  grep -hE '^kernel set: |[0-9]+ passed' "$logs/kernels-$isa.log" "$logs/ort-tests-$isa.log" | sed 's/^/    /'
done
stage "io-tests" env DIPDEPLOY_OPS_LIB="$out/libdipdeploy_ops.so" LD_PRELOAD="$libasan $libstdcxx" \
  "$py" -m pytest -o addopts= -q --capture=sys -p no:cacheprovider "${IO_TESTS[@]}"
grep -hE '[0-9]+ passed' "$logs/io-tests.log" | sed 's/^/    /'
stage "cache-tests" env DIPDEPLOY_OPS_LIB="$out/libdipdeploy_ops.so" LD_PRELOAD="$libasan $libstdcxx" \
  "$py" -m pytest -o addopts= -q --capture=sys -p no:cacheprovider "${CACHE_TESTS[@]}"
grep -hE '[0-9]+ passed' "$logs/cache-tests.log" | sed 's/^/    /'
stage "graph-step-tests" env DIPDEPLOY_OPS_LIB="$out/libdipdeploy_ops.so" LD_PRELOAD="$libasan $libstdcxx" \
  "$py" -m pytest -o addopts= -q --capture=sys -p no:cacheprovider "${GRAPH_TESTS[@]}"
grep -hE '[0-9]+ passed' "$logs/graph-step-tests.log" | sed 's/^/    /'
if [ "$failed" != 0 ]; then
  echo "ops-sanitize: FAILED (logs in $logs)" >&2
  exit 1
fi
echo "ops-sanitize: ok, no sanitizer reports"
