"""Replacing a bundle never loses it: failures and kills at every step of the swap leave a complete
bundle (old or new) at --out, the next export repairs what a kill left, concurrent exports to one
--out are refused, and a full disk is refused up front or reported in one line."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dipdeploy import dirswap
from dipdeploy.bundle.manifest import read_manifest, verify
from dipdeploy.cli import app
from dipdeploy.export import bundle as bundle_mod
from dipdeploy.export import space
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig

ROOT = Path(__file__).resolve().parents[1]
MARK = "old.marker"  # written into the first bundle: tells the old one from the new one
CLI = [sys.executable, "-c", "from dipdeploy.cli import app; app()"]
TINY = ["export", "--model", "tiny-llama", "--rho-in", "0.6", "--validate-tokens", "0"]


def _cfg(**kw):
    return ExportConfig(**{"model": "tiny-llama", "rho_in": 0.6, "validate_tokens": 0, **kw})


def _complete(out: Path) -> bool:
    """manifest.json present and every file it lists there with its size."""
    return (out / "manifest.json").is_file() and verify(out, read_manifest(out)) == []


def _old_bundle(out: Path) -> Path:
    export_model(_cfg(), out)
    (out / MARK).write_text("old")
    return out


def _siblings(out: Path) -> list[str]:
    """Everything next to ``out`` that an export created (temporary, moved-aside, lock files)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def _fail_at(step, exc):
    def hook(name):
        if name == step:
            raise exc

    return hook


@pytest.fixture(params=["exchange", "renames"])
def mode(request, tmp_path, monkeypatch):
    """Both swaps: renameat2(RENAME_EXCHANGE), and the two renames used where it is not supported."""
    monkeypatch.setattr(dirswap, "EXCHANGE", request.param == "exchange")
    if request.param == "exchange" and not dirswap._can_exchange(tmp_path):
        pytest.skip("RENAME_EXCHANGE is not supported on this filesystem")
    return request.param


@pytest.mark.parametrize("exc", [OSError(errno.EIO, "injected"), KeyboardInterrupt()], ids=["error", "sigint"])
@pytest.mark.parametrize("step", dirswap.STEPS)
def test_failure_at_every_step_keeps_a_complete_bundle(tmp_path, step, exc, mode):
    out = _old_bundle(tmp_path / "b")
    with pytest.raises(type(exc)):
        export_model(_cfg(quant="bq4"), out, force=True, swap_hook=_fail_at(step, exc))
    assert _complete(out)
    # before the new bundle is renamed in, the old one is put back; after, the new one stays
    assert (out / MARK).exists() == (step in ("aside", "in"))
    notes = []
    export_model(_cfg(), out, force=True, notice=notes.append)
    assert _complete(out) and _siblings(out) == []
    assert notes == []  # an exception or Ctrl-C leaves nothing behind: only a kill does


def test_swap_rolls_back_when_the_second_rename_fails(tmp_path, monkeypatch):
    final, new = tmp_path / "d", tmp_path / "new"
    final.mkdir(), new.mkdir()
    (final / "a").write_text("old")
    real, calls = os.rename, []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError(errno.EXDEV, "injected")
        real(src, dst)

    monkeypatch.setattr(dirswap, "EXCHANGE", False)
    monkeypatch.setattr(dirswap.os, "rename", rename)
    with pytest.raises(OSError, match="injected"):
        dirswap.replace_dir(new, final)
    assert (final / "a").read_text() == "old"


def test_kill_between_the_renames_is_restored_by_the_next_reader(tmp_path):
    out = _old_bundle(tmp_path / "b")
    os.rename(out, tmp_path / ".b.old-dead")  # what SIGKILL after the first rename leaves
    (tmp_path / ".b.tmp-dead").mkdir()
    assert read_manifest(out) and _complete(out) and (out / MARK).exists()
    notes = []
    export_model(_cfg(), out, force=True, notice=notes.append)
    assert "removed 1 stale temporary directory" in notes[0] and _siblings(out) == []


def test_next_export_restores_and_tidies(tmp_path):
    out = _old_bundle(tmp_path / "b")
    os.rename(out, tmp_path / ".b.old-dead")
    (tmp_path / ".b.tmp-dead").mkdir()
    (tmp_path / ".b.tmp-dead" / "mlp.bin").write_bytes(b"\0" * 1000)
    notes = []
    with pytest.raises(FileExistsError, match="--force"):  # the restored bundle is there again
        export_model(_cfg(), out, notice=notes.append)
    assert notes[0].startswith(f"restored {out}") and "1 stale" in notes[1]
    assert _complete(out) and (out / MARK).exists() and _siblings(out) == []


def test_partial_bundle_is_replaced_only_with_force(tmp_path):
    out = tmp_path / "b"
    export_model(_cfg(), out)
    for name in ("manifest.json", "mlp.bin", "layer.0.attn.onnx"):  # an interrupted rmtree of older versions
        (out / name).unlink()
    with pytest.raises(FileExistsError, match="incomplete bundle"):
        export_model(_cfg(), out)
    export_model(_cfg(), out, force=True)
    assert _complete(out)


