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


class FakeClock:
    """Seconds that move only when a test says so."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_log_mode_a_long_counted_stage_gives_its_count_and_time_left_every_so_often():
    from dipdeploy.progress import LOG_EVERY_S

    out, clock = io.StringIO(), FakeClock()
    p = Progress(stream=out, live=False, clock=clock)
    with p.stage("calibrate dip ρ=0.5, passes") as s:
        s.expect(12)  # the total is known once the stage runs
        for _ in range(3):
            clock.now += LOG_EVERY_S / 2  # 15 s per pass
            s.advance()
        clock.now += 135
        s.advance(9)
    lines = out.getvalue().splitlines()
    assert lines[0] == "calibrate dip ρ=0.5, passes …"
    # the second pass is the first past LOG_EVERY_S: 2 of 12 in 30 s, 10 more at that pace is 150 s
    assert lines[1] == "calibrate dip ρ=0.5, passes: 2/12, 30.0 s, about 2 min 30 s left", lines
    assert lines[2] == "calibrate dip ρ=0.5, passes: 12/12, 180.0 s" and len(lines) == 3, lines
    assert p.seconds["calibrate dip ρ=0.5, passes"] == 180.0


def test_log_mode_a_quick_counted_stage_stays_on_one_line():
    out, clock = io.StringIO(), FakeClock()
    p = Progress(stream=out, live=False, clock=clock)
    with p.stage("eval dip, windows", total=4) as s:
        for _ in range(4):
            clock.now += 1
            s.advance()
    assert out.getvalue() == "eval dip, windows (4) … 4/4, 4.0 s\n"


def test_the_live_bar_shows_the_count_the_total_and_the_time_left():
    from rich.console import Console

    clock = FakeClock()
    p = Progress(stream=io.StringIO(), live=True, clock=clock)
    s = p.start("validate, tokens")
    s.expect(8)
    for _ in range(2):
        clock.now += 10
        s.advance()
    screen = Console(file=io.StringIO(), width=200)
    screen.print(p._bar.make_tasks_table(p._bar.tasks))
    row = screen.file.getvalue()
    assert "2/8" in row and "0:00:20" in row and "left 0:01:00" in row, row  # 6 more at 10 s each
    s.finish()


def test_durations_read_as_a_person_says_them():
    from dipdeploy.progress import duration, time_left

    assert [duration(s) for s in (13.6, 221, 3725)] == ["13.6 s", "3 min 41 s", "1 h 02 min"]
    assert time_left(0, 10, 5.0) is None and time_left(3, None, 5.0) is None and time_left(5, 10, 20.0) == 20.0


def test_exports_calibration_and_validation_count_towards_a_total(tmp_path, data_dir, monkeypatch):
    """The two long steps of an export report a count of a known total, not an open-ended clock."""
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    monkeypatch.setenv("DIPDEPLOY_CACHE", str(tmp_path / "cache"))  # a split searched now, not found cached
    out = io.StringIO()
    export_model(ExportConfig(model="tiny-llama", method="dip", density=0.5, calib_windows=2, calib_seqlen=32,
                              validate_tokens=3, data_dir=str(data_dir)), tmp_path / "b",
                 progress=Progress(stream=out, live=False).steps())
    lines = {line.split(" …")[0]: line for line in out.getvalue().splitlines()}
    # calibration: each of the split search's probes over the 2 windows
    import re

    from dipdeploy.loading import load_model
    from dipdeploy.sparsity.calibrate import SPLIT_RATIOS, split_probes
    from dipdeploy.sparsity.plan import SparsityConfig

    c = load_model("tiny-llama").model.config
    passes = 2 * len(split_probes(SparsityConfig(density=0.5), "tiny-llama", c.num_hidden_layers, c.hidden_size,
                                  c.intermediate_size, SPLIT_RATIOS))
    assert f" {passes}/{passes}, " in lines["calibrate"], lines
    # validation: 3 tokens each of torch's greedy run, the stock ORT path, the native one where the library
    # is built, and each twin of a sparse path (one, or one per path where their selections differ)
    from dipdeploy.ops.native import library_path

    done, total = map(int, re.search(r" (\d+)/(\d+), ", lines["validate"]).groups())
    paths = 2 + (library_path() is not None)
    assert done == total and total in range(3 * (paths + 1), 3 * (2 * paths - 1) + 1, 3), lines["validate"]
