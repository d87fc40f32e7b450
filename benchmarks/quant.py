"""Benchmark: BQ4 / VQ3 / RTN3 weight quantisation of SmolLM2-135M in the sparse row layout.

Two parts, both on the embedded SmolLM2-135M (GGUF Q4_1 weights, dequantised to fp32 by the loader):

1. Reconstruction of the MLP weights (all 30 layers): exact bits per weight, SQNR, quantisation time.
   A reference row re-applies a Q4_1-style code (fp16 scale + fp16 min, block 32) *along the GGUF's own
   block direction* (the input dimension): that is what the checkpoint already is. Our rows run along
   the other dimension (output features of W_u/W_g, of W_d), so every format here re-quantises.
2. WikiText-2 test perplexity (``dipdeploy.eval.evaluate``) for {fp, BQ4 b32, BQ4 b64, VQ3, RTN3} ×
   {dense, DIP ρ = 0.5}, plus VQ3 + DIP at the density that reads the same MLP bytes per token as
   BQ4 b64 + DIP ρ = 0.5 (ρ = 0.5 · 4.25 / bits(VQ3)).

    python benchmarks/quant.py --quick               # < 2 min: 3 layers, 2 windows of 512 tokens
    python benchmarks/quant.py --json out.json --force   # full: seqlen 2048, 16 windows (≈ 30 min, 2 cores)
    python benchmarks/quant.py --resume out.json --json out.json --gptq --force   # add the -gptq rows
    python benchmarks/quant.py --variants --windows 4 --seqlen 1024 --json v.json  # calibrated VQ3 vs BQ4

``--variants`` measures only the calibrated-VQ3 comparison (``vq_variants``: VQ3 with each row
weighting and with/without error feedback, against BQ4 b64, at equal MLP bytes per token, one process,
one protocol) and adds or replaces its own section of the results file, keeping the others.

Writes benchmarks/results/quant-smollm2.md (refuses to overwrite without --force).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from dipdeploy.quant import Block4QuantConfig, fake_quantize, mlp_to_rows, quant_config_from_name
from _common import machine  # benchmarks/ is the script directory

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m"
FORMATS = ("bq4-b64", "vq3", "rtn3-b96", "bq4-b32")  # rtn3-b96: SmolLM2's d = 576 is no multiple of 128
GPTQ_FORMATS = ("bq4-b64-gptq", "vq3-gptq", "rtn3-b96-gptq")
CALIB_WINDOWS, CALIB_SEQLEN = 16, 512  # GPTQ calibration: WikiText-2 *validation* tokens
EXTRA_RECON = ("bq4-b128", "rtn3", "rtn3-b192")


def cpu_model() -> str:
    return machine()["cpu"] or platform.machine()


def _sqnr(num: float, den: float) -> float:
    return float(10 * np.log10(num / den)) if den > 0 else float("inf")


def q4_1_along_input(w: np.ndarray, block: int = 32) -> np.ndarray:
    """GGUF Q4_1 (fp16 scale d, fp16 min m, w = m + q·d) on blocks of ``block`` along the rows of an HF
    weight [out, in], i.e. along the input dimension, where the GGUF file blocked it."""
    x = w.reshape(w.shape[0], -1, block)
    lo, hi = x.min(axis=2, keepdims=True), x.max(axis=2, keepdims=True)
    d = ((hi - lo) / 15).astype(np.float16).astype(np.float32)
    m = lo.astype(np.float16).astype(np.float32)
    q = np.clip(np.rint((x - m) / np.where(d == 0, 1, d)), 0, 15)
    return (m + q * d).reshape(w.shape)


def reconstruction(layers_to_use: int | None, done: list[dict]) -> list[dict]:
    from dipdeploy.loading import load_model
    from dipdeploy.quant.fake import mlp_weights

    lm = load_model(MODEL)
    layers = lm.model.model.layers[:layers_to_use]
    weights = [mlp_weights(layer.mlp, lm.arch) for layer in layers]
    rows = [r for r in done if r.get("kind") == "reconstruction"]
    have = {r["format"] for r in rows}
    num = den = 0.0
    for ws in weights if not rows else []:
        for w in ws:
            num += float((w.astype(np.float64) ** 2).sum())
            den += float(((w - q4_1_along_input(w)).astype(np.float64) ** 2).sum())
    if not rows:
        rows.append({"kind": "reconstruction", "format": "Q4_1 b32 along input dim (GGUF layout)",
                     "bits_per_weight": 5.0, "sqnr_db": _sqnr(num, den), "seconds": None, "layers": len(layers)})
    for name in ("bq4-b32", "bq4-b64", *EXTRA_RECON[:1], "vq3", "rtn3-b96", *EXTRA_RECON[1:]):
        if name in have:
            continue
        cfg = quant_config_from_name(name)
        num = den = bits = n = 0.0
        t0 = time.perf_counter()
        for ws in weights:
            for rmat in mlp_to_rows(*ws):
                deq, packed = fake_quantize(rmat, cfg)
                num += float((rmat.astype(np.float64) ** 2).sum())
                den += float(((rmat - deq).astype(np.float64) ** 2).sum())
                bits += 8 * packed.nbytes
                n += rmat.size
        rows.append({"kind": "reconstruction", "format": name, "bits_per_weight": bits / n,
                     "sqnr_db": _sqnr(num, den), "seconds": time.perf_counter() - t0, "layers": len(layers)})
        print(f"  {name:10s} {bits / n:.4f} bits/weight  SQNR {rows[-1]['sqnr_db']:.2f} dB  "
              f"{rows[-1]['seconds']:.1f} s", flush=True)
    return rows


def feedback_rows(data_dir: str | None, layers=(0, 10, 20, 29)) -> list[dict]:
    """Layer-output error ‖X(Ŵ − W)‖² / ‖XW‖² of plain vs -gptq formats on held-out activations.

    Hessians from WikiText-2 validation (CALIB_WINDOWS / 2 × CALIB_SEQLEN tokens); X from 2 test windows of
    512 tokens (MLP inputs for the up|gate rows, GLU activations for the down rows).
    """
    import torch

    from dipdeploy.data import load_text, windows
    from dipdeploy.loading import load_model
    from dipdeploy.quant import quantize, dequantize_rows
    from dipdeploy.quant.calib import row_statistics
    from dipdeploy.quant.fake import mlp_weights

    lm = load_model(MODEL)
    calib = windows(lm.tokenizer, load_text("wikitext2", "validation", None, data_dir), CALIB_SEQLEN, CALIB_WINDOWS // 2)
    test = windows(lm.tokenizer, load_text("wikitext2", "test", None, data_dir), 512, 2)
    hess = row_statistics(lm.model, calib, full=True, layers=tuple(layers))
    acts: dict[tuple[int, str], np.ndarray] = {}
    handles = []
    for i in layers:
        mlp = lm.model.model.layers[i].mlp
        handles.append(mlp.register_forward_pre_hook(
            lambda _m, a, i=i: acts.__setitem__((i, "up_gate"), a[0].reshape(-1, a[0].shape[-1]).numpy().copy())))
        handles.append(getattr(mlp, lm.arch.mlp.down).register_forward_pre_hook(
            lambda _m, a, i=i: acts.__setitem__((i, "down"), a[0].reshape(-1, a[0].shape[-1]).numpy().copy())))
    with torch.no_grad():
        lm.model(input_ids=test)
    for h in handles:
        h.remove()
    out = []
    for name in ("bq4-b64", "vq3", "rtn3-b96"):
        for fb in (False, True):
            cfg = quant_config_from_name(name + ("-gptq" if fb else ""))
            num = den = 0.0
            t0 = time.perf_counter()
            for i in layers:
                for key, rows in zip(("up_gate", "down"), mlp_to_rows(*mlp_weights(lm.model.model.layers[i].mlp, lm.arch))):
                    deq = dequantize_rows(quantize(rows, cfg, hessian=hess[i][key] if fb else None))
                    x = acts[(i, key)]
                    num += float(((x @ (deq - rows)) ** 2).sum())
                    den += float(((x @ rows) ** 2).sum())
            out.append({"kind": "feedback", "format": name + ("-gptq" if fb else ""),
                        "output_nmse": num / den, "layers": list(layers), "seconds": time.perf_counter() - t0})
            print(f"  {out[-1]['format']:14s} layer-output NMSE {num / den:.5f}", flush=True)
    return out


def _key(r: dict) -> tuple:
    return (r["quant"], r["method"], float(r["target_density"]))


def _quantized_model_dir(quant: str, data_dir: str | None, tmp: Path) -> tuple[str, dict]:
    """Fake-quantise SmolLM2 once and save it as an HF directory that ``evaluate`` loads like any
    checkpoint: one quantisation serves every (method, density) run, and calibrated presets
    (``statistics()``: VQ3's row weights, -gptq) get their calibration data (WikiText-2 validation;
    ``evaluate`` has no calibration hook for quantisation)."""
    from dipdeploy.data import load_text, windows
    from dipdeploy.loading import load_model
    from dipdeploy.quant.fake import quantize_model_

    lm = load_model(MODEL)
    cfg = quant_config_from_name(quant)
    calib = None
    if cfg.statistics() is not None:
        text = load_text("wikitext2", "validation", None, data_dir)
        calib = windows(lm.tokenizer, text, CALIB_SEQLEN, CALIB_WINDOWS)
    report = quantize_model_(lm.model, cfg, "mlp", calib_ids=calib)
    out = tmp / quant
    lm.model.save_pretrained(out)
    lm.tokenizer.save_pretrained(out)
    extra = {"bits_per_weight": report.bits_per_weight, "quant_seconds": report.seconds}
    if calib is not None:
        extra["calib_tokens"] = int(calib.numel())
    return str(out), extra


def ppl_tasks(formats: tuple[str, ...]) -> list[tuple[str | None, str, float]]:
    """(quant, method, density) in priority order: the issue's grid first, the extras after."""
    bq4_bits = Block4QuantConfig(block_size=64).bits_per_weight()
    main = [(None if q == "fp" else q, m, d) for q in formats for m, d in (("dense", 1.0), ("dip", 0.5))]
    extra = []
    for q in formats:
        if q.startswith("vq3"):
            qc = quant_config_from_name(q)
            extra.append((q, "dip", equal_bytes_density(qc.bits_per_weight(), bq4_bits)))
    plain = [t for t in main if t[0] is None or not quant_config_from_name(t[0]).error_feedback]
    formats = tuple(q for q in formats if q != "fp")
    gptq = [t for t in main if t not in plain]
    return plain + [t for t in extra if not quant_config_from_name(t[0]).error_feedback] + gptq + \
        [t for t in extra if quant_config_from_name(t[0]).error_feedback]


