#!/usr/bin/env bash
# Builds the dipdeploy custom-op library: custom_ops/build.sh [--arch x86_64|aarch64|all] [--force] [--sanitize]
#
# 1. Fetches the ONNX Runtime 1.29 C headers once into a cache outside the repository
#    ($DIPDEPLOY_CACHE, default ~/.cache/dipdeploy): no PyPI wheel or Debian package ships them; the npm
#    package below holds them inside its Android AAR (docs/onnxruntime.md). Never commit them.
# 2. Configures and builds with CMake into build/custom_ops/<arch>/libdipdeploy_ops.so (gitignored).
#    aarch64 is cross-built when aarch64-linux-gnu-g++ is installed (apt-get install g++-aarch64-linux-gnu);
#    with --arch all it is skipped with a message otherwise.
# 3. --sanitize: this machine's arch only, with ASan + UBSan (CMake DD_SANITIZE), into
#    build/custom_ops-asan/ instead; custom_ops/sanitize.sh (`make ops-sanitize`) builds and runs it.
set -euo pipefail

ORT_NPM_PACKAGE="com.github.asus4.onnxruntime@0.4.9"
ORT_VERSION="1.29.0"
ORT_API_VERSION=29

root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DIPDEPLOY_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/dipdeploy}"
headers="$cache/ort-headers/$ORT_VERSION/headers"
arch="$(uname -m)"
force=0
sanitize=0

usage() { echo "usage: $0 [--arch x86_64|aarch64|all] [--force] [--sanitize]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) [ $# -ge 2 ] || usage; arch="$2"; shift 2 ;;
    --force) force=1; shift ;;
    --sanitize) sanitize=1; shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
case "$arch" in x86_64|aarch64|all) ;; *) echo "--arch must be x86_64, aarch64 or all, got '$arch'" >&2; exit 2 ;; esac
if [ "$sanitize" = 1 ] && [ "$arch" != "$(uname -m)" ]; then
  echo "--sanitize builds for this machine only ($(uname -m)), not --arch $arch: the sanitized build runs here" >&2
  exit 2
fi

fetch_headers() {
  if [ -f "$headers/onnxruntime_c_api.h" ]; then return 0; fi
  command -v npm >/dev/null || { echo "npm is needed once to fetch the ORT headers (apt-get install npm)" >&2; exit 1; }
  mkdir -p "$cache/ort-headers"
  local tmp; tmp="$(mktemp -d "$cache/ort-headers/fetch.XXXXXX")"
  trap 'rm -rf "$tmp"' RETURN
  echo "fetching ORT $ORT_VERSION headers from npm ($ORT_NPM_PACKAGE, ~150 MB, once) into $cache" >&2
  (cd "$tmp" && npm pack --silent "$ORT_NPM_PACKAGE" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/Plugins/Android/onnxruntime.aar
  python3 - "$tmp/package/Plugins/Android/onnxruntime.aar" "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("headers/")])
PY
  grep -q "#define ORT_API_VERSION $ORT_API_VERSION\$" "$tmp/x/headers/onnxruntime_c_api.h" || {
    echo "the fetched headers are not ORT API $ORT_API_VERSION" >&2; exit 1; }
  mkdir -p "$(dirname "$headers")"
  rm -rf "$headers"
  mv "$tmp/x/headers" "$headers"
}

build_one() {
  local a="$1" out="$root/build/custom_ops/$1"
  local extra=()
  if [ "$sanitize" = 1 ]; then
    out="$root/build/custom_ops-asan"
    extra=(-DDD_SANITIZE=ON)
  fi
  if [ "$a" != "$(uname -m)" ]; then
    local cxx="$a-linux-gnu-g++"
    command -v "$cxx" >/dev/null || return 3
    extra+=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR="$a" -DCMAKE_CXX_COMPILER="$cxx")
  fi
  if [ "$force" = 1 ]; then rm -rf "$out"; fi
  cmake -S "$root/custom_ops" -B "$out" -DORT_INCLUDE_DIR="$headers" "${extra[@]}" >/dev/null || return 1
  cmake --build "$out" -j 2 >/dev/null || return 1
  echo "$out/libdipdeploy_ops.so"
}

fetch_headers
archs=("$arch")
if [ "$arch" = all ]; then archs=(x86_64 aarch64); fi
for a in "${archs[@]}"; do
  set +e; build_one "$a"; rc=$?; set -e
  if [ "$rc" = 3 ]; then
    msg="no $a-linux-gnu-g++: skipping the $a build (apt-get install g++-aarch64-linux-gnu)"
    if [ "$arch" = all ]; then echo "$msg" >&2; else echo "$msg" >&2; exit 1; fi
  elif [ "$rc" != 0 ]; then
    exit "$rc"
  fi
done
