"""The runtime reads the cgroup memory limit it runs under (v1 and v2, from fake cgroup trees) and
refuses a budget that cannot fit under it before opening any session, in one line with the figures."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dipdeploy.runtime import cgroup
from dipdeploy.runtime.cgroup import MemoryEstimate, MemoryLimitError, check_fits, memory_limit


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


V2 = {"sys/fs/cgroup/cgroup.controllers": "cpu memory", "proc/self/cgroup": "0::/user.slice/app\n"}


def test_v2_own_group(tmp_path):
    root = _tree(tmp_path, {**V2, "sys/fs/cgroup/user.slice/memory.max": "max",
                            "sys/fs/cgroup/user.slice/app/memory.max": "500000000\n"})
    assert memory_limit(root) == 500_000_000


def test_v2_tightest_ancestor_applies(tmp_path):
    root = _tree(tmp_path, {**V2, "sys/fs/cgroup/user.slice/memory.max": "300000000",
                            "sys/fs/cgroup/user.slice/app/memory.max": "max"})
    assert memory_limit(root) == 300_000_000


def test_v2_max_is_unlimited(tmp_path):
    root = _tree(tmp_path, {**V2, "sys/fs/cgroup/user.slice/app/memory.max": "max"})
    assert memory_limit(root) is None


def test_v2_group_not_visible_uses_the_mount(tmp_path):
    """Inside a container (cgroup namespace) /proc/self/cgroup may name a path the mount does not show."""
    root = _tree(tmp_path, {**V2, "sys/fs/cgroup/memory.max": "200000000"})
    assert memory_limit(root) == 200_000_000


@pytest.mark.parametrize("value,expected", [("268435456", 268435456), ("9223372036854771712", None)])
def test_v1(tmp_path, value, expected):
    """Also the hybrid layout (v1 memory controller, a v2 tree at unified/ without it)."""
    root = _tree(tmp_path, {"proc/self/cgroup": "12:cpu,cpuacct:/docker/x\n4:memory:/docker/x\n0::/\n",
                            "sys/fs/cgroup/unified/cgroup.controllers": "",
                            "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
                            "sys/fs/cgroup/memory/docker/x/memory.limit_in_bytes": value})
    assert memory_limit(root) == expected


def test_no_cgroup_files(tmp_path):
    assert memory_limit(tmp_path) is None


def test_check_fits_names_the_three_figures():
    check_fits(MemoryEstimate(100, 50, 0, 0), 150, "100B")
    check_fits(MemoryEstimate(100, 50, 0, 0), None, "100B")
    with pytest.raises(MemoryLimitError, match=r"100B .* \+ overhead .* exceeds the cgroup memory limit of 0\.0 MB"):
        check_fits(MemoryEstimate(100, 51, 0, 0), 150, "100B")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = tmp_path_factory.mktemp("cg") / "b"
    export_model(ExportConfig(model="tiny-llama", method="dip-ca", rho_in=0.6, validate_tokens=0), out)
    return out


def _limit(monkeypatch, tmp_path, limit: int) -> None:
    root = _tree(tmp_path, {**V2, "sys/fs/cgroup/user.slice/app/memory.max": str(limit)})
    from dipdeploy.runtime import engine

    monkeypatch.setattr(engine, "memory_limit", lambda: cgroup.memory_limit(root))


def _rss() -> int:
    from dipdeploy.runtime.stats import memory_now

    return memory_now()["VmRSS"]


@pytest.mark.parametrize("budget", ["50%", "100MB"])
def test_engine_refuses_before_opening_sessions(bundle, tmp_path, monkeypatch, budget):
    from dipdeploy.runtime import Engine
    from dipdeploy.runtime.backends.per_layer import PerLayerDecoder as EngineCls

    _limit(monkeypatch, tmp_path, _rss() // 2)  # below what this process already holds
    monkeypatch.setattr(EngineCls, "_open_sessions", lambda *a: pytest.fail("opened sessions"))
    with pytest.raises(MemoryLimitError, match=f"DRAM budget {budget} .*overhead .*cgroup memory limit"):
        Engine(bundle, dram_budget=budget)


def test_engine_runs_under_a_limit_it_fits(bundle, tmp_path, monkeypatch):
    from dipdeploy.runtime import Engine

    _limit(monkeypatch, tmp_path, 4 * _rss())
    Engine(bundle, dram_budget="50%").close()


def test_run_cli_one_line(bundle, tmp_path, monkeypatch):
    from dipdeploy.cli import app

    _limit(monkeypatch, tmp_path, _rss() // 2)
    res = CliRunner().invoke(app, ["run", str(bundle), "--prompt", "hi", "-n", "2"])
    assert res.exit_code == 2 and "exceeds the cgroup memory limit" in res.output and "Traceback" not in res.output


def test_run_cli_budget_below_the_resident_minimum(bundle):
    """A DRAM budget below what the run must hold is bad input: one line giving the minimum, exit 2."""
    from dipdeploy.cli import app

    res = CliRunner().invoke(app, ["run", str(bundle), "--dram-budget", "1KB", "--prompt", "hi", "-n", "2"])
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert len(errors) == 1 and "below the resident minimum" in errors[0] and "give at least" in errors[0]


def test_the_estimate_counts_what_the_sessions_add(bundle):
    """The overhead is not only what the process holds now and the graph files: what the sessions add is
    modelled (``runtime_overhead``: a fixed part and the dense file again), so a limit just above the old
    lower bound is refused instead of ending in an OOM kill."""
    from dipdeploy.bundle.manifest import read_manifest

    m = read_manifest(bundle)
    est = cgroup.estimate(m, "50%", 0)
    assert est.runtime == cgroup.runtime_overhead(m) >= m.sizes["bytes_dense"] > 0
    assert est.total == est.budget + est.process + est.graphs + est.runtime
    with pytest.raises(MemoryLimitError, match=r"onnxruntime and caches [0-9.]+\) = [0-9.]+ MB exceeds"):
        check_fits(est, limit=est.budget + est.process + est.graphs + est.runtime // 2, budget_text="50%")

