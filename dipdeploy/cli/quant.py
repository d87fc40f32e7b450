"""CLI commands of the quant stage: ``dipdeploy quantize`` (packed MLP weights for ``dipdeploy eval --weights``)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from dipdeploy import defaults
from dipdeploy.cli._app import app
from dipdeploy.quant.config import QUANT_PRESETS

console = Console()


@app.command("quantize")
def quantize_cmd(
    model: str = typer.Option(defaults.MODEL, "--model", "-m", help="registry name (see `dipdeploy models`), HF "
                              "directory or .gguf"),
    quant: str = typer.Option(..., "--quant", help=f"format: {', '.join(QUANT_PRESETS)}"),
    out: Path = typer.Option(..., "--out", help="packed-weights file to write (.npz)"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing --out"),
    calib_windows: int = typer.Option(16, "--calib-windows", help="-gptq formats: calibration windows (validation split)"),
    calib_seqlen: int = typer.Option(512, "--calib-seqlen", help="-gptq formats: tokens per calibration window"),
    data_dir: str | None = typer.Option(None, "--data-dir", help="folder holding wikitext-2-raw/ (else $DIPDEPLOY_DATA)"),
) -> None:
    """Quantise the MLP weights in the sparse row layout and write them (with their config) to one file,
    for `dipdeploy eval --weights FILE` (a -gptq format is calibrated once, not at every evaluation)."""
    from dipdeploy.quant.config import quant_config_from_name

    try:
        cfg = quant_config_from_name(quant)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--quant") from err
    if out.exists() and not force:
        raise typer.BadParameter(f"{out} exists; pass --force to overwrite it", param_hint="--out")
    from dipdeploy.loading import load_model
    from dipdeploy.quant.fake import write_packed_mlp
    from dipdeploy.quant.io import bits_per_weight, read_header

    lm = load_model(model)
    calib = None
    if cfg.error_feedback:
        from dipdeploy.eval.data import load_text, windows

        calib = windows(lm.tokenizer, load_text("wikitext2", "validation", None, data_dir), calib_seqlen, calib_windows)
    path = write_packed_mlp(lm.model, cfg, out, model_name=lm.name, force=force, calib_ids=calib)
    header = read_header(path)
    console.print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, {len(header['tensors'])} tensors, "
                  f"{type(cfg).__name__}, {bits_per_weight(header):.4f} bits/weight)")
