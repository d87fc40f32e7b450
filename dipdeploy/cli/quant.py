"""CLI commands of the quant stage: ``dipdeploy quantize`` (packed MLP weights for ``dipdeploy eval --weights``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dipdeploy import defaults
from dipdeploy.cli._app import app
from dipdeploy.cli.core import (CALIB_SEQLEN, STATS_WINDOWS, VQ_DENSITY, VQ_FEEDBACK, VQ_HESSIAN, check_inputs, console,
                                fail)
from dipdeploy.quant.config import QUANT_PRESETS
from dipdeploy.terminal import shown


@app.command("quantize")
def quantize_cmd(
    model: str = typer.Option(defaults.MODEL, "--model", "-m", help="registry name (see `dipdeploy models`), HF "
                              "directory or .gguf"),
    quant: str = typer.Option(..., "--quant", help=f"format: {', '.join(QUANT_PRESETS)}"),
    out: Path = typer.Option(..., "--out", help="packed-weights file to write (.npz)"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing --out"),
    stats_windows: int = STATS_WINDOWS,
    calib_seqlen: int = CALIB_SEQLEN,
    vq_hessian: Optional[str] = VQ_HESSIAN,
    vq_feedback: Optional[bool] = VQ_FEEDBACK,
    vq_density: Optional[float] = VQ_DENSITY,
    data_dir: Path | None = typer.Option(None, "--data-dir", help="folder holding wikitext-2-raw/ (else $DIPDEPLOY_DATA)"),
) -> None:
    """Quantise the MLP weights in the sparse row layout and write them (with their config) to one file,
    for `dipdeploy eval --weights FILE` (a calibrated format — vq3, -gptq — is calibrated once, not at
    every evaluation)."""
    from dipdeploy.progress import Progress
    from dipdeploy.quant.config import calibrated_config

    try:
        cfg = calibrated_config(quant, hessian=vq_hessian, feedback=vq_feedback, density=vq_density)
        check_inputs(data_dir=data_dir, outputs={"--out": out}, force=force)
        if cfg.statistics() is not None and (stats_windows < 1 or calib_seqlen < 16):
            raise ValueError(f"--stats-windows {stats_windows} --calib-seqlen {calib_seqlen}: give at least 1 "
                             f"window of 16 tokens")
        check_inputs(model=model)
        from dipdeploy.loading import load_model
        from dipdeploy.quant.fake import write_packed_mlp
        from dipdeploy.quant.io import bits_per_weight, read_header
        from dipdeploy.sparsity.methods import uniform_dip

        progress = Progress()
        with progress.stage(f"load {model}"):
            lm = load_model(model)
        calib = None
        if cfg.statistics() is not None:
            from dipdeploy.data import calibration_windows

            calib = calibration_windows(lm.tokenizer, stats_windows, calib_seqlen, data_dir)
        with progress.stage(f"quantise the MLP ({quant})"):
            path = write_packed_mlp(lm.model, cfg, out, model_name=lm.name, force=force, calib_ids=calib,
                                    progress=False, under_dip=uniform_dip)
    except (ValueError, OSError, KeyError) as err:
        fail(err)
    header = read_header(path)
    console.print(f"wrote {shown(path)} ({path.stat().st_size / 2**20:.1f} MiB, {len(header['tensors'])} tensors, "
                  f"{type(cfg).__name__}, {bits_per_weight(header):.4f} bits/weight)")
