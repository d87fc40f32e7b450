#!/usr/bin/env bash
# The pip user's path (docs/install.md), as CI's `make wheel-check`: build the wheel from this checkout,
# install it into a fresh venv, and drive it as a user would, from outside the checkout.
#   1. runtime-only: no torch and no matplotlib pulled in; `models`; `run` on a bundle on the wheel's own
#      op library (not the ONNX fallback); a torch command (`export`) refused in one line naming the extra;
#   2. with the torch extra (torch 2.13.0, the CPU build): `export` of a tiny model, and `run` of that bundle.
# usage: scripts/wheel_check.sh [CHECKOUT_PYTHON]   (default .venv/bin/python; it builds the wheel and exports
# the bundle of step 1, as a user's other machine would)
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-.venv/bin/python}"
py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"  # absolute, the venv's own (not the symlink's target)
work="$(mktemp -d "${TMPDIR:-/tmp}/dipdeploy-wheel.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "wheel-check: FAILED: $*" >&2; exit 1; }
step() { echo "wheel-check: $*" >&2; }

step "building the wheel"
"$py" -m pip wheel -q --no-deps -w "$work/dist" . >/dev/null
wheel="$(ls "$work"/dist/dipdeploy-*.whl)"
case "$(basename "$wheel")" in
  *-py3-none-linux_*) ;;
  *) fail "$(basename "$wheel") is not a platform wheel: it holds no op library (did custom_ops/build.sh fail?)" ;;
esac
# (not `unzip -l | grep -q`: under pipefail, grep's early exit fails the pipeline by SIGPIPE)
"$py" -c 'import sys, zipfile; sys.exit(sys.argv[2] not in zipfile.ZipFile(sys.argv[1]).namelist())' \
  "$wheel" "dipdeploy/ops/lib/$(uname -m)/libdipdeploy_ops.so" || fail "the wheel holds no op library"

step "installing $(basename "$wheel") into a fresh venv (runtime only)"
python3 -m venv "$work/venv"
v="$work/venv/bin"
"$v/pip" install -q "$wheel" >/dev/null
for heavy in torch transformers matplotlib onnxscript; do
  if "$v/python" -c "import $heavy" 2>/dev/null; then fail "the runtime-only install pulled $heavy"; fi
done
cd "$work"  # from here on, nothing of the checkout is on the path
"$v/dipdeploy" models >/dev/null

step "run: a bundle exported by the checkout, on the wheel's op library"
DIPDEPLOY_OPS_LIB= "$(dirname "$py")/dipdeploy" export --model tiny-llama --method dip-ca --rho-in 0.5 --out "$work/tiny" \
  >/dev/null 2>"$work/export0.txt" || { cat "$work/export0.txt" >&2; fail "the checkout's export of tiny-llama failed"; }
"$v/dipdeploy" run "$work/tiny" -p "hello" -n 8 --json "$work/run.json" >"$work/out.txt" 2>"$work/err.txt" \
  || { cat "$work/err.txt" >&2; fail "run from the wheel failed"; }
"$v/python" - "$work/run.json" "$v" <<'PY' || fail "run from the wheel did not use the wheel's op library"
import json, sys
run = json.load(open(sys.argv[1]))
assert run["native"] is True and run["kernel_set"], run
from dipdeploy.ops.native import library_path
assert str(library_path()).startswith(sys.argv[2].rsplit("/bin", 1)[0]), library_path()  # the venv's own copy
PY
if grep -q "no native op library" "$work/err.txt"; then fail "run fell back to the ONNX functions"; fi
[ -s "$work/out.txt" ] || fail "run wrote no text on stdout"

step "export without the torch extra: refused in one line"
set +e
"$v/dipdeploy" export --model tiny-llama --out "$work/refused" 2>"$work/refused.txt" >/dev/null
rc=$?
set -e
[ "$rc" = 1 ] || fail "export without torch exited $rc, not 1"
[ "$(wc -l <"$work/refused.txt")" = 1 ] || { cat "$work/refused.txt" >&2; fail "export without torch printed more than one line"; }
grep -q "dipdeploy\[torch\]" "$work/refused.txt" || fail "export without torch does not name the torch extra"

step "installing the torch extra (torch 2.13.0, the CPU build)"
"$v/pip" install -q torch==2.13.0 >/dev/null
"$v/pip" install -q "$wheel[torch]" >/dev/null
"$v/dipdeploy" export --model tiny-llama --method dip-ca --rho-in 0.5 --out "$work/tiny2" >/dev/null 2>"$work/export.txt" \
  || { cat "$work/export.txt" >&2; fail "export from the wheel failed"; }
"$v/dipdeploy" run "$work/tiny2" -p "hello" -n 8 >/dev/null 2>"$work/err2.txt" \
  || { cat "$work/err2.txt" >&2; fail "run of the wheel's own export failed"; }
"$v/dipdeploy" inspect "$work/tiny2" --verify >/dev/null 2>&1 || fail "inspect --verify of the wheel's export failed"
step "OK ($(basename "$wheel"): runtime-only run on its own op library, export refused then done with [torch])"
