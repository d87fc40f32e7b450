"""Bad input to any command: one line that names the problem, exit code 2, no traceback, nothing written.

Each case is refused before a model is loaded or a bundle's sessions are opened where the input allows
it (that is the point: a typo must not cost minutes of work). The tmp folder is snapshotted before and
after each case: a refused command creates and changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.runtime import DramBudget

runner = CliRunner()
UNCACHED = "nobody-dipdeploy/not-a-cached-model"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = tmp_path_factory.mktemp("bad-inputs") / "bundle"
    export_model(ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, validate_tokens=0), out)
    return out


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    from dipdeploy.registry import get_model
    from dipdeploy.sim.synthetic import synthetic_trace

    s = get_model("tiny-llama").shape
    return synthetic_trace(s.hidden_size, s.intermediate_size, s.num_hidden_layers, tokens=8, rho_in=0.5,
                           rho_glu=0.4, seed=0, model="tiny-llama").save(tmp_path_factory.mktemp("trace") / "t.npz")


@pytest.fixture()
def work(tmp_path) -> dict:
    """Paths a case names: a new one, an existing file, a directory, a path under a file, a missing one, a
    FIFO and a symbolic link to the existing file (outputs that are not regular files)."""
    (tmp_path / "exists.json").write_text("[]")
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "kept.txt").write_text("kept")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "link.json").symlink_to(tmp_path / "exists.json")
    return {"new": str(tmp_path / "new.out"), "file": str(tmp_path / "exists.json"), "dir": str(tmp_path / "adir"),
            "under_file": str(tmp_path / "exists.json" / "x.json"), "missing": str(tmp_path / "missing"),
            "fifo": str(tmp_path / "fifo.json"), "link": str(tmp_path / "link.json"), "tmp": tmp_path}


def _snapshot(*roots: Path) -> dict:
    seen = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                st = p.lstat()
                seen[str(p)] = (st.st_size, st.st_mtime_ns)
    return seen


# (id, arguments with {placeholders}, text the one line must contain)
CASES = [
    # models, devices: only option typos are possible
    ("models-unknown-option", "models --bogus", "No such option: --bogus"),
    ("devices-unknown-option", "devices --sort", "No such option: --sort"),
    # calibrate
    ("calibrate-no-out", "calibrate", "Missing option '--out'"),
    ("calibrate-out-exists", "calibrate --model tiny-llama --out {file}", "pass --force"),
    ("calibrate-out-is-dir", "calibrate --model tiny-llama --out {dir}", "is a directory"),
    ("calibrate-out-under-file", "calibrate --model tiny-llama --out {under_file}", "is not a directory"),
    ("calibrate-data-dir-missing", "calibrate --model tiny-llama --out {new} --data-dir {missing}", "--data-dir"),
    ("calibrate-text-file-missing", "calibrate --model tiny-llama --out {new} --text-file {missing}", "--text-file"),
    ("calibrate-density", "calibrate --model tiny-llama --out {new} --density 1.5", "density must lie in (0, 1]"),
    ("calibrate-method", "calibrate --model tiny-llama --out {new} --method bogus", "method 'bogus' unknown"),
    ("calibrate-allocation", "calibrate --model tiny-llama --out {new} --allocation best", "allocation 'best'"),
    ("calibrate-windows", "calibrate --model tiny-llama --out {new} --windows 0", "--windows 0"),
    ("calibrate-density-type", "calibrate --model tiny-llama --out {new} --density half", "Invalid value for '--density'"),
    ("calibrate-hub-uncached", f"calibrate --model {UNCACHED} --out {{new}}", "not in the local Hugging Face cache"),
    ("calibrate-gguf-missing", "calibrate --model {missing}.gguf --out {new}", "GGUF file"),
    ("calibrate-model-dir-empty", "calibrate --model {dir} --out {new}", "not a Hugging Face model directory"),
    ("calibrate-model-unknown", "calibrate --model no-such-model --out {new}", "neither a registry name"),
    ("calibrate-device", "calibrate --model tiny-llama --out {new} --device tpu", "--device 'tpu' is unknown"),
    ("calibrate-stream-cats", "calibrate --model tiny-llama --out {new} --method cats --stream", "--no-stream"),
    # eval
    ("eval-json-exists", "eval --model tiny-llama --json {file}", "pass --force"),
    ("eval-plot-is-dir", "eval --model tiny-llama --plot {dir}", "is a directory"),
    ("eval-json-under-file", "eval --model tiny-llama --json {under_file}", "is not a directory"),
    ("eval-json-symlink", "eval --model tiny-llama --json {link} --force", "is a symbolic link, not a regular file"),
    ("eval-data-dir-missing", "eval --model tiny-llama --data-dir {missing}", "--data-dir"),
    ("eval-density-text", "eval --model tiny-llama --density 0.5,abc", "comma list of numbers"),
    ("eval-density-range", "eval --model tiny-llama --density 1.5", "density must lie in (0, 1]"),
    ("eval-method", "eval --model tiny-llama --method dip,bogus", "method 'bogus' unknown"),
    ("eval-plan-missing", "eval --model tiny-llama --plan {missing}", "--plan"),
    ("eval-lora-missing", "eval --model tiny-llama --lora {missing}", "--lora"),
    ("eval-text-file-missing", "eval --model tiny-llama --text-file {missing}", "--text-file"),
    ("eval-quant-scope", "eval --model tiny-llama --quant-scope some", "quant_scope 'some'"),
    ("eval-seqlen", "eval --model tiny-llama --seqlen 1", "seqlen must be >= 2"),
    ("eval-device", "eval --model tiny-llama --device tpu", "device 'tpu' unknown"),
    ("eval-hub-uncached", f"eval --model {UNCACHED}", "not in the local Hugging Face cache"),
    # demo
    ("demo-model-unknown", "demo --model no-such-model", "neither a registry name"),
    # quantize
    ("quantize-format", "quantize --model tiny-llama --quant bq5 --out {new}", "bq5"),
    ("quantize-out-exists", "quantize --model tiny-llama --quant bq4 --out {file}", "pass --force"),
    ("quantize-out-is-dir", "quantize --model tiny-llama --quant bq4 --out {dir}", "is a directory"),
    ("quantize-data-dir-missing", "quantize --model tiny-llama --quant bq4 --out {new} --data-dir {missing}",
     "--data-dir"),
    ("quantize-model-unknown", "quantize --model no-such-model --quant bq4 --out {new}", "neither a registry name"),
    # finetune
    ("finetune-out-is-file", "finetune --model tiny-llama --out {file}", "is a file, not a directory"),
    ("finetune-out-exists", "finetune --model tiny-llama --out {dir}", "pass --force"),
    ("finetune-method", "finetune --model tiny-llama --out {new} --method teal", "dip or dip-ca"),
    ("finetune-plan-missing", "finetune --model tiny-llama --out {new} --plan {missing}", "--plan"),
    ("finetune-data-dir-missing", "finetune --model tiny-llama --out {new} --data-dir {missing}", "--data-dir"),
    ("finetune-text-file-missing", "finetune --model tiny-llama --out {new} --text-file {missing}", "--text-file"),
    ("finetune-rank", "finetune --model tiny-llama --out {new} --rank 0", "rank must be >= 1"),
    ("finetune-device", "finetune --model tiny-llama --out {new} --device tpu", "--device 'tpu' is unknown"),
    ("finetune-targets", "finetune --model tiny-llama --out {new} --targets up,ffn", "targets"),
    ("finetune-hidden-weight-lm", "finetune --model tiny-llama --out {new} --hidden-weight 5",
     "only with objective distill"),
    ("finetune-objective", "finetune --model tiny-llama --out {new} --objective kl", "objective 'kl' unknown"),
    ("finetune-distill-on-wikitext", "finetune --model tiny-llama --out {new} --objective distill --data wikitext2-valid",
     "not WikiText"),
    # export
    ("export-json-exists", "export --model tiny-llama --rho-in 0.6 --out {new} --json {file}", "pass --force"),
    ("export-json-is-dir", "export --model tiny-llama --rho-in 0.6 --out {new} --json {dir}", "is a directory"),
    ("export-json-fifo", "export --model tiny-llama --rho-in 0.6 --out {new} --json {fifo} --force",
     "is a FIFO (named pipe), not a regular file"),
    ("export-dense-per-layer", "export --model tiny-llama --method dense --per-layer --out {new}", "--per-layer"),
    ("export-data-dir-missing", "export --model tiny-llama --out {new} --data-dir {missing}", "--data-dir"),
    ("export-accuracy-level-1", "export --model tiny-llama --rho-in 0.6 --quant bq4 --accuracy-level 1 --out {new}",
     "accuracy_level"),
    ("export-accuracy-level-3", "export --model tiny-llama --rho-in 0.6 --quant bq4 --accuracy-level 3 --out {new}",
     "accuracy_level"),
    ("export-quant", "export --model tiny-llama --rho-in 0.6 --quant int2 --out {new}", "quant='int2'"),
    ("export-embedding", "export --model tiny-llama --rho-in 0.6 --quant bq4 --embedding int8 --out {new}",
     "embedding='int8'"),
    ("export-row-order", "export --model tiny-llama --rho-in 0.6 --row-order sideways --out {new}",
     "row_order='sideways'"),
    ("export-row-order-dense", "export --model tiny-llama --method dense --row-order calibrated --out {new}",
     "--row-order natural"),
    ("export-max-length", "export --model tiny-llama --rho-in 0.6 --max-length 8 --out {new}", "max_length=8"),
    ("export-plan-missing", "export --model tiny-llama --plan {missing} --out {new}", "--plan"),
    ("export-lora-missing", "export --model tiny-llama --rho-in 0.6 --lora {missing} --out {new}", "--lora"),
    ("export-out-is-file", "export --model tiny-llama --rho-in 0.6 --out {file}", "is a file"),
    ("export-out-not-a-bundle", "export --model tiny-llama --rho-in 0.6 --out {dir} --force", "not a dipdeploy bundle"),
    ("export-density", "export --model tiny-llama --density 0 --out {new}", "density=0.0"),
    ("export-hub-uncached", f"export --model {UNCACHED} --rho-in 0.6 --out {{new}}", "not in the local Hugging Face"),
    # inspect
    ("inspect-missing", "inspect {missing}", "not found: give the folder `dipdeploy export` wrote"),
    ("inspect-not-a-bundle", "inspect {dir}", "dipdeploy export"),
    ("inspect-json-exists", "inspect {bundle} --json {file}", "pass --force"),
    ("inspect-json-is-dir", "inspect {bundle} --json {dir}", "is a directory"),
    ("inspect-json-symlink", "inspect {bundle} --json {link}", "is a symbolic link"),
    ("inspect-prompt-not-utf8", "inspect {bundle} --prompt a\udcffb", "--prompt holds bytes that are not valid UTF-8"),
    ("inspect-max-new-tokens", "inspect {bundle} --prompt hi --max-new-tokens 0", "--max-new-tokens 0"),
    # run
    ("run-context-too-long", "run {bundle} -p hi --context 100000 --no-native", "exceeds the 256 positions"),
    ("run-context-zero", "run {bundle} -p hi --context 0", "context must be >= 1"),
    ("run-io", "run {bundle} -p hi --io odirect", "choose one of auto, mmap, pread, direct"),
    ("run-io-threads", "run {bundle} -p hi --io direct --io-threads 0", "--io-threads must be >= 1"),
    ("chat-io-threads", "chat {bundle} --io direct --io-threads 0", "--io-threads must be >= 1"),
    ("run-io-engine", "run {bundle} -p hi --io direct --io-engine aio", "--io-engine aio: choose one of auto, threads, io_uring"),
    ("run-io-gap", "run {bundle} -p hi --io direct --io-gap -1", "--io-gap must be >= 0 blocks"),
    ("run-prefill", "run {bundle} -p hi --prefill chunked", "--prefill chunked: choose one of batch, token"),
    ("chat-prefill", "chat {bundle} --prefill chunked", "--prefill chunked: choose one of batch, token"),
    ("run-prefill-chunk", "run {bundle} -p hi --prefill-chunk 0", "--prefill-chunk must be >= 1 token, got 0"),
    ("chat-prefill-chunk", "chat {bundle} --prefill-chunk -3", "--prefill-chunk must be >= 1 token, got -3"),
    ("run-threads", "run {bundle} -p hi --threads 0", "--threads must be >= 1"),
    ("chat-threads", "chat {bundle} --threads 0", "--threads must be >= 1"),
    ("run-thread-pool", "run {bundle} -p hi --threads 2 --thread-pool global",
     "--thread-pool global: choose one of per-session, shared"),
    ("run-budget-no-unit", "run {bundle} -p hi --dram-budget 50", "needs a unit"),
    ("run-budget-fraction-no-unit", "run {bundle} -p hi --dram-budget 0.5", "needs a unit"),
    ("run-budget-too-small", "run {bundle} -p hi --dram-budget 1kB --no-native", "give at least"),
    ("run-json-exists", "run {bundle} -p hi --json {file}", "pass --force"),
    ("run-trace-is-dir", "run {bundle} -p hi --trace {dir}", "is a directory"),
    ("run-trace-fifo", "run {bundle} -p hi --trace {fifo} --force", "is a FIFO (named pipe), not a regular file"),
    ("run-json-symlink", "run {bundle} -p hi --json {link} --force", "is a symbolic link, not a regular file"),
    ("run-prompt-not-utf8", "run {bundle} -p \udcff", "--prompt holds bytes that are not valid UTF-8"),
    ("run-stop-not-utf8", "run {bundle} -p hi --stop \udcff", "--stop holds bytes that are not valid UTF-8"),
    ("run-json-under-file", "run {bundle} -p hi --json {under_file}", "is not a directory"),
    ("run-policy", "run {bundle} -p hi --policy mru", "policy 'mru' unknown"),
    ("run-gamma", "run {bundle} -p hi --gamma 1.5", "gamma must lie in [0, 1]"),
    ("run-accuracy-level", "run {bundle} -p hi --accuracy-level 2", "--accuracy-level must be 0"),
    ("run-bundle-missing", "run {missing} -p hi", "not found: give the folder `dipdeploy export` wrote"),
    ("run-pin-from-missing", "run {bundle} -p hi --policy static --pin-from {missing}", "--pin-from"),
    ("run-flash-bandwidth", "run {bundle} -p hi --flash-bandwidth fast", "fast"),
    ("run-flash-device", "run {bundle} -p hi --flash-device toaster", "unknown device 'toaster'"),
    ("run-flash-both", "run {bundle} -p hi --flash-bandwidth 1GB/s --flash-device sd8gen3", "not both"),
    ("chat-flash-device", "chat {bundle} --flash-device toaster", "unknown device 'toaster'"),
    ("run-no-prompt", "run {bundle}", "give the prompt once: -p TEXT or -f FILE"),
    ("run-prompt-and-file", "run {bundle} -p hi -f {file}", "give the prompt once: -p TEXT or -f FILE"),
    ("run-file-missing", "run {bundle} -f {missing}", "--file"),
    ("run-seed-negative", "run {bundle} -p hi -s -1", "--seed must be >= 0"),
    ("run-registry-model", "run tiny-llama -p hi", "is a model of the registry (`dipdeploy models`), not a bundle"),
    # chat
    ("chat-context-too-long", "chat {bundle} --context 100000 --no-native", "exceeds the 256 positions"),
    ("chat-bundle-missing", "chat {missing}", "not found: give the folder `dipdeploy export` wrote"),
    ("chat-budget-no-unit", "chat {bundle} --dram-budget 25", "needs a unit"),
    ("chat-policy", "chat {bundle} --policy mru", "policy 'mru' unknown"),
    # trace
    ("trace-tokens-zero", "trace --model tiny-llama --tokens 0 --out {new}", "--tokens 0"),
    ("trace-out-exists", "trace --model tiny-llama --out {file}", "pass --force"),
    ("trace-method", "trace --model tiny-llama --method teal --out {new}", "dense, dip or dip-ca"),
    ("trace-split", "trace --model tiny-llama --split train --out {new}", "--split 'train'"),
    ("trace-data-dir-missing", "trace --model tiny-llama --data-dir {missing} --out {new}", "--data-dir"),
    ("trace-plan-missing", "trace --model tiny-llama --plan {missing} --out {new}", "--plan"),
    # simulate
    ("simulate-trace-missing", "simulate --trace {missing}", "--trace"),
    ("simulate-trace-not-npz", "simulate --trace {file}", "not a dipdeploy trace"),
    ("simulate-json-exists", "simulate --trace {trace} --json {file}", "pass --force"),
    ("simulate-plot-is-dir", "simulate --trace {trace} --plot {dir}", "is a directory"),
    ("simulate-json-fifo", "simulate --trace {trace} --json {fifo} --force", "is a FIFO (named pipe)"),
    ("simulate-dram-and-sweep", "simulate --trace {trace} --dram 4GB --sweep-dram auto", "not both"),
    ("simulate-device", "simulate --trace {trace} --device toaster", "toaster"),
    ("simulate-dram-size", "simulate --trace {trace} --dram lots", "lots"),
    ("simulate-gamma", "simulate --trace {trace} --gamma 0.5,x", "comma list of numbers"),
    ("simulate-method", "simulate --trace {trace} --method sparse", "sparse"),
    ("simulate-model", "simulate --trace {trace} --model gpt-9", "gpt-9"),
    ("simulate-tokens", "simulate --trace {trace} --tokens 0", "--tokens 0"),
    ("simulate-steps", "simulate --trace {trace} --sweep-dram auto --steps 1", "--steps 1"),
    # build-ops
    ("build-ops-arch", "build-ops --arch riscv64", "riscv64"),
]


@pytest.mark.parametrize("args, expect", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, expect, work, request):
    values = dict(work)
    if "{bundle}" in args:
        values["bundle"] = str(request.getfixturevalue("bundle"))
    if "{trace}" in args:
        values["trace"] = str(request.getfixturevalue("trace"))
    argv = [a.format(**values) for a in args.split()]
    watched = [work["tmp"]] + [Path(values[k]).parent for k in ("bundle", "trace") if k in values]
    before = _snapshot(*watched)
    res = runner.invoke(app, argv)
    out = res.output.strip()
    assert res.exit_code == 2, out
    assert len(out.splitlines()) == 1 and out.startswith("error:"), out
    assert expect in out, out
    assert "Traceback" not in out and isinstance(res.exception, SystemExit), out
    assert _snapshot(*watched) == before, "a refused command created or changed files"


def test_there_are_at_least_60_cases_across_every_command():
    from dipdeploy.cli._app import app as typer_app

    commands = {c.name or c.callback.__name__ for c in typer_app.registered_commands}
    covered = {args.split()[0] for _, args, _ in CASES}
    assert len(CASES) >= 60 and commands <= covered, commands - covered


def test_version():
    from dipdeploy import __version__

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"dipdeploy {__version__}"


@pytest.mark.parametrize("text", ["50", "0.5", " 200 "])
def test_dram_budget_without_a_unit_is_refused(text):
    with pytest.raises(ValueError, match="needs a unit"):
        DramBudget.parse(text)
    assert DramBudget.parse("50%").cache_frac == 0.5 and DramBudget.parse("200MB").total_bytes == 200 * 10**6


def test_the_budget_minimum_in_the_message_is_itself_accepted(bundle):
    """The refusal states a minimum rounded up to 0.1 MB, so giving exactly that figure works."""
    import re

    from dipdeploy.runtime import Engine

    with pytest.raises(ValueError, match="give at least") as err:
        Engine(bundle, dram_budget="1kB", native=False)
    least = re.search(r"give at least ([0-9.]+)MB", str(err.value)).group(1)
    Engine(bundle, dram_budget=f"{least}MB", native=False).close()
    assert float(least) * 1e6 - 1e5 < _resident_minimum(bundle)  # and it is no more than 0.1 MB above it


def _resident_minimum(bundle) -> int:
    from dipdeploy.runtime import Engine

    eng = Engine(bundle, dram_budget="0%", native=False)
    r = eng.residency
    eng.close()
    return r.total - r.caches  # dense, KV, staging and the prefill buffer


def test_default_context_fits_the_bundle_and_an_explicit_one_is_checked(bundle):
    """No --context: 1024 or the bundle's positions if fewer (the tiny model has 256); more is refused."""
    from dipdeploy.runtime import Engine
    from dipdeploy.runtime.bundle_open import bundle_positions

    assert bundle_positions(bundle) == 256
    eng = Engine(bundle, native=False)
    assert eng.cfg.context == 256
    eng.close()
    eng = Engine(bundle, native=False, context=64)
    assert eng.cfg.context == 64
    eng.close()
    with pytest.raises(ValueError, match="give --context 256 or less"):
        Engine(bundle, native=False, context=257)


def test_trace_refuses_a_missing_wikitext_before_it_loads_the_model(tmp_path, monkeypatch):
    """The texts are found before the model is loaded (minutes for a real model), so a missing data folder is
    one line at once."""
    monkeypatch.delenv("DIPDEPLOY_DATA", raising=False)
    monkeypatch.setattr("dipdeploy.data._hf_datasets_rows", lambda split: None)

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the text was found")

    monkeypatch.setattr("dipdeploy.loading.load_model", no_load)
    r = CliRunner().invoke(app, ["trace", "-m", "tiny-llama", "--method", "dip", "--rho-in", "0.6",
                                 "-o", str(tmp_path / "t.npz")])
    assert r.exit_code == 2 and "WikiText-2" in r.output and "--data-dir" in r.output, r.output
    assert not (tmp_path / "t.npz").exists()
