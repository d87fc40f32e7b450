"""The calibrated VQ3 through the commands: ``export --quant vq3`` and ``eval --quant vq3`` fit it on the
calibration text (``quant.config.calibrated_config``), as ``dipdeploy quantize`` does."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dipdeploy import defaults
from dipdeploy.bundle.manifest import read_manifest, verify
from dipdeploy.cli import app
from dipdeploy.eval import EvalConfig, _quantize
from dipdeploy.export.bundle import export, export_model
from dipdeploy.export.config import ExportConfig
from dipdeploy.export.prepare import make_plan
from dipdeploy.loading import load_model
from dipdeploy.quant.config import CALIBRATED_FEEDBACK, VQ3QuantConfig, calibrated_config
from dipdeploy.quant.fake import mlp_weights
from dipdeploy.quant.layout import mlp_to_rows

CALIB_TOKENS = defaults.STATS_WINDOWS * defaults.CALIB_SEQLEN  # what a calibrated vq3 is fitted on


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_the_commands_default_is_dense_statistics_with_feedback():
    assert calibrated_config("vq3") == VQ3QuantConfig(error_feedback=CALIBRATED_FEEDBACK)
    assert calibrated_config("vq3", hessian="none") == VQ3QuantConfig(hessian="none")  # plain k-means
    assert calibrated_config("vq3", hessian="none", feedback=False) == VQ3QuantConfig(hessian="none")
    assert calibrated_config("vq3", feedback=False) == VQ3QuantConfig()
    assert ExportConfig(quant="vq3").mlp_config() == EvalConfig(quant="vq3").quant_config() == calibrated_config("vq3")


def test_export_calibrated_vq3_bundle_matches_torch(tmp_path, data_dir):
    res = export_model(ExportConfig(model="tiny-qwen2", method="dip", rho_in=0.6, quant="vq3", validate_tokens=8,
                                    data_dir=str(data_dir)), tmp_path / "b")
    v, q = res.manifest.validation, res.manifest.quant
    assert v["ok"] and v["agrees_stock"] and v["agrees_native"] in (None, True)
    assert v["max_abs_diff"] <= v["tolerance"]
    assert q["fit"] == {"statistics": "dense", "error_feedback": True, "calibration_tokens": CALIB_TOKENS,
                        "calibration_text": "wikitext2 validation"}
    assert q["mlp"]["error_feedback"] is True and q["mlp"]["hessian"] == "dense"
    assert verify(tmp_path / "b", read_manifest(tmp_path / "b"), checksums="all") == []
    res = _cli("inspect", tmp_path / "b")
    assert res.exit_code == 0 and f"dense statistics of {CALIB_TOKENS} calibration tokens" in res.output


def _exported_mlps(tmp_path, name: str, data_dir, **vq) -> list[tuple[np.ndarray, np.ndarray]]:
    """The MLP rows (up|gate, down) of an export's torch reference: the values its bundle decodes."""
    lm = load_model("tiny-llama")
    cfg = ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, quant="vq3", validate_tokens=0,
                       per_layer=False, data_dir=str(data_dir), **vq)
    export(lm, cfg, tmp_path / name, make_plan(lm, cfg))
    return [mlp_to_rows(*mlp_weights(layer.mlp, lm.arch)) for layer in lm.model.model.layers]


