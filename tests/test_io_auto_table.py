"""benchmarks/io_auto.py's table: each --io with and without the limit, medians of the runs that worked,
the failed runs named under the table, and the limit taken from the probe's plan."""

from __future__ import annotations

import sys
from pathlib import Path


def test_table_has_every_configuration_and_names_failures(benchmark_module, monkeypatch, tmp_path):
    io_auto = benchmark_module("io_auto")
    calls = []

    def fake_run(bundle, io, budget, tokens, limit, out):
        calls.append((io, limit, tokens))
        if io == "mmap" and limit is not None and len([c for c in calls if c[:2] == (io, limit)]) == 2:
            return {"error": "exit 137: killed", "peak_group_mb": 300.0}
        chose = "direct" if io == "auto" else io
        tok_s = {"direct": 2.0, "mmap": 5.0 if limit is None else 0.4}[chose] + len(calls) * 1e-3
        return {"chose": chose, "tok_s": tok_s, "plan_mb": 100.0, "device_mb_run": 10.0, "peak_group_mb": 250.0}

    monkeypatch.setattr(io_auto, "run_once", fake_run)
    monkeypatch.setattr(io_auto.flash, "ensure_bundles", lambda model: {("dip-ca", "natural"): tmp_path / "b"})
    monkeypatch.setattr(sys, "argv", ["io_auto.py", "--repeats", "2", "--overhead", "50",
                                      "--json", str(tmp_path / "rows.json")])
    io_auto.main()
    text = (tmp_path / "io-auto.md").read_text()
    assert calls[0] == ("direct", None, 2)  # the probe
    limits = {c[1] for c in calls[1:]}
    assert limits == {None, 150_000_000}  # the probe's plan + --overhead
    assert len(calls) == 1 + 2 * 3 * 2
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| io ")]
    assert len(rows) == 6
    assert any(line.startswith("| auto | direct |  |") for line in rows)
    mmap_limited = next(line for line in rows if line.startswith("| mmap | mmap | 150 |"))
    assert "failed" in mmap_limited  # the failed repeat shows in the runs, its median from the other
    assert "- `--io mmap` limited: exit 137: killed" in text
    assert Path(tmp_path / "rows.json").is_file()
