"""`dipdeploy build-ops`: registered, and a bad --arch is a clear error (no build is started)."""

from typer.testing import CliRunner

from dipdeploy.cli import app


def test_build_ops_is_registered() -> None:
    result = CliRunner().invoke(app, ["build-ops", "--help"])
    assert result.exit_code == 0
    assert "--arch" in result.output and "--force" in result.output


def test_build_ops_rejects_unknown_arch() -> None:
    result = CliRunner().invoke(app, ["build-ops", "--arch", "sparc"])
    assert result.exit_code == 2  # bad input, refused before anything is built
    assert "arch 'sparc' is not supported; choose one of x86_64, aarch64" in result.output
