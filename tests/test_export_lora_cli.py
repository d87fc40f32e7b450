"""`--lora` (a peft adapter made here, merged before quantising) and the export/inspect commands."""

import json

import pytest
import torch
from typer.testing import CliRunner

import dipdeploy.cli.export  # noqa: F401  (registers export and inspect on the app)
from dipdeploy.bundle.manifest import read_manifest
from dipdeploy.cli._app import app
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig

# compared across implementations: CI runs these under every kernel set too (Makefile: test-kernel-sets)
pytestmark = pytest.mark.numerics

runner = CliRunner()


def _adapter(model, path, targets):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    peft_model.save_pretrained(path)
    return path


@pytest.mark.parametrize("model,targets", [("tiny-llama", ["gate_proj", "up_proj", "down_proj", "q_proj"]),
                                           ("tiny-phi3", ["gate_up_proj", "down_proj"])])
def test_lora_merged_before_quantising(tmp_path, model, targets):
    from dipdeploy.loading import load_model

    adapter = _adapter(load_model(model).model, tmp_path / "adapter", targets)
    kw = dict(model=model, method="dip", rho_in=0.6, quant="bq4", validate_tokens=8)
    base = export_model(ExportConfig(**kw), tmp_path / "base")
    tuned = export_model(ExportConfig(lora=str(adapter), **kw), tmp_path / "tuned")
    assert tuned.manifest.validation["agrees_stock"]
    assert tuned.manifest.source["lora"]["r"] == 4
    assert tuned.manifest.files["mlp.bin"]["sha256"] != base.manifest.files["mlp.bin"]["sha256"]


def test_lora_for_another_base_is_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256))
    adapter = _adapter(other, tmp_path / "adapter", ["gate_proj", "up_proj", "down_proj"])
    with pytest.raises(ValueError, match="does not fit"):
        export_model(ExportConfig(model="tiny-llama", rho_in=0.6, lora=str(adapter), validate_tokens=0),
                     tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_cli_export_json_and_inspect_verify(tmp_path):
    out, js = tmp_path / "bundle", tmp_path / "export.json"
    args = ["export", "--model", "tiny-qwen2", "--method", "dip-ca", "--rho-in", "0.6", "--quant", "bq4",
            "--validate-tokens", "8", "--out", str(out), "--json", str(js)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    flat = " ".join(res.stdout.split())
    # the summary's validation figures are one verdict against the reference and its tolerance; the
    # free-running difference has a line of its own that says it is informative, not a failure
    assert "matches its torch reference" in flat and "≤ tolerance" in flat
    assert "max_abs_diff_free_stock" not in flat and "free-running" in flat and "informative" in flat
    assert "dipdeploy eval --model tiny-qwen2 --method dip-ca" in flat
    rec = json.loads(js.read_text())
    for key in ("agrees_stock", "agrees_native", "near_ties_stock", "max_abs_diff", "tolerance", "bytes_mlp",
                "bits_per_weight_mlp"):
        assert key in rec
    assert rec["validation"]["ok"]
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "--force" in res.output
    res = runner.invoke(app, ["inspect", str(out), "--verify", "--json", str(tmp_path / "i.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "i.json").read_text())["problems"] == []
    data = bytearray((out / "dense.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the full checksum of a data file sees it
    (out / "dense.bin").write_bytes(bytes(data))
    res = runner.invoke(app, ["inspect", str(out), "--verify"])
    assert res.exit_code == 1 and "dense.bin: sha256 mismatch" in res.output
    assert read_manifest(out).method == "dip-ca"
    (out / "dense.bin").write_bytes(b"x")  # a wrong size is a structural error: refused on open
    res = runner.invoke(app, ["inspect", str(out)])
    assert res.exit_code == 2 and "dense.bin: size 1 != " in res.output


def test_cli_bad_flag_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["export", "--model", "tiny-llama", "--quant", "int2", "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "quant" in res.output


def test_inspect_prompt_generates_the_validated_tokens(tmp_path):
    out = tmp_path / "b"
    res = export_model(ExportConfig(model="tiny-mistral", method="dip", rho_in=0.6, validate_tokens=8,
                                    prompt="hello"), out)
    js = tmp_path / "g.json"
    r = runner.invoke(app, ["inspect", str(out), "--prompt", "hello", "--max-new-tokens", "8", "--json", str(js)])
    assert r.exit_code == 0, r.output
    gen = json.loads(js.read_text())["generation"]
    v = res.manifest.validation
    ref, picks = v["reference_tokens"], v["picks_stock"]
    # the reference's tokens up to the first step where stock ORT's own pick differs (a near-tie the
    # validation accepted), then ORT's pick there: the same graph in the same loop, after that the
    # contexts differ
    part = next((t for t, (a, b) in enumerate(zip(ref, picks)) if a != b), len(ref))
    n = min(len(gen["tokens"]), part + 1)
    assert gen["tokens"][:n] == (ref[:part] + picks[part:part + 1])[:n] and gen["tokens_per_s"] > 0
