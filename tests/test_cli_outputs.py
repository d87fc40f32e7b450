"""Outputs (``--json``, ``--trace``, ``--plot``): a target that is not a regular file is refused before the
work, ``--force`` or not, and left as it was; a write that fails after the work (a full disk, a folder made
unwritable) keeps the results in a spare file, or on stdout, named in one line, exit 1.

The failed write is simulated by making the writer raise ``ENOSPC`` for the target path only (or for every
path), so the spare file is really written and compared with what the target would have held.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dipdeploy.paths
from dipdeploy.cli import app
from dipdeploy.paths import check_output

runner = CliRunner()


def _fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "fifo.json")
    return tmp_path / "fifo.json"


def _symlink(tmp_path: Path) -> Path:
    (tmp_path / "target.json").write_text("kept")
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    return tmp_path / "link.json"


def _dangling(tmp_path: Path) -> Path:
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    return tmp_path / "dangling.json"


def _device(tmp_path: Path) -> Path:
    """A character device node in tmp (the null device's numbers), never /dev/null itself: a regression
    would replace the node here, not the machine's."""
    try:
        os.mknod(tmp_path / "null.json", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root")
    return tmp_path / "null.json"


def _socket(tmp_path: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "sock.json"))
    s.close()
    return tmp_path / "sock.json"


TARGETS = {"fifo": (_fifo, "a FIFO (named pipe)"), "symlink": (_symlink, "a symbolic link"),
           "dangling symlink": (_dangling, "a symbolic link"), "device": (_device, "a device"),
           "socket": (_socket, "a socket")}


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_non_regular_targets_are_refused_even_with_force(kind, force, tmp_path):
    make, says = TARGETS[kind]
    path = make(tmp_path)
    before = os.lstat(path)
    with pytest.raises(FileExistsError, match=re.escape(f"is {says}, not a regular file")):
        check_output(path, force, flag="--json")
    with pytest.raises(FileExistsError):
        dipdeploy.paths.write_atomic(path, "x", force=True)
    after = os.lstat(path)
    assert (stat.S_IFMT(after.st_mode), after.st_ino) == (stat.S_IFMT(before.st_mode), before.st_ino)


def test_a_regular_file_is_still_replaced_with_force(tmp_path):
    (tmp_path / "old.json").write_text("old")
    assert check_output(tmp_path / "old.json", True) == tmp_path / "old.json"
    dipdeploy.paths.write_atomic(tmp_path / "old.json", "new", force=True)
    assert (tmp_path / "old.json").read_text() == "new"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = tmp_path_factory.mktemp("outputs") / "bundle"
    export_model(ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, validate_tokens=0), out)
    return out


@pytest.mark.parametrize("option", ["--json", "--trace"])
def test_run_refuses_a_fifo_or_symlink_output_before_the_work(bundle, tmp_path, option, monkeypatch):
    import dipdeploy.runtime

    def no_engine(*a, **k):
        raise AssertionError("the engine was built before the output was checked")

    monkeypatch.setattr(dipdeploy.runtime, "Engine", no_engine)
    for path in (_fifo(tmp_path), _symlink(tmp_path)):
        res = runner.invoke(app, ["run", str(bundle), "-p", "hi", "-n", "2", option, str(path), "--force"])
        out = res.output.strip()
        assert res.exit_code == 2 and len(out.splitlines()) == 1 and "not a regular file" in out, out
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo.json").st_mode)
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "target.json").read_text() == "kept"


@pytest.fixture
def spare(tmp_path, monkeypatch) -> Path:
    """The temporary folder where kept results go (the process's, redirected into tmp_path)."""
    folder = tmp_path / "spare"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _full_disk(monkeypatch, module, only: Path | None) -> None:
    """``module.write_atomic`` raises ENOSPC for ``only`` (every path when None), else writes."""
    real = dipdeploy.paths.write_atomic

    def write_atomic(path, data, force=False):
        if only is None or Path(path) == only:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data, force=force)

    monkeypatch.setattr(module, "write_atomic", write_atomic)