def _task_order(r: dict) -> tuple:
    tasks = ppl_tasks(("fp", *FORMATS, *GPTQ_FORMATS))
    key = (None if r["quant"] == "none" else r["quant"], r["method"], float(r["target_density"]))
    return (tasks.index(key) if key in tasks else len(tasks),)


def perplexity_rows(formats: tuple[str, ...], seqlen: int, windows: int, data_dir: str | None,
                    done: list[dict], on_row=lambda rows: None) -> list[dict]:
    from dipdeploy.eval import EvalConfig, evaluate
    from dipdeploy.sparsity.plan import SparsityConfig

    out = [r for r in done if r.get("kind") == "ppl"]
    have = {_key(r) for r in out}
    models: dict[str | None, tuple[str, dict]] = {None: (MODEL, {})}
    with tempfile.TemporaryDirectory(prefix="dipdeploy-quant-bench-") as tmp:
        for quant, method, density in ppl_tasks(formats):
            if (quant or "none", method, density) in have:
                continue
            if quant not in models:  # quantise each format once, for all its runs
                models[quant] = _quantized_model_dir(quant, data_dir, Path(tmp))
            model, extra = models[quant]
            t0 = time.perf_counter()
            # A fixed split ρ_in = 1.1·ρ (0.55 at ρ = 0.5: what the split search finds on SmolLM2, see
            # benchmarks/results/accuracy-smollm2.md) instead of a 12-minute search per row: every
            # format is compared under the same plan.
            sparsity = SparsityConfig(rho_in=round(min(1.0, 1.1 * density), 4))
            res = evaluate(EvalConfig(model=model, method=method, density=density, seqlen=seqlen,
                                      max_windows=windows, data_dir=data_dir, progress=False, sparsity=sparsity))
            for r in res:
                r.update(kind="ppl", wall_s=round(time.perf_counter() - t0, 1), model=MODEL)
                if quant is not None:
                    r.update(quant=quant, quant_scope="mlp", **extra)
                out.append(r)
                print(f"  {quant or 'fp':9s} {method:5s} ρ={r['density']:.3f}  PPL {r['ppl']:.3f}  "
                      f"({r['wall_s']} s)", flush=True)
            on_row(out)
    return out


