"""Tests of the torch fake-quant path and the packed-weights file (tiny models built in the test)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dipdeploy.quant import Block4QuantConfig, VQ3QuantConfig, dequantize_rows, mlp_to_rows, quantize  # noqa: E402
from dipdeploy.arch import arch_of_model  # noqa: E402
from dipdeploy.quant.fake import mlp_weights, quant_config_from_name, quantize_model_, write_packed_mlp  # noqa: E402
from dipdeploy.quant.io import bits_per_weight, load_packed, read_header, save_packed  # noqa: E402
from dipdeploy.quant.api import quantize_dense  # noqa: E402


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg).eval()


def _phi3():
    torch.manual_seed(0)
    cfg = transformers.Phi3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                  pad_token_id=0)
    return transformers.Phi3ForCausalLM(cfg).eval()


@pytest.mark.parametrize("build", [_llama, _phi3])
@pytest.mark.parametrize("name", ["bq4-b32", "rtn3", "vq3"])
def test_quantize_model_matches_numpy_rows(build, name):
    model = build()
    cfg = quant_config_from_name(name)
    before = [mlp_weights(layer.mlp, arch_of_model(model)) for layer in model.model.layers]
    report = quantize_model_(model, cfg, "mlp", progress=False)
    for (wu, wg, wd), layer in zip(before, model.model.layers):
        ug, down = mlp_to_rows(wu, wg, wd)
        exp_u, exp_g = np.split(dequantize_rows(quantize(ug, cfg)), 2, axis=1)
        got_u, got_g, got_d = mlp_weights(layer.mlp, arch_of_model(model))
        np.testing.assert_allclose(got_u, exp_u.T, atol=1e-7)
        np.testing.assert_allclose(got_g, exp_g.T, atol=1e-7)
        np.testing.assert_allclose(got_d, dequantize_rows(quantize(down, cfg)).T, atol=1e-7)
        assert not np.allclose(got_u, wu)
    assert report.n_params_mlp == 2 * 3 * 64 * 128 and report.layers == 2
    assert report.bits_per_weight == report.bits_per_weight_mlp
    if name == "bq4-b32":
        assert report.bits_per_weight_mlp == 4.5
    if name == "rtn3":  # up|gate rows (256 cols) = 2 whole blocks; down rows (64 cols) padded to 128
        assert report.bits_per_weight_mlp == pytest.approx((64 * 256 * 3.125 + 128 * (48 + 2) * 8) / (3 * 64 * 128))


def test_phi3_gate_is_first_half():
    model = _phi3()
    w = model.model.layers[0].mlp.gate_up_proj.weight.detach().numpy()
    wu, wg, _ = mlp_weights(model.model.layers[0].mlp, arch_of_model(model))
    np.testing.assert_array_equal(wg, w[:128])
    np.testing.assert_array_equal(wu, w[128:])


def test_scope_all_quantises_the_embedding_and_counts_everything():
    """scope all = what a default quantised bundle ships: attention, lm_head and the int4 embedding."""
    model = _llama()
    emb = model.get_input_embeddings().weight.detach().clone()
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    ref = model(input_ids=ids).logits
    report = quantize_model_(model, VQ3QuantConfig(), "all", progress=False)
    want = dequantize_rows(quantize_dense(emb.numpy(), VQ3QuantConfig()))
    np.testing.assert_array_equal(model.get_input_embeddings().weight.detach().numpy(), want)
    attn = 2 * (64 * 64 * 2 + 64 * 32 * 2)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied: one table
    assert report.n_params == report.n_params_mlp + attn + 256 * 64
    out = model(input_ids=ids).logits
    assert torch.isfinite(out).all() and not torch.allclose(out, ref)
    with pytest.raises(ValueError, match="scope"):
        quantize_model_(model, VQ3QuantConfig(), "attn")


def test_scope_all_with_an_fp32_embedding_unties_the_head_and_keeps_the_table():
    model = _llama()
    emb = model.get_input_embeddings().weight.detach().clone()
    report = quantize_model_(model, VQ3QuantConfig(), "all", progress=False, embedding="fp32")
    assert torch.equal(model.get_input_embeddings().weight, emb)
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    attn = 2 * (64 * 64 * 2 + 64 * 32 * 2)
    assert report.n_params == report.n_params_mlp + attn + 256 * 64
    assert any("untied" in n for n in report.notes)


def test_scope_all_quantises_an_untied_head_apart():
    model = _llama()
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() * 2)
    report = quantize_model_(model, VQ3QuantConfig(), "all", progress=False)
    attn = 2 * (64 * 64 * 2 + 64 * 32 * 2)
    assert report.n_params == report.n_params_mlp + attn + 2 * 256 * 64
    np.testing.assert_array_equal(model.lm_head.weight.detach().numpy(),
                                  2 * model.get_input_embeddings().weight.detach().numpy())


def test_calibration_row_weights_are_used():
    model = _llama()
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    report = quantize_model_(model, VQ3QuantConfig(group_size=1024), "mlp", calib_ids=ids, progress=False)
    assert any("Hessian" in n for n in report.notes)


def test_packed_file_roundtrip(tmp_path):
    model = _llama()
    cfg = Block4QuantConfig(block_size=32, symmetric=False)
    out = write_packed_mlp(model, cfg, tmp_path / "w.npz", model_name="tiny", progress=False)
    loaded_cfg, tensors, header = load_packed(out)
    assert loaded_cfg == cfg and header["model"] == "tiny"
    assert sorted(tensors) == ["layers.0.down", "layers.0.up_gate", "layers.1.down", "layers.1.up_gate"]
    ug, _ = mlp_to_rows(*mlp_weights(model.model.layers[1].mlp, arch_of_model(model)))
    np.testing.assert_array_equal(dequantize_rows(tensors["layers.1.up_gate"]), dequantize_rows(quantize(ug, cfg)))
    assert bits_per_weight(header) == pytest.approx(4 + 20 / 32)
    with pytest.raises(FileExistsError, match="--force"):
        write_packed_mlp(model, cfg, out, progress=False)
    write_packed_mlp(model, VQ3QuantConfig(), out, force=True, progress=False)
    assert isinstance(load_packed(out)[0], VQ3QuantConfig)
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]  # no temp file left behind


def test_packed_file_rejects_foreign_files(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="dipdeploy quantize"):
        read_header(tmp_path / "x.npz")
    save_packed(tmp_path / "y.npz", Block4QuantConfig(), [("t", quantize(np.ones((2, 64), np.float32), Block4QuantConfig()))])
    assert read_header(tmp_path / "y.npz")["version"] == 1


def test_cli_quantize_registered():
    from typer.testing import CliRunner

    from dipdeploy.cli import app

    res = CliRunner().invoke(app, ["quantize", "--help"])
    assert res.exit_code == 0 and "--quant" in res.output
    res = CliRunner().invoke(app, ["quantize", "--model", "tiny-llama", "--quant", "q2", "--out", "x.npz"])
    assert res.exit_code != 0 and "unknown" in res.output


def test_gptq_preset_needs_and_uses_calibration():
    model = _llama()
    cfg = quant_config_from_name("bq4-b64-gptq")
    with pytest.raises(ValueError, match="calib"):
        quantize_model_(model, cfg, "mlp", progress=False)
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(2))
    ref = _llama()
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    plain = _llama()
    quantize_model_(plain, quant_config_from_name("bq4-b64"), "mlp", progress=False)
    report = quantize_model_(model, cfg, "mlp", calib_ids=ids, progress=False)
    assert any("GPTQ" in n for n in report.notes) and report.bits_per_weight_mlp == 4.25
    with torch.no_grad():
        err_fb = float(((model(input_ids=ids).logits - want) ** 2).mean())
        err_plain = float(((plain(input_ids=ids).logits - want) ** 2).mean())
    assert err_fb < err_plain
    everything = quantize_model_(_llama(), cfg, "all", calib_ids=ids, progress=False)  # dense parts: plain BQ4
    assert everything.n_params > everything.n_params_mlp and any("round-to-nearest" in n or "BQ4" in n or "Block4" in n
                                                                  for n in everything.notes)
