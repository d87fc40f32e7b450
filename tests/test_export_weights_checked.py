"""Export checks the weights it reads before it writes anything: a tensor of another shape than the
config's model (a 16-row embedding for a 256-token vocabulary) or holding NaN/Inf is refused in one line
naming the tensor, exit 2, streamed or not, and no bundle is left behind (dipdeploy/checkpoint.py
``check_weight``)."""

import shutil

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import dipdeploy.cli  # noqa: F401  (registers every command)
from dipdeploy.cli._app import app
from dipdeploy.loading import resolve

runner = CliRunner()


def _short_embedding(t: dict) -> str:
    t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"][:16].clone()
    return "model.embed_tokens.weight has shape [16, 64]"


def _narrow_down(t: dict) -> str:
    t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"][:32].clone()
    return "model.layers.0.mlp.down_proj.weight has shape [32, 128]"


def _nan_mlp(t: dict) -> str:
    t["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    return "model.layers.1.mlp.up_proj.weight holds 1 NaN or Inf value"


def _inf_norm(t: dict) -> str:
    t["model.layers.0.input_layernorm.weight"][:2] = float("inf")
    return "model.layers.0.input_layernorm.weight holds 2 NaN or Inf values"


DAMAGE = {"short embedding": _short_embedding, "narrow down_proj": _narrow_down, "NaN in an MLP weight": _nan_mlp,
          "Inf in a norm": _inf_norm}


@pytest.fixture(scope="module", params=sorted(DAMAGE))
def damaged(request, tmp_path_factory):
    """A copy of tiny-llama's checkpoint with one tensor damaged, and the words its refusal must hold."""
    src, _ = resolve("tiny-llama")
    out = tmp_path_factory.mktemp("damaged") / "model"
    shutil.copytree(src, out)
    tensors = load_file(str(out / "model.safetensors"))
    says = DAMAGE[request.param](tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out, says


@pytest.mark.parametrize("mode", ["--stream", "--no-stream"])
@pytest.mark.parametrize("quant", ["none", "bq4"])
def test_damaged_weights_are_refused_in_one_line(damaged, tmp_path, mode, quant):
    model, says = damaged
    out = tmp_path / "bundle"
    res = runner.invoke(app, ["export", "--model", str(model), "--method", "dip", "--rho-in", "0.6", "--quant", quant,
                              "--validate-tokens", "2", mode, "--out", str(out)])
    lines = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and says in lines[0], res.output
    assert "Traceback" not in res.output
    assert not out.exists() and not any(p.name.startswith(".bundle") for p in tmp_path.iterdir())


def test_the_intact_checkpoint_is_accepted(tmp_path):
    """The control: the same command on the undamaged copy exports (so each refusal is its damage's)."""
    src, _ = resolve("tiny-llama")
    model = tmp_path / "model"
    shutil.copytree(src, model)
    save_file(load_file(str(model / "model.safetensors")), str(model / "model.safetensors"), metadata={"format": "pt"})
    res = runner.invoke(app, ["export", "--model", str(model), "--method", "dip", "--rho-in", "0.6", "--quant", "none",
                              "--validate-tokens", "0", "--stream", "--out", str(tmp_path / "bundle")])
    assert res.exit_code == 0, res.output
