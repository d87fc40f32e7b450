"""``dipdeploy bench plot``: tokens/s against the memory limit from ``bench decode`` JSON rows."""

import json

from typer.testing import CliRunner

from dipdeploy.bench.plot import series
from dipdeploy.cli import app


def _row(method, limit, tok_s, test="tg32", density=0.5, std=0.1, repetitions=2):
    return {"model": "m", "method": method, "density": density, "budget": "50%", "io": "direct", "threads": 2,
            "test": test, "tok_s": tok_s, "tok_s_std": std, "repetitions": repetitions, "limit": limit}


def _write(path, rows):
    path.write_text(json.dumps({"header": {}, "rows": rows}))
    return path


def test_series_order_limits_with_no_limit_last_and_drop_unmeasured_rows():
    rows = [_row("dip-ca", "none", 9.0), _row("dip-ca", "838MB", 3.0), _row("dip-ca", "559MB", 1.5),
            _row("llama.cpp", "559MB", 0.0, density=None, repetitions=0), _row("dip-ca", "none", 20.0, test="pp128")]
    got = series(rows, "tg32")
    assert list(got) == ["m dip-ca ρ 0.5 t2"]
    assert [p[0] for p in got["m dip-ca ρ 0.5 t2"]] == [559_000_000, 838_000_000, None]


def test_plot_joins_runs_writes_a_png_and_keeps_an_existing_one(tmp_path):
    a = _write(tmp_path / "none.json", [_row("dip-ca", "none", 9.0), _row("dense", "none", 6.0, density=1)])
    b = _write(tmp_path / "l559.json", [_row("dip-ca", "559MB", 1.5), _row("dense", "559MB", 1.0, density=1)])
    out = tmp_path / "plot.png"
    r = CliRunner().invoke(app, ["bench", "plot", str(a), str(b), "--output", str(out), "--test", "tg32"])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before = out.read_bytes()
    r = CliRunner().invoke(app, ["bench", "plot", str(a), "--output", str(out), "--test", "tg32"])
    assert r.exit_code == 2 and "--force" in r.output and out.read_bytes() == before


def test_plot_refuses_a_test_no_row_has_and_a_file_that_is_not_decode_rows(tmp_path):
    a = _write(tmp_path / "none.json", [_row("dip-ca", "none", 9.0)])
    r = CliRunner().invoke(app, ["bench", "plot", str(a), "--output", str(tmp_path / "p.png"), "--test", "tg128"])
    assert r.exit_code == 2 and "tg32" in r.output and not (tmp_path / "p.png").exists()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"x": 1}]}))
    r = CliRunner().invoke(app, ["bench", "plot", str(bad), "--output", str(tmp_path / "p.png")])
    assert r.exit_code == 2 and "bad.json" in r.output


def test_plot_reads_a_decode_document_and_refuses_a_memory_one(tmp_path):
    """A file as `bench decode -o json` writes it now (the schema keys first) reads like one written before
    them; the memory suite's document, or a newer version, is refused in one line naming the file."""
    from dipdeploy.jsonout import VERSIONS, document

    doc = document("bench.decode", {"header": {}, "rows": [_row("dip-ca", "none", 9.0)]})
    new = tmp_path / "new.json"
    new.write_text(json.dumps(doc))
    out = tmp_path / "p.png"
    r = CliRunner().invoke(app, ["bench", "plot", str(new), "--output", str(out), "--test", "tg32"])
    assert r.exit_code == 0, r.output
    for name, data in (("mem.json", document("bench.memory", {"header": {}, "rows": []})),
                       ("later.json", {**doc, "schema_version": VERSIONS["bench.decode"] + 1})):
        (tmp_path / name).write_text(json.dumps(data))
        r = CliRunner().invoke(app, ["bench", "plot", str(tmp_path / name), "--output", str(tmp_path / "q.png")])
        assert r.exit_code == 2 and name in r.output and len(r.output.strip().splitlines()) == 1, r.output
