#!/usr/bin/env bash
# ARM Linux correctness check without an ARM machine (`make arm-check`; docs/arm.md):
#   1. exports tiny DIP bundles (tiny-llama, ρ = 0.5; BQ4 and VQ3) on this x86-64 machine with the project venv;
#   2. runs a fixed input through its model.onnx (16 teacher-forced positions + 8 greedy tokens) with
#      onnxruntime on x86-64, stock and with the native op library (build/custom_ops/x86_64);
#   3. runs the same driver (scripts/arm/compare.py) with an aarch64 Python 3.11 and the aarch64 wheels of
#      numpy/onnxruntime/tokenizers under qemu-user (scripts/arm/sysroot.sh), stock and with the NEON
#      build of the library (build/custom_ops/aarch64), once per emulated CPU model: cortex-a76 (Raspberry
#      Pi 5; NEON + dotprod, no SVE) and max (SVE2, i8mm, bf16: ORT may take other MLAS kernels there);
#   4. with each of these runs, also generates with the host runtime (dipdeploy.runtime.Engine, what
#      `dipdeploy run` uses: per-layer graphs, DRAM slabs at a 50% budget over the bundle's mlp.bin);
#   5. compares every run with x86 stock: greedy tokens equal, max |Δlogit| ≤ $ARM_CHECK_TOLERANCE, for
#      model.onnx and for the engine.
# Exits non-zero on a mismatch or when anything is missing. Timings under qemu mean nothing.
#
# Needs: qemu-aarch64 (apt-get install qemu-user), the libraries of `make ops` for both arches
# (aarch64 needs g++-aarch64-linux-gnu), the venv of `make setup`, network once for the sysroot.
# Environment: VENV (default .venv), DIPDEPLOY_CACHE (sysroot cache), ARM_CHECK_OUT (work folder, default
# build/arm-check; kept for inspection), ARM_CHECK_QUANTS (default "bq4 vq3"; also: none, bq4-b32, ...;
# bq4-a4 = BQ4 at accuracy level 4, not in the default list: MLAS's int8 MatMulNBits gives other logits on
# aarch64 than on x86 (measured on tiny-llama: max |Δlogit| 0.66 and other greedy tokens, while stock and
# native agree exactly on each arch; our level-4 SparseGatherMatMul is integer-exact on both, see
# custom_ops/tests/dd_test_kernels.cc)),
# ARM_CHECK_CPUS (qemu -cpu models, default "cortex-a76 max"), ARM_CHECK_TOLERANCE (default 1e-3),
# ARM_CHECK_ENGINE (default 1; 0 skips the host runtime).
#
# Tolerance: both sides compute in float32 (the export's MatMulNBits use accuracy level 0, and the native
# kernels accumulate in float32), so the differences are rounding from another summation order (MLAS AVX2/
# AVX-512 vs NEON GEMMs, the AVX2 vs NEON SparseGatherMatMul kernels): ~1e-7 on logits of magnitude ~0.5.
# 1e-3 is far above that and well below what a real difference gives: measured here, the BQ4 bundle at
# ρ = 0.508 instead of 0.497 (one or two more columns selected per row) moves the teacher-forced logits by
# up to 1.9e-2. Greedy tokens must match exactly (the tiny random model's top-2 gaps go down to ~5e-4, so
# this is the stricter test for BQ4).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
venv="${VENV:-.venv}"
out="${ARM_CHECK_OUT:-build/arm-check}"
quants="${ARM_CHECK_QUANTS:-bq4 vq3}"
tolerance="${ARM_CHECK_TOLERANCE:-1e-3}"
cpus="${ARM_CHECK_CPUS:-cortex-a76 max}"
engine=()
if [ "${ARM_CHECK_ENGINE:-1}" != 0 ]; then engine=(--engine); fi
lib_x86="$root/build/custom_ops/x86_64/libdipdeploy_ops.so"
lib_arm="$root/build/custom_ops/aarch64/libdipdeploy_ops.so"

