"""What the tests of the ``dipdeploy bench`` suites share: a suite's command run in-process, the check of a
one-line refusal (exit 2, before any work), and the check that a published table's scenario loads."""

from pathlib import Path

from typer.testing import CliRunner

from dipdeploy.cli import app

runner = CliRunner()
SCENARIOS = Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios"


def bench(suite: str, *args, **kwargs):
    """``dipdeploy bench SUITE ARGS...``, its result (exit code, stdout, stderr)."""
    return runner.invoke(app, ["bench", suite, *args], **kwargs)


def one_line_refusal(res, *words):
    """Exit 2 and a single ``error:`` line, no traceback, holding each of ``words``."""
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in res.output, res.output
    for w in words:
        assert w in res.output, res.output


def assert_published_scenarios(suite: str, names) -> None:
    """Each scenario ``names`` (files of ``SCENARIOS``) is for ``suite`` and the results file it backs exists."""
    from dipdeploy.bench.scenario import load

    for name in names:
        sc = load(SCENARIOS / f"{name}.toml")
        assert sc.suite == suite and sc.published, sc
        assert (SCENARIOS.parent / "results" / Path(sc.published).name).is_file(), sc.published