def equal_bytes_density(bits: float, ref_bits: float, ref_density: float = 0.5) -> float:
    """The DIP density at which ``bits`` per weight reads the MLP bytes per token of ``ref_bits`` at
    ``ref_density`` (ρ·bits equal), rounded down so it never reads more."""
    return math.floor(1000 * ref_density * ref_bits / bits) / 1000


def vq_variants() -> list[tuple[str, object, float]]:
    """(label, config, DIP density) of the calibrated-VQ3 comparison: BQ4 b64 at ρ = 0.5 and every VQ3
    variant at the density of equal MLP bytes per token (``hessian="dip"`` masks its statistics at that
    same density)."""
    from dipdeploy.quant import VQ3QuantConfig

    bq4 = Block4QuantConfig(block_size=64)
    vq = VQ3QuantConfig()
    rho = equal_bytes_density(vq.bits_per_weight(), bq4.bits_per_weight())
    return [
        ("bq4-b64", bq4, 0.5),
        ("vq3 plain k-means", VQ3QuantConfig(hessian="none"), rho),
        ("vq3 hessian=dense", VQ3QuantConfig(hessian="dense"), rho),
        ("vq3 hessian=dip", VQ3QuantConfig(hessian="dip", hessian_density=rho), rho),
        ("vq3 hessian=dense + feedback", VQ3QuantConfig(hessian="dense", error_feedback=True), rho),
        ("vq3 hessian=dip + feedback", VQ3QuantConfig(hessian="dip", hessian_density=rho, error_feedback=True), rho),
    ]


