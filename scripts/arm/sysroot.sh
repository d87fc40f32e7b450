#!/usr/bin/env bash
# Prints the path of a cached aarch64 sysroot for running dipdeploy's runtime under qemu-user:
#   scripts/arm/sysroot.sh [--force]
#
# $DIPDEPLOY_CACHE/arm64-sysroot (default ~/.cache/dipdeploy/arm64-sysroot) holds
#   usr/bin/python3.11, lib/, usr/lib/  Debian bookworm arm64 .debs (python3.11 and the libraries it and
#                                       the wheels need), unpacked with dpkg -x (nothing is installed)
#   site-packages/                      the PyPI aarch64 wheels of the runtime (numpy, onnxruntime,
#                                       tokenizers; --no-deps: ORT's Python deps are not needed to run)
#   proc/cpuinfo                        a Cortex-A76-like cpuinfo (see below)
# Run it with: qemu-aarch64 -L SYSROOT SYSROOT/usr/bin/python3.11, PYTHONPATH=SYSROOT/site-packages
# (scripts/arm/check.sh does). See docs/onnxruntime.md, "ARM without an ARM machine".
#
# Idempotent: each part is built into a temporary directory, renamed into place, and stamped with what
# it was built from; a rerun with the same inputs touches nothing and needs no network. The wheels are
# pinned to the versions of the project venv ($VENV, default .venv) so both sides run the same ORT and
# numpy; $DIPDEPLOY_ARM_WHEELS (e.g. "onnxruntime==1.32.0 numpy==2.4.6 tokenizers==0.23.3") overrides.
# The debs come from this machine's apt sources, read with a private apt state under
# $DIPDEPLOY_CACHE/arm64-apt (apt -o APT::Architecture=arm64), so the host's dpkg is never touched.
#
# proc/cpuinfo: ORT's cpuinfo library segfaults before main under qemu when /proc/cpuinfo is the x86 host's.
# qemu-user -L resolves an absolute path inside the prefix first when the file exists there, so
# SYSROOT/proc/cpuinfo is what the aarch64 process reads; check.sh also bind-mounts it over /proc/cpuinfo
# inside `unshare -m` when it may.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${DIPDEPLOY_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/dipdeploy}"
sysroot="$cache/arm64-sysroot"
aptdir="$cache/arm64-apt"
wheeldir="$cache/arm64-wheels"
venv="${VENV:-$root/.venv}"
force=0

case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

# Debian arm64 packages: the interpreter, its stdlib, and the shared libraries of the stdlib modules and
# of the wheels (libstdc++/libgcc for onnxruntime and the native op library). Not the curses/readline/
# dbm/nis modules' libraries: nothing here imports them.
DEBS=(libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libssl3 libffi8 libbz2-1.0 liblzma5 libcrypt1
      libuuid1 libsqlite3-0 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib)
RUNTIME_WHEELS=(onnxruntime numpy tokenizers)
# A manylinux_2_28 wheel runs on bookworm (glibc 2.36); tokenizers publishes only manylinux_2_17 for aarch64.
PLATFORMS=(manylinux_2_28_aarch64 manylinux_2_17_aarch64 manylinux2014_aarch64)

die() { echo "sysroot.sh: $*" >&2; exit 1; }
log() { echo "sysroot.sh: $*" >&2; }

apt_opts=(-q -o APT::Architecture=arm64 -o APT::Architectures::=arm64
          -o Dir::State::Lists="$aptdir/lists" -o Dir::Cache="$aptdir/cache"
          -o Dir::State::status="$aptdir/status" -o APT::Sandbox::User=root)

apt_update() {
  mkdir -p "$aptdir/lists/partial" "$aptdir/cache/archives/partial"
  touch "$aptdir/status"
  log "apt-get update (arm64 package lists, private state in $aptdir)"
  apt-get "${apt_opts[@]}" update >"$aptdir/update.log" 2>&1 \
    || { tail -n 5 "$aptdir/update.log" >&2; die "apt-get update for arm64 failed (see $aptdir/update.log; are the Debian mirrors of /etc/apt/sources.list* reachable?)"; }
}

fetch_debs() {
  command -v apt-get >/dev/null && command -v dpkg >/dev/null || die "needs apt-get and dpkg (a Debian host)"
  mkdir -p "$aptdir/debs"
  # A stale package list names versions the mirror no longer has: refresh it once and retry.
  local try updated=0
  for try in 1 2; do
    if [ "$updated" = 0 ] && { [ "$try" = 2 ] || ! ls "$aptdir/lists/"*_Packages* >/dev/null 2>&1; }; then
      apt_update; updated=1
    fi
    rm -f "$aptdir/debs/"*.deb
    if (cd "$aptdir/debs" && apt-get "${apt_opts[@]}" download "${DEBS[@]}") >"$aptdir/download.log" 2>&1; then
      return 0
    fi
    [ "$updated" = 1 ] && break
    log "apt-get download failed; refreshing the package lists and retrying"
  done
  grep -E "^(E|W):" "$aptdir/download.log" >&2 || tail -n 5 "$aptdir/download.log" >&2
  die "apt-get download of the arm64 debs failed (see $aptdir/download.log): ${DEBS[*]}"
}

