"""``verify`` refuses a bundle whose files are intact but whose parts do not describe one model that can
run (dipdeploy/bundle/runnable.py): each edit below passed every file check and then failed inside
onnxruntime at the first token (a plan K the graph does not take, KV heads or head size the attention
graph does not take, a weight tensor of another shape), at the position past a short RoPE table, or in the
runtime's own late check. The edited file's sha256 is recomputed into the manifest, so only the
consistency checks can catch it; each refusal is one line naming the problem, exit 2 in the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dipdeploy.cli.export  # noqa: F401  (registers inspect)
from dipdeploy.bundle.manifest import BundleError, file_record, read_manifest, verify
from dipdeploy.bundle.names import GENAI_CONFIG, MANIFEST
from dipdeploy.cli._app import app

runner = CliRunner()


def _manifest(change):
    def edit(bundle: Path) -> None:
        raw = json.loads((bundle / MANIFEST).read_text())
        change(raw)
        (bundle / MANIFEST).write_text(json.dumps(raw))
    return edit


def _genai(change):
    """An edit of genai_config.json, its sha256 and size recomputed into the manifest."""
    def edit(bundle: Path) -> None:
        g = json.loads((bundle / GENAI_CONFIG).read_text())
        change(g["model"])
        (bundle / GENAI_CONFIG).write_text(json.dumps(g))
        _manifest(lambda r: r["files"].__setitem__(GENAI_CONFIG, file_record(bundle / GENAI_CONFIG)))(bundle)
    return edit


def _layer(key, value):
    return _manifest(lambda r: r["plan"]["layers"][0].__setitem__(key, value))


def _decoder(key, value):
    return _genai(lambda m: m["decoder"].__setitem__(key, value))


def _shape(tensor, shape):
    return _manifest(lambda r: r["tensors"][tensor].__setitem__("shape", shape))


def _short_rope(raw):
    for name in ("model.rope.cos", "model.rope.sin"):
        t = raw["tensors"][name]
        t["shape"][0] //= 2
        t["length"] //= 2


def _both(*edits):
    def edit(bundle):
        for e in edits:
            e(bundle)
    return edit


EDITS = {
    "plan k_in below the graph's": (_layer("k_in", 10), "input in_indices takes 38 at dim 1 but plan.layers[0].k_in gives 10"),
    "plan k_in above the graph's": (_layer("k_in", 64), "plan.layers[0].k_in gives 64"),
    "plan k_glu below the graph's": (_layer("k_glu", 5), "at dim 1 but plan.layers[0].k_glu gives 5"),
    "genai KV heads": (_decoder("num_key_value_heads", 1), "decoder.num_key_value_heads 1 but source.config"),
    "genai head size": (_decoder("head_size", 8), "decoder.head_size 8 but source.config.head_dim 16"),
    "genai layer count": (_decoder("num_hidden_layers", 3), "decoder.num_hidden_layers 3"),
    "config KV heads": (_manifest(lambda r: r["source"]["config"].__setitem__("num_key_value_heads", 1)),
                        "decoder.num_key_value_heads 2 but source.config.num_key_value_heads 1"),
    "config and plan intermediate size": (_manifest(lambda r: (r["source"]["config"].__setitem__("intermediate_size", 64),
                                                              r["plan"].__setitem__("intermediate_size", 64))),
                                          "cache_glu takes 128 at dim 0 but the intermediate size gives 64"),
    "MLP tensor shape transposed": (_shape("model.layers.0.mlp.down.qweight", [32, 128]),
                                    "down.qweight takes 32 at dim 1 but tensor model.layers.0.mlp.down.qweight"),
    "MLP scales of another width": (_shape("model.layers.0.mlp.up_gate.scales", [128, 2]),
                                    "up_gate.scales takes 4 at dim 1"),
    "unknown attention layout": (_manifest(lambda r: r["export_config"].__setitem__("attention", "sliding")),
                                 "export_config.attention 'sliding' is not one of standard, gqa"),
    "RoPE table shorter than the positions": (_manifest(_short_rope), "tensor model.rope.cos: 128 RoPE positions but "
                                                                      "the bundle claims 256"),
    "positions raised past the RoPE table": (_both(_genai(lambda m: m.__setitem__("context_length", 1024)),
                                                   _manifest(lambda r: r["source"]["config"].__setitem__(
                                                       "max_position_embeddings", 1024))),
                                             "256 RoPE positions but the bundle claims 1024"),
    "embedding scales of another vocabulary": (_shape("model.embed_tokens.scales", [128, 2]),
                                               "model.embed_tokens.qweight has 256 rows but model.embed_tokens.scales 128"),
}


@pytest.fixture(params=sorted(EDITS))
def edited(request, tiny_dipca_bundle, tmp_path):
    edit, message = EDITS[request.param]
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_dipca_bundle(), bundle)
    edit(bundle)
    return bundle, message


def test_the_intact_bundle_is_runnable(tiny_dipca_bundle):
    """The control: what export writes passes, so each refusal below is its edit's."""
    bundle = tiny_dipca_bundle()
    assert verify(bundle, read_manifest(bundle), "all") == []
    assert runner.invoke(app, ["inspect", str(bundle), "--verify"]).exit_code == 0


def test_verify_refuses_a_bundle_that_cannot_run(edited):
    bundle, message = edited
    problems = verify(bundle, checksums="all")
    assert any(message in p for p in problems), problems
    with pytest.raises(BundleError, match="dipdeploy export") as err:
        read_manifest(bundle)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_inspect_verify_and_run_refuse_in_one_line(edited):
    from dipdeploy.runtime import Engine

    bundle, message = edited
    res = runner.invoke(app, ["inspect", str(bundle), "--verify"])
    out = res.output.strip()
    assert res.exit_code == 2 and len(out.splitlines()) == 1 and message in out, out
    with pytest.raises(BundleError, match="dipdeploy export"):
        Engine(bundle, native=False)