def _hold_lock_elsewhere(out: Path, seconds: float = 60):
    code = ("import sys,time; from pathlib import Path; from dipdeploy import dirswap\n"
            f"with dirswap.hold(Path({str(out)!r})):\n    print('held', flush=True); time.sleep({seconds})")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_concurrent_export_is_refused_in_one_line(tmp_path):
    out = tmp_path / "b"
    child = _hold_lock_elsewhere(out)
    try:
        with pytest.raises(dirswap.OutputBusy, match="another export is writing"):
            export_model(_cfg(), out)
        res = CliRunner().invoke(app, [*TINY, "--out", str(out)])
        assert res.exit_code == 2 and "another export is writing" in res.output
        assert "Traceback" not in res.output and not out.exists()
    finally:
        child.kill()
        child.wait()


def test_atomic_dir_waits_for_the_lock(tmp_path):
    """Cache builds and finetune outputs wait for the other writer instead of failing."""
    from dipdeploy.paths import atomic_dir

    final = tmp_path / "d"
    child = _hold_lock_elsewhere(final, 1.0)
    t0 = time.perf_counter()
    with atomic_dir(final) as tmp:
        (tmp / "f").write_text("x")
    waited = time.perf_counter() - t0
    child.wait()
    assert (final / "f").read_text() == "x" and _siblings(final) == [] and waited > 0.5


def test_race_of_two_exports_one_wins(tmp_path):
    out = tmp_path / "b"
    procs = [subprocess.Popen([*CLI, *TINY, "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stdout.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    loser = next(text for rc, text in results if rc == 2)
    assert "another export is writing" in loser or "exists" in loser
    assert _complete(out) and _siblings(out) == []


KILL_AT = """
import os, signal, sys
from pathlib import Path
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig
from dipdeploy import dirswap
out, step = Path(sys.argv[1]), sys.argv[2]
dirswap.EXCHANGE = sys.argv[3] == "exchange"
def hook(name):
    if name == step:
        os.kill(os.getpid(), signal.SIGKILL)
if step == "mid-drop":  # killed while the old bundle is half removed
    def rmtree(path, **kw):
        next(Path(path).iterdir()).unlink()
        os.kill(os.getpid(), signal.SIGKILL)
    dirswap.shutil.rmtree = rmtree
export_model(ExportConfig(model="tiny-llama", rho_in=0.6, validate_tokens=0, quant="bq4"), out, force=True,
             swap_hook=hook)
"""


@pytest.mark.parametrize("step", [*dirswap.STEPS, "mid-drop"])
def test_sigkill_at_every_step(tmp_path, step, mode):
    out = _old_bundle(tmp_path / "b")
    done = subprocess.run([sys.executable, "-c", KILL_AT, str(out), step, mode], cwd=ROOT, timeout=300)
    assert done.returncode == -signal.SIGKILL
    if mode == "renames" and step == "in":  # between the two renames: the old bundle waits aside
        assert not out.exists() and any(_complete(tmp_path / p) for p in _siblings(out) if ".old-" in p)
    else:
        assert _complete(out)
    export_model(_cfg(), out, force=True)
    assert _complete(out) and _siblings(out) == []


def test_sigkill_mid_export_leaves_nothing_after_the_next(tmp_path):
    out = tmp_path / "b"
    for _ in range(3):  # the write phase is short: retry if the export finished before the kill
        shutil.rmtree(out, ignore_errors=True)
        child = subprocess.Popen([*CLI, *TINY, "--out", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        while child.poll() is None and not any(p.startswith(".b.tmp-") for p in _siblings(out)):
            time.sleep(0.005)
        child.kill()
        if child.wait() == -signal.SIGKILL and any(p.startswith(".b.tmp-") for p in _siblings(out)):
            break
    else:
        pytest.fail("never caught the export while it wrote")
    notes = []
    export_model(_cfg(), out, force=True, notice=notes.append)
    assert any("stale" in n for n in notes)
    assert _complete(out) and _siblings(out) == []


def test_free_space_is_checked_first(tmp_path, monkeypatch):
    free = 1000
    monkeypatch.setattr(space.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - free, free))
    with pytest.raises(space.NoSpace, match=f"and {free} bytes"):
        export_model(_cfg(), tmp_path / "b")
    assert list(tmp_path.iterdir()) == []
    res = CliRunner().invoke(app, [*TINY, "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "not enough free space" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("quant", ["none", "bq4", "vq3"])
def test_space_estimate_is_an_upper_bound(tmp_path, quant):
    plain = {"vq_hessian": "none"} if quant == "vq3" else {}  # the size does not depend on the fit
    result = export_model(_cfg(quant=quant, **plain), tmp_path / "b")
    need = space.expected_bytes(space.model_shape("tiny-llama"), _cfg(quant=quant, **plain))
    assert result.manifest.sizes["bytes_total"] <= need


def test_write_error_is_one_line_and_keeps_the_old_bundle(tmp_path, monkeypatch):
    out = _old_bundle(tmp_path / "b")

    def full(lm, cfg, tmp, *a):
        (tmp / "mlp.bin").write_bytes(b"\0" * 10)
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "mlp.bin"))

    monkeypatch.setattr(bundle_mod, "_build", full)
    res = CliRunner().invoke(app, [*TINY, "--out", str(out), "--force"])
    assert res.exit_code == 2, res.output
    assert "writing the bundle failed: No space left on device" in res.output and "Traceback" not in res.output
    assert _complete(out) and (out / MARK).exists() and _siblings(out) == []
