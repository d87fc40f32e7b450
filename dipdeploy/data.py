"""Evaluation and calibration text, cut into token windows (floor 1, no torch import: a window is the tensor
the tokenizer returns).

WikiText-2 raw is found, in order, under ``--data-dir``, ``$DIPDEPLOY_DATA`` (CI: ``../shared/data``),
or the Hugging Face ``datasets`` cache (when ``datasets`` is installed and has it cached). The *test*
split is for evaluation only; calibration and LoRA training use *validation* or a user file.

GPTQ/SparseGPT protocol (docs/method.md): HF rows (blank lines → ""), joined by "\\n\\n", tokenised once,
cut into non-overlapping windows of ``seqlen`` tokens.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from dipdeploy.paths import check_input_dir

if TYPE_CHECKING:
    import torch

SPLITS = {"test": "wiki.test.raw", "validation": "wiki.valid.raw"}


def find_wikitext(split: str, data_dir: str | Path | None = None) -> Path:
    if split not in SPLITS:
        raise ValueError(f"split {split!r} unknown; choose one of {', '.join(SPLITS)}")
    check_input_dir(data_dir, "--data-dir")
    roots = [Path(p) for p in (data_dir, os.environ.get("DIPDEPLOY_DATA")) if p]
    for root in roots:
        for cand in (root / "wikitext-2-raw" / SPLITS[split], root / SPLITS[split]):
            if cand.is_file():
                return cand
    raise FileNotFoundError(
        f"WikiText-2 raw ({SPLITS[split]}) not found under {[str(r) for r in roots] or 'no data dir'}; "
        f"pass --data-dir DIR (holding wikitext-2-raw/{SPLITS[split]}) or set DIPDEPLOY_DATA, "
        f"or use --text-file FILE"
    )


def wikitext_text(split: str, data_dir: str | Path | None = None) -> str:
    check_input_dir(data_dir, "--data-dir")  # a named folder that is missing never falls back to a cache
    try:
        path = find_wikitext(split, data_dir)
    except FileNotFoundError:
        rows = _hf_datasets_rows(split)
        if rows is None:
            raise
        return "\n\n".join(rows)
    with open(path, encoding="utf-8") as f:
        rows = [line if line.strip() else "" for line in f.readlines()]
    return "\n\n".join(rows)


def _hf_datasets_rows(split: str) -> list[str] | None:
    """The HF ``datasets`` cache, offline only; None when unavailable."""
    try:
        import datasets  # noqa: PLC0415
    except ImportError:
        return None
    try:
        ds = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split=split, download_mode="reuse_cache_if_exists")
    except Exception:  # noqa: BLE001 — any failure means "not cached"; the caller raises the clear error
        return None
    return list(ds["text"])


def load_text(dataset: str = "wikitext2", split: str = "test", text_file: str | Path | None = None,
              data_dir: str | Path | None = None) -> str:
    if text_file is not None:
        p = Path(text_file)
        if not p.is_file():
            raise FileNotFoundError(f"text file {p} not found")
        return p.read_text(encoding="utf-8")
    if dataset != "wikitext2":
        raise ValueError(f"dataset {dataset!r} unknown; use wikitext2 or --text-file FILE")
    return wikitext_text(split, data_dir)


def _tokenize(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]


def windows(tokenizer, text: str, seqlen: int, max_windows: int | None = None) -> torch.Tensor:
    """Token windows [N, seqlen] (non-overlapping; the tail that does not fill a window is dropped).

    With ``max_windows``, only a growing prefix of the text is tokenised (whole-text tokenisation of
    WikiText-2 takes tens of seconds on a small CPU). A prefix tokenises to the same tokens as the whole
    text except near its cut, so a margin of tokens past the last window is required before stopping.
    """
    need = None if max_windows is None else max_windows * seqlen
    ids = None
    if need is not None:
        chars = need * 6
        while chars < len(text):
            ids = _tokenize(tokenizer, text[:chars])
            if ids.numel() >= need + 256:
                break
            chars *= 2
        else:
            ids = None
    if ids is None:
        ids = _tokenize(tokenizer, text)
    n = ids.numel() // seqlen
    if n == 0:
        raise ValueError(f"text has {ids.numel()} tokens, fewer than one window of seqlen={seqlen}")
    if max_windows is not None:
        n = min(n, max_windows)
    return ids[: n * seqlen].view(n, seqlen)


def calibration_windows(tokenizer, count: int, seqlen: int, data_dir: str | Path | None = None,
                        text_file: str | Path | None = None) -> torch.Tensor:
    """``count`` windows [count, seqlen] of the calibration text: WikiText-2 *validation* (never test,
    module docstring) or ``text_file``. One definition, so a plan, a quantiser's statistics and an export's
    row order calibrate on the same tokens whichever command computes them."""
    return windows(tokenizer, load_text("wikitext2", "validation", text_file, data_dir), seqlen, count)