def test_calibrated_export_fits_the_statistics_better_than_plain_kmeans(tmp_path, data_dir):
    """The error that matters is the layer output's, ‖X ΔWᵀ‖² = tr(Δᵀ H Δ) in the row layout (H = E[x xᵀ]
    of the calibration activations); the calibrated default must beat plain k-means on it, and eval's
    ``--quant vq3`` must hold exactly the export's numbers (one implementation)."""
    from dipdeploy.data import load_text, windows
    from dipdeploy.quant.calib import row_statistics

    lm = load_model("tiny-llama")
    ids = windows(lm.tokenizer, load_text("wikitext2", "validation", None, data_dir), defaults.CALIB_SEQLEN,
                  defaults.STATS_WINDOWS)  # the windows export fits a calibrated vq3 on
    H = row_statistics(lm.model, ids, full=True)
    original = [mlp_to_rows(*mlp_weights(layer.mlp, lm.arch)) for layer in lm.model.model.layers]
    calibrated = _exported_mlps(tmp_path, "cal", data_dir)
    plain = _exported_mlps(tmp_path, "plain", data_dir, vq_hessian="none")

    def weighted_error(fitted) -> float:
        total = 0.0
        for h, w, q in zip(H, original, fitted):
            for k, key in enumerate(("up_gate", "down")):
                d = (w[k] - q[k]).astype(np.float64)
                total += float(((h[key] @ d) * d).sum())
        return total

    assert weighted_error(calibrated) < 0.9 * weighted_error(plain)
    ev = load_model("tiny-llama")
    _quantize(ev, EvalConfig(model="tiny-llama", quant="vq3", data_dir=str(data_dir)), lambda: ids)
    for layer, (ug, dn) in zip(ev.model.model.layers, calibrated):
        got = mlp_to_rows(*mlp_weights(layer.mlp, ev.arch))
        assert np.array_equal(got[0], ug) and np.array_equal(got[1], dn)


@pytest.mark.parametrize("vq", [[], ["--vq-hessian", "dip", "--vq-density", "0.6", "--no-vq-feedback"]])
def test_eval_quant_equals_quantize_then_eval_weights(tmp_path, data_dir, vq):
    common = ["--model", "tiny-llama", "--data-dir", data_dir]
    rows = ["eval", *common, "--method", "dense,dip", "--density", "0.5", "--rho-in", "0.6", "--seqlen", "64",
            "--max-windows", "2"]
    res = _cli("quantize", *common, "--quant", "vq3", *vq, "--out", tmp_path / "w.npz")
    assert res.exit_code == 0, res.output
    res = _cli(*rows, "--weights", tmp_path / "w.npz", "--json", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    res = _cli(*rows, "--quant", "vq3", *vq, "--json", tmp_path / "b.json")
    assert res.exit_code == 0, res.output
    a, b = (json.loads((tmp_path / f).read_text())["rows"] for f in ("a.json", "b.json"))
    assert [r["ppl"] for r in a] == [r["ppl"] for r in b] and len(a) == 2
    fit = b[0]["quant_fit"]
    assert fit["calibration_tokens"] == CALIB_TOKENS
    assert fit["statistics"] == ("dip" if vq else "dense") and fit["error_feedback"] is (not vq)


@pytest.mark.parametrize("args, needle", [
    (["export", "--quant", "bq4", "--vq-hessian", "dense"], "apply to vq3"),
    (["export", "--vq-feedback"], "--quant vq3"),
    (["export", "--quant", "vq3", "--stream"], "--vq-hessian none"),
    (["export", "--quant", "vq3", "--vq-hessian", "none", "--vq-feedback"], "drop --vq-feedback"),
    (["eval", "--weights", "w.npz", "--vq-hessian", "dense"], "dipdeploy quantize"),
    (["eval", "--quant", "vq3", "--vq-density", "0.5"], "--vq-hessian dip"),
    (["eval", "--quant", "bq4", "--no-vq-feedback"], "apply to vq3"),
    (["quantize", "--quant", "vq3", "--vq-hessian", "full", "--out", "q.npz"], "hessian"),
    (["export", "--quant", "vq3", "--calib-windows", "0"], "calib_windows"),
    (["export", "--quant", "vq3", "--stats-windows", "0"], "stats_windows"),
    (["eval", "--quant", "vq3", "--stats-windows", "0"], "--stats-windows"),
    (["quantize", "--quant", "vq3", "--stats-windows", "0", "--out", "q.npz"], "--stats-windows"),
])
def test_vq_options_refused_in_one_line_where_they_do_not_apply(tmp_path, args, needle):
    args = [str(tmp_path / a) if a.endswith(".npz") else a for a in args]
    if args[0] == "export":
        args += ["--out", str(tmp_path / "b")]
    res = _cli(*args[:1], "--model", "tiny-llama", *args[1:])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists() and not (tmp_path / "q.npz").exists()
