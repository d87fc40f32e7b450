"""benchmarks/iso_runtime.py's table: the sweep's DIP densities and dense-static at every budget, each
ratio taken within one repeat, perplexity from the iso-accuracy table, and one line per tolerance."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ISO = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "iso-accuracy-smollm2.md"


def test_rows_ratios_and_iso_lines(benchmark_module, monkeypatch, tmp_path):
    iso_runtime = benchmark_module("iso_runtime")
    shutil.copy(ISO, tmp_path / ISO.name)
    calls = []

    def fake_measure(bundle, policy, budget, tokens, gamma):
        assert gamma == 1.0  # plain DIP selection, the method the sweep measured
        calls.append((bundle.name, policy, budget))
        rep = sum(c == calls[-1] for c in calls)  # the repeat: dense-static is 10 tok/s, then 20
        tok_s = 10.0 * rep if policy == "static" else {0.75: 12.0, 0.825: 9.0}[float(bundle.name)] * rep
        return {"io": "direct", "tok_s": tok_s, "flash_mb_per_token": 1.0, "device_mb_per_token": 2.0,
                "requests_per_token": 100.0, "hit_rate": 0.5}

    monkeypatch.setattr(iso_runtime, "measure", fake_measure)
    monkeypatch.setattr(iso_runtime, "bundle_for", lambda model, d, root: tmp_path / f"{d:g}")
    monkeypatch.setattr(iso_runtime, "plot", lambda *a, **k: None)
    monkeypatch.setattr(sys, "argv", ["iso_runtime.py", "--densities", "0.75,0.825", "--budgets", "50%",
                                      "--repeats", "2", "--tokens", "4", "--json", str(tmp_path / "rows.json")])
    iso_runtime.main()
    assert [c[:2] for c in calls[:3]] == [("1", "static"), ("0.75", "lfu"), ("0.825", "lfu")]  # interleaved
    rows = {(r["method"], r["density"]): r for r in json.loads((tmp_path / "rows.json").read_text())}
    assert rows["dip", 0.825]["x_dense_static"] == pytest.approx(0.9)  # 9/10 and 18/20: within each repeat
    assert rows["dip", 0.825]["tok_s"] == pytest.approx(13.5)
    assert rows["dip", 0.825]["ppl"] == 20.89 and rows["dense-static", 1.0]["ppl"] == 20.71  # the sweep's figures
    text = (tmp_path / "iso-runtime-smollm2.md").read_text()
    assert "- dip +1%: lowest ρ 0.825; budget 50%: 13.5 tok/s, 0.90× dense-static" in text
    assert "- dip +3%: lowest ρ 0.75; budget 50%: 18.0 tok/s, 1.20× dense-static" in text
    assert "- cats +1%: lowest ρ 0.875 (not exportable" in text


def test_a_missing_or_foreign_table_is_one_line(benchmark_module, monkeypatch, tmp_path, capsys):
    iso_runtime = benchmark_module("iso_runtime")
    (tmp_path / "other.md").write_text("# something else\n")
    for table, says in ((tmp_path / "none.md", "no such file"), (tmp_path / "other.md", "not an iso_accuracy.py")):
        monkeypatch.setattr(sys, "argv", ["iso_runtime.py", "--from", str(table)])
        with pytest.raises(SystemExit) as exit_:
            iso_runtime.main()
        assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_dip_ca_rows_take_their_own_perplexity_per_budget(benchmark_module, monkeypatch, tmp_path):
    """--dip-ca: DIP-CA at DIP's lowest densities, its bundle's γ, its perplexity evaluated at each budget's
    cache fraction (DIP's where every row is resident), a line under each DIP iso line."""
    iso_runtime = benchmark_module("iso_runtime")
    shutil.copy(ISO, tmp_path / ISO.name)
    evaluated, gammas = [], {}

    def fake_measure(bundle, policy, budget, tokens, gamma):
        gammas[bundle.name] = gamma
        tok_s = 10.0 if policy == "static" else 11.0 if bundle.name.startswith("ca") else 9.0
        return {"io": "direct", "tok_s": tok_s, "flash_mb_per_token": 1.0, "device_mb_per_token": 2.0,
                "requests_per_token": 100.0, "hit_rate": 0.5}

    def fake_ppl(model, density, frac, protocol, memo):
        evaluated.append((density, frac, protocol))
        return 20.91 if density == 0.825 else 22.0

    monkeypatch.setattr(iso_runtime, "measure", fake_measure)
    monkeypatch.setattr(iso_runtime, "dipca_ppl", fake_ppl)
    monkeypatch.setattr(iso_runtime, "bundle_for",
                        lambda model, d, root, method="dip": tmp_path / f"{'ca' if method == 'dip-ca' else ''}{d:g}")
    monkeypatch.setattr(iso_runtime, "plot", lambda *a, **k: None)
    monkeypatch.setattr(sys, "argv", ["iso_runtime.py", "--from", str(tmp_path / ISO.name), "--densities", "0.825",
                                      "--budgets", "50%,100%", "--repeats", "1", "--dip-ca",
                                      "--json", str(tmp_path / "rows.json")])
    iso_runtime.main()
    assert gammas == {"1": 1.0, "0.825": 1.0, "ca0.75": None, "ca0.825": None}  # DIP-CA: the bundle's γ
    assert sorted(evaluated) == [(0.75, 0.5, (16, 2048)), (0.825, 0.5, (16, 2048))]  # not at 100 %
    rows = {(r["method"], r["density"], r["budget"]): r for r in json.loads((tmp_path / "rows.json").read_text())}
    assert rows["dip-ca", 0.825, "50%"]["ppl"] == 20.91 and rows["dip-ca", 0.825, "100%"]["ppl"] == 20.89
    assert rows["dip-ca", 0.825, "50%"]["x_dense_static"] == pytest.approx(1.1)
    text = (tmp_path / "iso-runtime-smollm2.md").read_text()
    assert "  - dip-ca at the same ρ, budget 50%: PPL 20.91 (within +1%), 11.0 tok/s, 1.10× dense-static" in text
    assert "  - dip-ca at the same ρ, budget 50%: PPL 22.00 (outside +3%)" in text
    monkeypatch.setattr(sys, "argv", ["iso_runtime.py", "--from", str(tmp_path / ISO.name), "--budgets", "100MB",
                                      "--dip-ca"])
    with pytest.raises(SystemExit) as exit_:
        iso_runtime.main()
    assert exit_.value.code == 2