wheel_specs() {
  if [ -n "${DIPDEPLOY_ARM_WHEELS:-}" ]; then echo "$DIPDEPLOY_ARM_WHEELS"; return; fi
  local specs=() n v
  for n in "${RUNTIME_WHEELS[@]}"; do
    v=""
    if [ -x "$venv/bin/python" ]; then
      v="$("$venv/bin/python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$n" 2>/dev/null || true)"
    fi
    specs+=("$n${v:+==$v}")
  done
  echo "${specs[*]}"
}

pip_cmd() {
  if [ -x "$venv/bin/python" ]; then echo "$venv/bin/python -m pip"; return; fi
  python3 -m pip --version >/dev/null 2>&1 && { echo "python3 -m pip"; return; }
  die "needs pip: the project venv ($venv, \`make setup\`) or python3 -m pip"
}

fake_cpuinfo() {  # 4 Cortex-A76 cores (implementer 0x41 Arm, part 0xd0b), the features of a Raspberry Pi 5
  local i
  for i in 0 1 2 3; do
    printf 'processor\t: %d\nBogoMIPS\t: 108.00\n' "$i"
    printf 'Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\n'
    printf 'CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\nCPU part\t: 0xd0b\nCPU revision\t: 1\n\n'
  done
}

mkdir -p "$cache"
exec 9>"$cache/arm64-sysroot.lock"
flock 9 2>/dev/null || true  # one builder at a time (flock is util-linux; without it, carry on)

# 1. Debian part.
deb_stamp="${DEBS[*]}"
if [ "$force" = 1 ] || [ "$(cat "$sysroot/.debs" 2>/dev/null)" != "$deb_stamp" ]; then
  fetch_debs
  tmp="$(mktemp -d "$cache/arm64-sysroot.tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  for deb in "$aptdir/debs/"*.deb; do dpkg -x "$deb" "$tmp" || die "dpkg -x $deb failed"; done
  [ -x "$tmp/usr/bin/python3.11" ] || die "no usr/bin/python3.11 after unpacking the debs"
  mkdir -p "$tmp/proc"
  fake_cpuinfo >"$tmp/proc/cpuinfo"
  echo "$deb_stamp" >"$tmp/.debs"
  rm -rf "$sysroot"
  mv "$tmp" "$sysroot"
  trap - EXIT
  log "unpacked ${#DEBS[@]} arm64 debs into $sysroot"
fi
[ -f "$sysroot/proc/cpuinfo" ] || { mkdir -p "$sysroot/proc"; fake_cpuinfo >"$sysroot/proc/cpuinfo"; }

# 2. Wheels.
specs="$(wheel_specs)"
wheel_stamp="$specs | ${PLATFORMS[*]}"
if [ "$force" = 1 ] || [ "$(cat "$sysroot/site-packages/.wheels" 2>/dev/null)" != "$wheel_stamp" ]; then
  pip="$(pip_cmd)"
  plat=()
  for p in "${PLATFORMS[@]}"; do plat+=(--platform "$p"); done
  tmp="$(mktemp -d "$cache/arm64-wheels.tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  log "pip download (aarch64, cp311): $specs"
  # shellcheck disable=SC2086
  $pip download --disable-pip-version-check -q --dest "$tmp/dl" "${plat[@]}" --only-binary=:all: \
      --python-version 3.11 --implementation cp --no-deps $specs >"$tmp/pip.log" 2>&1 \
    || { grep -v "is ignored: it is neither" "$tmp/pip.log" >&2; die "pip download of the aarch64 wheels failed: $specs"; }
  mkdir -p "$wheeldir" "$tmp/site-packages"
  for w in "$tmp/dl/"*.whl; do
    case "$(basename "$w")" in *aarch64*|*-none-any.whl) ;; *) die "not an aarch64 wheel: $(basename "$w")" ;; esac
    cp -f "$w" "$wheeldir/"
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$tmp/site-packages" \
      || die "unzipping $(basename "$w") failed"
  done
  (cd "$tmp/dl" && ls -1 ./*.whl | sed 's|^\./||') >"$tmp/site-packages/.wheel-files"
  echo "$wheel_stamp" >"$tmp/site-packages/.wheels"
  rm -rf "$sysroot/site-packages"
  mv "$tmp/site-packages" "$sysroot/site-packages"
  rm -rf "$tmp"
  trap - EXIT
  log "unpacked $(wc -l <"$sysroot/site-packages/.wheel-files") wheels into $sysroot/site-packages"
fi

echo "$sysroot"
