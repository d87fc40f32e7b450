"""dipdeploy.progress in log mode (what a pipe or a log file gets), and export's seconds covering every stage."""

import io
import json

from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.progress import Progress


def test_log_mode_one_line_per_stage_no_carriage_returns():
    out = io.StringIO()
    p = Progress(stream=out, live=False)
    with p.stage("load tiny") as s:
        pass
    with p.stage("eval dip, windows", total=3) as s:
        for _ in range(3):
            s.advance()
    steps = p.steps()
    steps("quantise")
    steps("validate")
    steps()
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n")
    assert len(lines) == 4, lines
    assert [line.split(" …")[0] for line in lines] == ["load tiny", "eval dip, windows (3)", "quantise", "validate"]
    assert all(line.endswith(" s") for line in lines) and "3/3," in lines[1]
    assert set(p.seconds) == {"load tiny", "eval dip, windows", "quantise", "validate"}


def test_log_mode_nested_stage_ends_the_open_line_first():
    out = io.StringIO()
    p = Progress(stream=out, live=False)
    with p.stage("outer"):
        with p.stage("inner"):
            pass
    lines = out.getvalue().splitlines()
    assert lines[0] == "outer …" and lines[1].startswith("inner …") and lines[2].startswith("outer: ")
    assert "\r" not in out.getvalue()


def test_a_stage_that_raises_still_ends_its_line():
    out = io.StringIO()
    p = Progress(stream=out, live=False)
    try:
        with p.stage("work"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert out.getvalue().startswith("work …") and out.getvalue().endswith(" s\n") and "work" in p.seconds


def test_quiet_reports_nothing_but_times():
    out = io.StringIO()
    p = Progress(stream=out, quiet=True)
    with p.stage("x", total=2) as s:
        s.advance(2)
    assert out.getvalue() == "" and "x" in p.seconds and not p.live


def test_not_a_terminal_means_log_mode():
    assert Progress(stream=io.StringIO()).live is False  # pytest captures stdout/stderr: not terminals


def test_export_json_seconds_include_load_and_calibration(tmp_path, data_dir):
    """The reported seconds cover the whole export: loading and calibration are stages of it too."""
    out, js = tmp_path / "b", tmp_path / "e.json"
    res = CliRunner().invoke(app, ["export", "--model", "tiny-llama", "--method", "dip", "--density", "0.5",
                                   "--validate-tokens", "0", "--no-per-layer", "--data-dir", str(data_dir),
                                   "--out", str(out), "--json", str(js)])
    assert res.exit_code == 0, res.output
    summary = json.loads(js.read_text())
    steps = summary["steps_s"]
    assert {"load", "calibrate", "quantise + build graphs", "write bundle", "manifest", "swap into place"} <= set(steps)
    assert summary["seconds"] >= sum(steps.values()) - 0.05  # the total holds every stage, calibration included
    assert summary["seconds"] >= steps["calibrate"] + steps["load"]
    for stage in ("load …", "calibrate …", "swap into place …"):
        assert stage in res.output  # log mode: the stages were reported while they ran
    assert "\r" not in res.output


def test_run_reports_a_long_prompts_prefill_then_prints_the_prompt(tmp_path):
    """Prompt tokens are fed one at a time: a long prompt gets a stage, ended before the streamed text."""
    from dipdeploy.cli.run import PREFILL_PROGRESS
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = tmp_path / "b"
    export_model(ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, validate_tokens=0), out)
    prompt = "a" * PREFILL_PROGRESS  # the tiny models' tokenizer is byte-level: one token per character
    res = CliRunner().invoke(app, ["run", str(out), "-p", prompt, "-n", "2", "--no-native"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("prefill the prompt"))
    assert f"{PREFILL_PROGRESS}/{PREFILL_PROGRESS}," in line and line.endswith(" s")
    assert res.output.index(line) < res.output.index(prompt)
    short = CliRunner().invoke(app, ["run", str(out), "-p", "ab", "-n", "2", "--no-native"])
    assert short.exit_code == 0 and "prefill the prompt" not in short.output