die() { echo "arm-check: $*" >&2; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
t_all="$(now)"

[ "$(uname -m)" = x86_64 ] || die "this check runs aarch64 under qemu on an x86-64 host; on an ARM machine run the runtime natively (docs/arm.md)"
command -v qemu-aarch64 >/dev/null || die "qemu-aarch64 not found (apt-get install qemu-user)"
[ -x "$venv/bin/python" ] || die "no venv at $venv (make setup)"
[ -f "$lib_x86" ] || die "$lib_x86 missing (make ops)"
[ -f "$lib_arm" ] || die "$lib_arm missing (make ops with g++-aarch64-linux-gnu installed)"

t="$(now)"
sysroot="$(bash scripts/arm/sysroot.sh)"
echo "arm-check: aarch64 sysroot $sysroot ($(secs "$t") s)"
[ -x "$sysroot/usr/bin/python3.11" ] && [ -f "$sysroot/proc/cpuinfo" ] || die "incomplete sysroot $sysroot (rerun scripts/arm/sysroot.sh --force)"

# The aarch64 Python: ORT's cpuinfo reads /proc/cpuinfo at load and crashes on the x86 host's. qemu -L
# already redirects /proc/cpuinfo to the sysroot's Cortex-A76-like copy; where we may (root, or user
# namespaces) we also bind-mount it over /proc/cpuinfo in a private mount namespace, the recipe of
# docs/onnxruntime.md, so nothing depends on qemu's path lookup alone.
arm_wrap=()
if unshare -m --propagation private sh -c 'mount --bind "$0" /proc/cpuinfo' "$sysroot/proc/cpuinfo" 2>/dev/null; then
  arm_wrap=(unshare -m --propagation private sh -c 'mount --bind "$0" /proc/cpuinfo && exec "$@"'
            "$sysroot/proc/cpuinfo")
  cpuinfo_how="unshare -m + bind-mounted fake /proc/cpuinfo"
else
  cpuinfo_how="qemu -L redirect to the sysroot's fake /proc/cpuinfo (unshare -m not permitted here)"
fi
run_arm() {  # run_arm CPU ARGS...: the driver under qemu-aarch64 -cpu CPU
  local cpu="$1"; shift
  env -u DIPDEPLOY_OPS_LIB PYTHONPATH="$sysroot/site-packages:$root" PYTHONNOUSERSITE=1 \
    PYTHONDONTWRITEBYTECODE=1 "${arm_wrap[@]}" qemu-aarch64 -cpu "$cpu" -L "$sysroot" \
    "$sysroot/usr/bin/python3.11" scripts/arm/compare.py "$@" --cpu "qemu $cpu"
}
# Both sides import dipdeploy from this checkout (PYTHONPATH first), also when the venv holds another copy.
run_x86() { env -u DIPDEPLOY_OPS_LIB PYTHONPATH="$root" "$venv/bin/python" scripts/arm/compare.py "$@"; }

mkdir -p "$out"
rm -rf "$out"/bundle-* "$out"/*.npz "$out"/export-*.log
status=0
for q in $quants; do
  bundle="$out/bundle-$q"
  t="$(now)"
  # --rho-in: a uniform plan, no calibration data; few validation tokens (the driver checks more).
  # A "-a4" suffix (bq4-a4) exports at accuracy level 4 (int8 activations and coefficients).
  level=0
  case "$q" in *-a4) level=4 ;; esac
  if ! PYTHONPATH="$root" "$venv/bin/dipdeploy" export --model tiny-llama --method dip --density 0.5 --rho-in 0.55 \
       --quant "${q%-a4}" --accuracy-level "$level" --validate-tokens 4 --out "$bundle" --force >"$out/export-$q.log" 2>&1; then
    cat "$out/export-$q.log" >&2
    die "export of the tiny bundle ($q) failed"
  fi
  echo "arm-check: exported tiny-llama dip ρ=0.5 $q -> $bundle ($(secs "$t") s)"
  run_x86 expose --bundle "$bundle"  # the selections as graph outputs, for the near-tie-aware comparison

  t="$(now)"
  run_x86 run "${engine[@]}" --bundle "$bundle" --out "$out/$q-x86_64-stock.npz"
  run_x86 run "${engine[@]}" --bundle "$bundle" --out "$out/$q-x86_64-native.npz" --native "$lib_x86"
  echo "arm-check: x86_64 runs ($(secs "$t") s)"

  t="$(now)"
  echo "arm-check: aarch64 under qemu-user ($cpuinfo_how)"
  runs=("$out/$q-x86_64-stock.npz" "$out/$q-x86_64-native.npz")
  for cpu in $cpus; do
    run_arm "$cpu" run "${engine[@]}" --bundle "$bundle" --out "$out/$q-aarch64-$cpu-stock.npz"
    run_arm "$cpu" run "${engine[@]}" --bundle "$bundle" --out "$out/$q-aarch64-$cpu-native.npz" --native "$lib_arm"
    runs+=("$out/$q-aarch64-$cpu-stock.npz" "$out/$q-aarch64-$cpu-native.npz")
  done
  echo "arm-check: aarch64 runs ($(secs "$t") s)"

  echo "arm-check: $q"
  run_x86 compare --tolerance "$tolerance" "${runs[@]}" || status=1
done
echo "arm-check: total $(secs "$t_all") s; files in $out"
exit "$status"