def test_inspect_keeps_its_json_in_a_spare_file_when_the_write_fails(bundle, tmp_path, spare, monkeypatch):
    target = tmp_path / "out" / "inspect.json"
    _full_disk(monkeypatch, dipdeploy.paths, target)
    res = runner.invoke(app, ["inspect", str(bundle), "--json", str(target)])
    assert res.exit_code == 1, res.output
    (line,) = res.stderr.strip().splitlines()
    (kept,) = spare.iterdir()
    assert line == (f"error: could not write --json {target} (No space left on device); the results are in "
                    f"{kept} instead")
    assert kept.name.startswith("dipdeploy-inspect-") and kept.suffix == ".json"
    assert json.loads(kept.read_text())["summary"]["model"].startswith("tiny-llama")
    assert not target.exists() and "Traceback" not in res.output


def test_the_results_go_to_stdout_when_no_file_can_be_written(bundle, tmp_path, spare, monkeypatch):
    target = tmp_path / "inspect.json"
    _full_disk(monkeypatch, dipdeploy.paths, None)
    res = runner.invoke(app, ["inspect", str(bundle), "--json", str(target)])
    assert res.exit_code == 1, res.output
    assert res.stderr.strip().splitlines() == [
        f"error: could not write --json {target} (No space left on device); the results are on stdout"]
    printed = res.stdout[res.stdout.index("\n{") + 1:]
    assert json.loads(printed)["summary"]["model"].startswith("tiny-llama")
    assert list(spare.iterdir()) == []  # the spare files that could not be filled are removed


def test_run_keeps_a_trace_that_cannot_be_written_and_still_writes_its_json(bundle, tmp_path, spare, monkeypatch):
    from dipdeploy.trace import Trace

    trace, js = tmp_path / "t.npz", tmp_path / "run.json"
    real = Trace.save

    def save(self, path, force=False):
        if Path(path) == trace:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(self, path, force=force)

    monkeypatch.setattr(Trace, "save", save)
    res = runner.invoke(app, ["run", str(bundle), "-p", "Hi", "-n", "2", "--no-native", "--trace", str(trace),
                              "--json", str(js)])
    assert res.exit_code == 1, res.output
    assert len(list(spare.iterdir())) == 1, res.output
    (kept,) = spare.iterdir()
    assert res.stderr.strip().splitlines()[-1] == (f"error: could not write --trace {trace} (Permission denied); "
                                                   f"the results are in {kept} instead")
    assert Trace.load(kept).num_tokens >= 1 and json.loads(js.read_text())["tokens"]


def test_simulate_keeps_its_rows_when_the_json_cannot_be_written(tmp_path, spare, monkeypatch):
    import dipdeploy.sim.report
    from dipdeploy.registry import get_model
    from dipdeploy.sim.synthetic import synthetic_trace

    s = get_model("tiny-llama").shape
    tr = synthetic_trace(s.hidden_size, s.intermediate_size, s.num_hidden_layers, tokens=8, rho_in=0.5,
                         rho_glu=0.4, seed=0, model="tiny-llama").save(tmp_path / "t.npz")
    target = tmp_path / "sim.json"
    _full_disk(monkeypatch, dipdeploy.sim.report, target)
    res = runner.invoke(app, ["simulate", "--trace", str(tr), "--json", str(target)])
    assert res.exit_code == 1, res.output
    (kept,) = spare.iterdir()
    assert f"the results are in {kept} instead" in res.stderr and json.loads(kept.read_text())["rows"][0]["tok_s"] > 0


def test_calibrate_keeps_its_plan_when_the_out_cannot_be_written(tmp_path, spare, monkeypatch):
    import dipdeploy.sparsity.plan
    from dipdeploy.sparsity.plan import SparsityPlan

    text, out = tmp_path / "calib.txt", tmp_path / "plan.json"
    text.write_text("a small calibration text for a tiny model, repeated. " * 60)
    _full_disk(monkeypatch, dipdeploy.sparsity.plan, out)
    res = runner.invoke(app, ["calibrate", "--model", "tiny-llama", "--method", "dip", "--density", "0.5",
                              "--rho-in", "0.55", "--text-file", str(text), "--windows", "1", "--seqlen", "32",
                              "--out", str(out)])
    assert res.exit_code == 1, res.output
    (kept,) = spare.iterdir()
    assert f"could not write --out {out} (No space left on device); the results are in {kept}" in res.stderr
    assert SparsityPlan.load(kept).method == "dip" and "plan for" not in res.stdout