def variant_rows(seqlen: int, n_windows: int, data_dir: str | None, done: list[dict], only: set[str] | None,
                 on_row=lambda rows: None) -> list[dict]:
    """SQNR and WikiText-2 test PPL, DIP (uniform plan, ρ_in = 1.1ρ) and dense, of every ``vq_variants``
    entry plus the fp rows, in one process and one protocol: the model is loaded once and each variant
    is quantised once from the original MLP weights (its packed tensors kept, ≈ 3–4 bits per weight, to
    decode into the model for each of its rows). All DIP rows run first (they decide the comparison),
    so a run cut short still answers it."""
    import torch

    from dipdeploy.data import load_text, windows
    from dipdeploy.eval.perplexity import perplexity
    from dipdeploy.loading import load_model
    from dipdeploy.quant import dequantize_rows, rows_to_mlp
    from dipdeploy.quant.config import config_to_dict
    from dipdeploy.quant.fake import calibration_statistics, iter_packed_mlp, mlp_weights, set_mlp_weights
    from dipdeploy.sparsity.methods import sparsify_, unsparsify_
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

    lm = load_model(MODEL)
    model, layers, c = lm.model, lm.model.model.layers, lm.model.config
    original = [mlp_weights(layer.mlp, lm.arch) for layer in layers]
    test = windows(lm.tokenizer, load_text("wikitext2", "test", None, data_dir), seqlen, n_windows)
    calib = windows(lm.tokenizer, load_text("wikitext2", "validation", None, data_dir), CALIB_SEQLEN, CALIB_WINDOWS)
    variants = [v for v in vq_variants() if only is None or v[0] in only]
    fp = [] if only is not None and "fp" not in only else [("fp", None, 0.5)]
    tasks = [(v, "dip") for v in variants] + [(v, "dense") for v in variants] + [(v, m) for v in fp
                                                                                 for m in ("dense", "dip")]
    out = [r for r in done if r.get("kind") == "variant"]
    have = {(r["label"], r["method"]) for r in out}
    packed: dict[str, tuple[list, dict]] = {}

    def load_weights(label: str, cfg) -> dict:
        """Put variant ``label``'s weights into the model (quantising on first use); its row fields."""
        for layer, ws in zip(layers, original):
            set_mlp_weights(layer.mlp, lm.arch, *ws)
        if cfg is None:
            return {"bits_per_weight": 32.0, "config": None}
        if label not in packed:
            t0 = time.perf_counter()
            stats = calibration_statistics(model, cfg, calib)
            tensors = [p for _, p in iter_packed_mlp(model, cfg, calib=stats, progress=False)]
            seconds = time.perf_counter() - t0
            num = den = bits = n = 0.0
            for ws, p in zip(original, tensors):
                q = rows_to_mlp(dequantize_rows(p["up_gate"]), dequantize_rows(p["down"]))
                for w, wq in zip(ws, q):
                    num += float((w.astype(np.float64) ** 2).sum())
                    den += float(((w - wq).astype(np.float64) ** 2).sum())
                bits += sum(8 * t.nbytes for t in p.values())
                n += sum(t.rows * t.cols for t in p.values())
            packed[label] = (tensors, {"bits_per_weight": bits / n, "quant_seconds": round(seconds, 1),
                                       "sqnr_db": _sqnr(num, den), "config": config_to_dict(cfg),
                                       "calib_tokens": int(calib.numel()) if cfg.statistics() else None})
            print(f"  {label:30s} quantised: SQNR {packed[label][1]['sqnr_db']:.2f} dB ({seconds:.0f} s)", flush=True)
        tensors, extra = packed[label]
        for layer, p in zip(layers, tensors):
            set_mlp_weights(layer.mlp, lm.arch, *rows_to_mlp(dequantize_rows(p["up_gate"]), dequantize_rows(p["down"])))
        return extra

    for (label, cfg, density), method in tasks:
        if (label, method) in have:
            continue
        extra = load_weights(label, cfg)
        t0 = time.perf_counter()
        rho, rho_in = (1.0, 1.0) if method == "dense" else (density, round(min(1.0, 1.1 * density), 4))
        if method == "dip":
            plan = uniform_plan(SparsityConfig(method="dip", density=density, rho_in=rho_in), MODEL,
                                c.num_hidden_layers, c.hidden_size, c.intermediate_size)
            sparsify_(model, plan)
            rho = plan.density
        try:
            ppl, tokens = perplexity(model, test)
        finally:
            unsparsify_(model)
        out.append({"kind": "variant", "label": label, "method": method, "target_density": density if method == "dip"
                    else 1.0, "density": round(rho, 4), "rho_in": rho_in, "ppl": ppl, "tokens": tokens,
                    "seqlen": seqlen, "windows": int(test.shape[0]), "wall_s": round(time.perf_counter() - t0, 1),
                    "model": MODEL, "torch_threads": torch.get_num_threads(), **extra})
        print(f"  {label:30s} {method:5s} ρ={rho:.3f}  PPL {ppl:.3f}  ({out[-1]['wall_s']} s)", flush=True)
        on_row(out)
    return out


