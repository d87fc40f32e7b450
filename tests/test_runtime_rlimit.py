"""The runtime reads ``RLIMIT_AS`` (``ulimit -v``) and refuses, before any session opens, a run whose
address space would exceed it, in one line naming ``ulimit -v``: onnxruntime's allocation failure under
the limit is a ``std::bad_alloc`` that aborts the process (SIGABRT), with no word of why."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dipdeploy.runtime import rlimit
from dipdeploy.runtime.rlimit import AddressSpaceError, address_space_limit, check_address_space


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = tmp_path_factory.mktemp("as") / "b"
    export_model(ExportConfig(model="tiny-llama", method="dip-ca", rho_in=0.6, validate_tokens=0), out)
    return out


def test_the_limit_is_read(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert address_space_limit() is None
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1 << 30, resource.RLIM_INFINITY))
    assert address_space_limit() == 1 << 30


def test_the_estimate_is_now_plus_what_the_run_maps(bundle):
    from dipdeploy.bundle.manifest import read_manifest

    m = read_manifest(bundle)
    one, four = (rlimit.address_space_estimate(m, "50%", 0, threads) for threads in (1, 4))
    dense, mlp = m.files["dense.bin"]["size"], m.files["mlp.bin"]["size"]
    assert one.now > 0 and one.files == dense + 2 * mlp  # unknown mode: every map any mode makes
    assert four.total - one.total == 3 * rlimit.AS_PER_THREAD > 0
    check_address_space(m, "50%", 0, 1, limit=one.total)
    with pytest.raises(AddressSpaceError, match=r"`ulimit -v` allows"):
        check_address_space(m, "50%", 0, 1, limit=one.total - 1)


def test_the_maps_follow_the_backend_and_the_io_mode(bundle):
    """``mlp.bin`` is counted once per map the run makes of it: by ``model.onnx``'s session (one session
    per token) and by the Flash store under ``--io mmap``; ``direct`` and ``pread`` read it, unmapped."""
    from dipdeploy.bundle.manifest import read_manifest

    m = read_manifest(bundle)
    assert rlimit.mapped_files(m, False, "direct") == rlimit.mapped_files(m, False, "pread") == ["dense.bin"]
    assert rlimit.mapped_files(m, False, "mmap") == rlimit.mapped_files(m, True, "direct") == ["dense.bin", "mlp.bin"]
    assert rlimit.mapped_files(m, True, "mmap") == ["dense.bin", "mlp.bin", "mlp.bin"]
    direct = rlimit.address_space_estimate(m, "50%", 0, 1, rlimit.mapped_files(m, False, "direct"))
    mapped = rlimit.address_space_estimate(m, "50%", 0, 1, rlimit.mapped_files(m, False, "mmap"))
    assert direct.files == m.files["dense.bin"]["size"] and mapped.total - direct.total == m.files["mlp.bin"]["size"]


@pytest.mark.parametrize("io, budget", [("direct", "50%"), ("mmap", "50%"), ("mmap", "100%")])
def test_the_engine_checks_the_maps_it_makes(bundle, monkeypatch, io, budget):
    """The engine resolves its backend and ``--io`` before the check and hands it those maps, and what it
    then maps of ``mlp.bin`` is what was counted (its VmPeak is not measurable here: figures in
    benchmarks/results/memory-check.md)."""
    from dipdeploy.runtime import Engine, engine

    seen = {}
    real = engine.check_address_space
    monkeypatch.setattr(engine, "check_address_space",
                        lambda *a, **k: seen.update(k) or real(*a, **k))
    e = Engine(bundle, dram_budget=budget, io=io)
    try:
        maps = [line for line in open("/proc/self/maps") if line.rstrip().endswith(str(bundle / "mlp.bin"))]
        assert e.cfg.io == io and seen["maps"].count("mlp.bin") == (e.single_session + (io == "mmap"))
        assert len(maps) == seen["maps"].count("mlp.bin")
    finally:
        e.close()


def test_engine_refuses_before_opening_sessions(bundle, monkeypatch):
    from dipdeploy.runtime import Engine
    from dipdeploy.runtime.backends.per_layer import PerLayerDecoder

    monkeypatch.setattr(rlimit, "address_space_limit", lambda: 64 << 20)
    monkeypatch.setattr(PerLayerDecoder, "_open_sessions", lambda *a: pytest.fail("opened sessions"))
    with pytest.raises(AddressSpaceError, match="ulimit -v"):
        Engine(bundle, dram_budget="50%")


def test_run_cli_one_line(bundle, monkeypatch):
    from dipdeploy.cli import app

    monkeypatch.setattr(rlimit, "address_space_limit", lambda: 64 << 20)
    res = CliRunner().invoke(app, ["run", str(bundle), "--prompt", "hi", "-n", "2"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "ulimit -v" in lines[0] and "Traceback" not in res.output


_VM_SIZE = ("import dipdeploy.cli, dipdeploy.runtime.engine, onnxruntime, tokenizers\n"
            "print(next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize:')))")


def test_a_real_ulimit_refuses_in_one_line(bundle):
    """Under a real ``ulimit -v`` a little above what the command has mapped once its libraries are
    loaded, ``dipdeploy run`` refuses in one line (exit 2), not a crash by a signal."""
    here = subprocess.run([sys.executable, "-c", _VM_SIZE], capture_output=True, text=True, check=True)
    limit = int(here.stdout.split()[-1]) + (64 << 20)

    def under_limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = subprocess.run([str(Path(sys.executable).parent / "dipdeploy"), "run", str(bundle), "-p", "hi", "-n", "2"],
                          capture_output=True, text=True, preexec_fn=under_limit, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and "ulimit -v" in lines[0], out