VARIANT_HEADING = "## Calibrated VQ3 vs BQ4 under DIP at equal MLP bytes per token"


def variant_markdown(rows: list[dict]) -> str:
    """The section of the calibrated-VQ3 comparison, with its verdict computed from the rows."""
    if not rows:
        return ""
    r0 = rows[0]
    fp = {(r["method"], float(r["target_density"])): r["ppl"] for r in rows if r["label"] == "fp"}
    order = ["fp"] + [v[0] for v in vq_variants()]
    rows = sorted(rows, key=lambda r: (order.index(r["label"]) if r["label"] in order else len(order),
                                       r["method"] != "dense"))
    tok = next((r.get("calib_tokens") for r in rows if r.get("calib_tokens")), None)
    lines = [
        VARIANT_HEADING, "",
        f"WikiText-2 test, seqlen {r0['seqlen']}, {r0['windows']} windows ({r0['tokens']} predicted tokens; fewer "
        "than the tables above because the 2 shared cores were heavily loaded, load average ≈ 20), all rows in "
        "one protocol (`python benchmarks/quant.py --variants`, subsets of the variants run as parallel "
        "processes and merged with `--variants --render-only`; times are wall clock under that load); MLP weights quantised, attention/embeddings fp32; DIP = uniform plan, "
        "ρ_in = 1.1·ρ. Calibration: " + (f"{tok} WikiText-2 *validation* tokens ({CALIB_WINDOWS} × {CALIB_SEQLEN}; "
        "the train split is not on this machine)" if tok else "none") + ". The VQ3 DIP rows run at the ρ whose "
        "ρ·bits equals BQ4 b64's at ρ = 0.5. SQNR: MLP weights against the unquantised ones (all 30 layers).", "",
        "| quant | row weights | error feedback | bits/weight | SQNR (dB) | dense PPL | × fp | DIP ρ | ρ·bits | DIP PPL | × fp (same ρ) | quant time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {}
    for r in rows:
        by.setdefault(r["label"], {})[r["method"]] = r
    for label, m in by.items():
        dn, dp = m.get("dense"), m.get("dip")
        any_r = dn or dp
        cfg = any_r.get("config") or {}
        weights = cfg.get("hessian", "–") if cfg.get("type") == "VQ3QuantConfig" else "–"
        if weights == "dip":
            weights = f"dip (ρ {cfg['hessian_density']})"
        fb = "yes" if cfg.get("error_feedback") else "no"
        bpw = any_r["bits_per_weight"]

        def ratio(r):
            ref = fp.get((r["method"], float(r["target_density"]))) if r else None
            return f"{r['ppl'] / ref:.3f}" if r and ref else "–"

        lines.append(
            f"| {label} | {weights} | {fb if cfg else '–'} | {bpw:.4f} | {_fmt(any_r.get('sqnr_db'), 2)} | "
            f"{_fmt(dn and dn['ppl'])} | {ratio(dn)} | {_fmt(dp and dp['density'])} | "
            f"{_fmt(dp and dp['density'] * bpw)} | {_fmt(dp and dp['ppl'])} | {ratio(dp)} | "
            f"{_fmt(any_r.get('quant_seconds'), 1)} |")
    lines += [""]
    missing = [f"{label} {m}" for label in ["fp"] + [v[0] for v in vq_variants()] for m in ("dip", "dense")
               if m not in by.get(label, {})]
    if missing:
        lines += ["**Not measured** (the run was cut short; `--variants LABELS --resume JSON` adds them): "
                  + ", ".join(missing) + ".", ""]
    bq = by.get("bq4-b64", {}).get("dip")
    vqs = [m["dip"] for label, m in by.items() if label.startswith("vq3") and "dip" in m]
    if bq and vqs:
        best = min(vqs, key=lambda r: r["ppl"])
        verdict = "beats" if best["ppl"] < bq["ppl"] else "does NOT beat"
        lines += [f"**Verdict:** at equal MLP bytes per token, the best VQ3 + DIP measured ({best['label']}, ρ "
                  f"{best['density']:.3f}, PPL {best['ppl']:.3f}) {verdict} BQ4 b64 + DIP (ρ 0.5, PPL "
                  f"{bq['ppl']:.3f}) on SmolLM2-135M.", ""]
    return "\n".join(lines)


def write_variant_section(path: Path, section: str, force: bool) -> None:
    """Put ``section`` into ``path`` in place of an earlier one (the file's other sections are kept)."""
    text = path.read_text() if path.exists() else ""
    if VARIANT_HEADING in text:
        if not force:
            raise SystemExit(f"{path} already has the section {VARIANT_HEADING!r}; pass --force to replace it")
        head, rest = text.split(VARIANT_HEADING, 1)
        nxt = rest.find("\n## ")
        text = head + section + ("" if nxt < 0 else rest[nxt:])
    else:
        text = text.rstrip("\n") + "\n\n" + section
    write_atomic(path, text, True)


def _fmt(v, digits=3) -> str:
    if v is None:
        return "–"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def markdown(recon: list[dict], ppl: list[dict], args, wall: float) -> str:
    lines = [
        "# Weight quantisation of SmolLM2-135M in the sparse row layout",
        "",
        (f"Generated by `python benchmarks/quant.py{' --quick' if args.quick else ''}` in {wall / 60:.1f} min"
         if args.render_only is None else
         "Generated by `python benchmarks/quant.py` split over processes (`--formats`, `--no-recon`) and merged "
         "with `--render-only`") +
        f" on {cpu_model()}, {os.cpu_count()} cores, heavily shared with other jobs (load average ≈ 10): every "
        f"time is wall clock under that load, several × what an idle machine takes; numpy {np.__version__}, "
        f"torch fp32 CPU.",
        "",
        "Formats (exact bits per weight = every stored bit: codes + scales + zero points + codebooks + "
        "padding, over the MLP weights): BQ4 bN = 4-bit symmetric, one fp16 scale per N weights of a row; "
        "VQ3 = 2-D vectors, 64-entry int8 codebook (+ fp16 scale) per ≈8192 weights, 6-bit index per pair, "
        "k-means++ and 8 Lloyd iterations (rows weighted as `VQ3QuantConfig.hessian` says when calibrated); RTN3 bN = 3-bit symmetric round-to-nearest, fp16 scale per N "
        "(b96 because SmolLM2's d = 576 would pad blocks of 128). Rows are the units DIP selects: "
        "[W_uᵀ | W_gᵀ] rows (2F values) and W_dᵀ rows (d values).",
        "",
        f"## MLP weight reconstruction ({recon[0]['layers'] if recon else 0} layers)",
        "",
        "| format | bits/weight | SQNR (dB) | quantisation time (s) |",
        "|---|---|---|---|",
    ]
    fb = [r for r in recon if r["kind"] == "feedback"]
    recon = [r for r in recon if r["kind"] == "reconstruction"]
    for r in recon:
        lines.append(f"| {r['format']} | {r['bits_per_weight']:.4f} | {r['sqnr_db']:.2f} | {_fmt(r['seconds'], 1)} |")
    if fb:
        lines += ["", f"### GPTQ-style error feedback: layer-output error (layers {fb[0]['layers']})", "",
                  f"‖X(Ŵ − W)‖² / ‖XW‖² over both row groups, X = activations of 2 WikiText-2 test windows × 512 "
                  f"tokens; Hessians from {CALIB_WINDOWS // 2} × {CALIB_SEQLEN} validation tokens. Weight SQNR is not "
                  "the right yardstick here (feedback trades weight error for output error).", "",
                  "| format | layer-output NMSE | quantisation time (s, these layers) |", "|---|---|---|"]
        for r in fb:
            lines.append(f"| {r['format']} | {r['output_nmse']:.5f} | {r['seconds']:.1f} |")
    lines += [
        "",
        "The checkpoint is already Q4_1 (blocks of 32 along the input dimension): re-applying Q4_1 in that "
        f"layout reproduces the weights {'exactly (SQNR ∞)' if recon and recon[0]['sqnr_db'] == float('inf') else 'almost exactly'}, "
        "the first row. The sparse layout blocks along the other dimension (rows of [W_uᵀ | W_gᵀ] and W_dᵀ), "
        "so each format's SQNR here is the whole cost of re-quantising the Q4_1 weights (measured against "
        "the Q4_1-dequantised weights, the only ones shipped; not against the original bf16 ones).",
        "",
    ]
    if ppl:
        fp = {r["method"] + str(r["target_density"]): r["ppl"] for r in ppl if r["quant"] == "none"}
        lines += [
            f"## WikiText-2 test perplexity (seqlen {ppl[0]['seqlen']}, {ppl[0]['windows']} windows, "
            f"{ppl[0]['tokens']} predicted tokens; MLP weights quantised, attention/embeddings fp32)",
            "",
            "| quant | method | MLP density ρ | ρ_in | bits/weight (MLP) | MLP bits read per weight (ρ·bits) | PPL | × fp same method | quant time (s) | eval wall (s) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in ppl:
            bpw = 32.0 if r["quant"] == "none" else r["bits_per_weight"]
            ref = fp.get(r["method"] + str(r["target_density"]))
            ratio = f"{r['ppl'] / ref:.3f}" if ref else "–"
            lines.append(
                f"| {'fp32' if r['quant'] == 'none' else r['quant']} | {r['method']} | {r['density']:.3f} | "
                f"{r.get('rho_in', 1.0):.3f} | "
                f"{bpw:.4f} | {r['density'] * bpw:.3f} | {r['ppl']:.3f} | {ratio} | "
                f"{_fmt(r.get('quant_seconds'), 1)} | {_fmt(r.get('wall_s'), 0)} |")
        lines += ["", "DIP rows: uniform plan, ρ_in = 1.1·ρ fixed (0.55 at ρ = 0.5), except the fp DIP row, whose "
                  "split was searched on WikiText-2 validation by `evaluate` (it found the same 0.55; its eval "
                  "wall time includes that search).", ""]
        if any(str(r["quant"]).endswith("-gptq") for r in ppl):
            tok = next(r.get("calib_tokens") for r in ppl if str(r["quant"]).endswith("-gptq"))
            lines += [f"`-gptq` rows: GPTQ-style error feedback in the row layout (`dipdeploy/quant/gptq.py`), "
                      f"Hessians from {tok} WikiText-2 *validation* tokens ({CALIB_WINDOWS} × {CALIB_SEQLEN}); "
                      "same packed format and bits as the plain rows.", ""]
        lines += ["VQ3 + DIP at ρ = 0.679 reads the same MLP bytes per token as BQ4 b64 + DIP at ρ = 0.5 "
                  "(compare the ρ·bits column).", ""]
        lines += findings(ppl)
        have = {(None if r["quant"] == "none" else r["quant"], r["method"], float(r["target_density"])) for r in ppl}
        missing = [t for t in ppl_tasks(("fp", *FORMATS)) if t not in have]
        if missing:
            lines += ["**Not measured** (the run was cut short; rerun with `--resume JSON` to add them): " +
                      ", ".join(f"{q or 'fp'} {m} ρ={d}" for q, m, d in missing) + ".", ""]
    else:
        lines += ["## WikiText-2 perplexity", "", "Not measured in this run.", ""]
    return "\n".join(lines)


def findings(ppl: list[dict]) -> list[str]:
    """The issue's comparisons, stated only for the rows that were measured."""
    by = {_key(r): r for r in ppl}

    def get(q, m, d):
        return by.get((q, m, d))

    out = ["## Comparisons", ""]
    for method, dens in (("dense", 1.0), ("dip", 0.5)):
        for vq, rtn in (("vq3", "rtn3-b96"), ("vq3-gptq", "rtn3-b96-gptq")):
            a, b = get(vq, method, dens), get(rtn, method, dens)
            if a and b:
                verdict = "beats" if a["ppl"] < b["ppl"] else "does NOT beat"
                out.append(f"- {method} ρ={dens}: {vq} ({a['bits_per_weight']:.3f} b/w) PPL {a['ppl']:.3f} "
                           f"{verdict} {rtn} ({b['bits_per_weight']:.3f} b/w) PPL {b['ppl']:.3f}.")
        for q in ("bq4-b32", "bq4-b64", "bq4-b64-gptq"):
            a, f = get(q, method, dens), get("none", method, dens)
            if a and f:
                out.append(f"- {method} ρ={dens}: {q} costs ×{a['ppl'] / f['ppl']:.3f} over fp "
                           f"(re-quantising the Q4_1 checkpoint in the row layout).")
    for vq, bq in (("vq3", "bq4-b64"), ("vq3-gptq", "bq4-b64-gptq")):
        a = next((r for r in ppl if r["quant"] == vq and r["method"] == "dip" and r["target_density"] > 0.5), None)
        b = get(bq, "dip", 0.5)
        if a and b:
            verdict = "better" if a["ppl"] < b["ppl"] else "NOT better"
            out.append(f"- Equal MLP bytes per token: {vq} + DIP ρ={a['density']:.3f} "
                       f"({a['density'] * a['bits_per_weight']:.3f} bits read per weight) PPL {a['ppl']:.3f} is "
                       f"{verdict} than {bq} + DIP ρ=0.5 ({0.5 * b['bits_per_weight']:.3f}) PPL {b['ppl']:.3f}.")
    return out + [""] if len(out) > 2 else []


def write_atomic(path: Path, text: str, force: bool) -> None:
    if path.exists() and not force:
        raise SystemExit(f"{path} exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def save(args, recon: list[dict], ppl: list[dict], t0: float, partial: bool) -> None:
    """Rewrite the outputs (this run owns them after the start-up check), so a long run keeps its rows."""
    text = markdown(recon, ppl, args, time.perf_counter() - t0)
    if partial:
        text += "\n_Partial: the run was still going when this was written._\n"
    write_atomic(args.out, text, True)
    if args.json:
        write_atomic(args.json, json.dumps(recon + ppl, indent=1, default=str), True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 layers, 2 windows × 512 tokens, BQ4 b64 + RTN3 only")
    ap.add_argument("--json", type=Path, help="also write the rows as a JSON list")
    ap.add_argument("--out", type=Path, default=RESULTS / "quant-smollm2.md")
    ap.add_argument("--data-dir", default=os.environ.get("DIPDEPLOY_DATA") or str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--no-ppl", action="store_true", help="reconstruction only")
    ap.add_argument("--no-recon", action="store_true", help="perplexity only (e.g. a second process)")
    ap.add_argument("--feedback", action="store_true", help="layer-output error of plain vs -gptq formats only")
    ap.add_argument("--force", action="store_true", help="overwrite --out / --json")
    ap.add_argument("--resume", type=Path, help="rows of an earlier run (its --json): keep them, measure the rest")
    ap.add_argument("--gptq", action="store_true", help="also the -gptq presets (calibrated error feedback)")
    ap.add_argument("--formats", help="comma-separated PPL formats to measure (fp = unquantised); default: all")
    ap.add_argument("--variants", nargs="?", const="", metavar="LABELS",
                    help="only the calibrated-VQ3 comparison (section of --out, rows in --json); optionally a "
                         "comma-separated subset of its labels (fp = the unquantised rows)")
    ap.add_argument("--render-only", nargs="*", type=Path, metavar="JSON",
                    help="measure nothing: write --out from the rows of these JSON files (other processes' --json)")
    args = ap.parse_args()
    if args.quick:
        args.windows, args.seqlen = 2, 512
    for p in (args.json,) if args.variants is not None else (args.out, args.json):  # --variants adds a section
        if p is not None and p.exists() and not args.force and p != args.resume:
            raise SystemExit(f"{p} exists; pass --force to overwrite it")
    t0 = time.perf_counter()
    if args.variants is not None:
        only = {v.strip() for v in args.variants.split(",") if v.strip()} or None
        done = json.loads(args.resume.read_text()) if args.resume else []

        def keep(rows):
            if args.json:
                write_atomic(args.json, json.dumps(rows, indent=1, default=str), True)

        if args.render_only is not None:  # merge the rows of several --variants processes, measure nothing
            rows = [r for path in args.render_only for r in json.loads(path.read_text()) if r.get("kind") == "variant"]
        else:
            rows = variant_rows(args.seqlen, args.windows, args.data_dir, done, only, on_row=keep)
        keep(rows)
        write_variant_section(args.out, variant_markdown(rows), args.force)
        print(f"wrote {args.out}")
        return
    if args.render_only is not None:
        rows = {}
        for path in args.render_only:
            for r in json.loads(path.read_text()):
                rows[(r["kind"], r.get("format") or _key(r))] = r
        recon = [r for r in rows.values() if r["kind"] in ("reconstruction", "feedback")]
        ppl = sorted((r for r in rows.values() if r["kind"] == "ppl"), key=_task_order)
        args.quick = False
        save(args, recon, ppl, t0, partial=False)
        print(f"wrote {args.out}")
        return
    if args.feedback:
        rows = feedback_rows(args.data_dir)
        if args.json:
            write_atomic(args.json, json.dumps(rows, indent=1), True)
        return
    print("reconstruction", flush=True)
    done = json.loads(args.resume.read_text()) if args.resume else []
    recon = [] if args.no_recon else reconstruction(3 if args.quick else None, done)
    ppl = []
    if not args.no_ppl:
        print("perplexity", flush=True)
        formats = ("fp", "bq4-b64", "rtn3-b96") if args.quick else ("fp", *FORMATS)
        formats += GPTQ_FORMATS if args.gptq else ()
        if args.formats:
            formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
        ppl = perplexity_rows(formats, args.seqlen, args.windows, args.data_dir, done,
                              on_row=lambda rows: save(args, recon, rows, t0, partial=True))
    save(args, recon, ppl, t0, partial=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
