"""Benchmark of `dipdeploy export` and of decoding with the exported bundles.

Part 1, export: wall time, peak RSS and bundle bytes per file for SmolLM2-135M (fp32, BQ4, VQ3; DIP at
ρ = 0.5 with the registry's ρ_in, so no calibration; BQ4 also with attention="gqa") and for a randomly initialised Llama-shaped model
of ≈1 B parameters (d 2048, F 5632, 16 layers, GQA 32/4, vocab 32000; fp32). Each export runs in its own
process (peak RSS = that process's ru_maxrss), with validation on (32 tokens), except the random 1 B model:
random weights give near-flat logits, so one top-K near-tie flip changes a greedy token (seen: stock ORT
differed at 4 tokens, max diff 1.2 of 4.4, native matched); its rows time export without validation,
loading the whole model and streaming it one layer at a time (``stream``: the peak-memory comparison).

Part 2, decode: tokens/s of greedy decoding with plain ORT on `model.onnx` (prompt of 16 tokens, then
``--tokens`` new tokens, 1 intra-op thread, one `run` per token with the KV cache fed back), for the
dense fp32 export, and the DIP fp32 / BQ4 bundles on stock ORT (fallback functions) and with the native
library, BQ4 also at accuracy level 4 (int8 activations in MatMulNBits, int8 coefficients in
SparseGatherMatMul). onnxruntime-genai's int4 export is timed too when its model builder is importable
(``pip install --target DIR onnxruntime-genai`` and ``--genai-path DIR``), or from an existing export
(``--genai-model DIR/model.onnx``); otherwise its row says why. The graphs are timed round-robin,
``--rounds`` times (median reported, every round listed), so load changes on a shared machine hit them
alike. Next to the fast rows, WikiText-2 test perplexity through the same ORT graph (``--ppl-windows``
windows of 256 tokens, each one prefill call; plain DIP per token, as in decode).

    nice -n 10 python benchmarks/export.py --quick     # SmolLM2 fp32 + BQ4 only, 32 tokens
    nice -n 10 python benchmarks/export.py             # everything

Writes benchmarks/results/export.md (and --json OUT). This machine is shared: the load average is
printed with the table and timings move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import machine, md_table, write_rows_json

RESULTS = Path(__file__).resolve().parent / "results"
PY = sys.executable

_EXPORT_CHILD = r"""
import json, resource, sys, time
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig
cfg = ExportConfig(**json.loads(sys.argv[1]))
t0 = time.perf_counter()
res = export_model(cfg, sys.argv[2], force=True)
print("RESULT" + json.dumps({"seconds": time.perf_counter() - t0,
      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **res.summary()}))
"""

_RANDOM_1B = r"""
import sys
from dipdeploy.loading import build_tiny
from dipdeploy.registry import ModelShape, ModelSpec
shape = ModelShape(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
                   num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, head_dim=64)
build_tiny(ModelSpec("llama-1b-random", "LlamaForCausalLM", shape, tiny={"seed": 0}),
           __import__("pathlib").Path(sys.argv[1]))
"""


def run_export(cfg: dict, out: Path) -> dict:
    done = subprocess.run([PY, "-c", _EXPORT_CHILD, json.dumps(cfg), str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][-400:]}
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def file_sizes(out: Path) -> dict:
    """Bytes per weight file and graph; the per-layer graphs summed into one entry."""
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())
             if p.suffix == ".bin" or p.name == "model.onnx"}
    layers = [p.stat().st_size for p in out.glob("*.onnx") if p.name != "model.onnx"]
    if layers:
        sizes[f"per-layer graphs ({len(layers)} files)"] = sum(layers)
    return sizes


def decode_tps(model_path: Path, native: bool, prompt_len: int, tokens: int) -> float:
    """Greedy decode tokens/s with one ORT session, 1 thread, KV cache fed back as numpy."""
    import onnxruntime as ort

    from dipdeploy.export.generate import KVDecoder
    from dipdeploy.ops.native import session_options

    so = session_options(threads=1, native=native)
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    dec = json.loads((model_path.parent / "genai_config.json").read_text())["model"]["decoder"]
    kv = KVDecoder(sess, dec["num_key_value_heads"], dec["head_size"])  # both bundles carry a genai_config.json
    ids = np.arange(1, prompt_len + 1, dtype=np.int64)
    t0, n = None, 0
    for step in range(tokens + 1):
        ids = [int(kv.feed(ids)[-1].argmax())]
        if step == 0:
            t0 = time.perf_counter()  # time decode steps only (after the prefill)
        else:
            n += 1
    return n / (time.perf_counter() - t0)


def ort_perplexity(model_path: Path, native: bool, windows: np.ndarray) -> float:
    """WikiText-2 perplexity of ``model.onnx``: each window [L] one prefill call from an empty KV cache."""
    import onnxruntime as ort

    from dipdeploy.export.generate import KVDecoder
    from dipdeploy.ops.native import session_options

    sess = ort.InferenceSession(str(model_path), session_options(threads=1, native=native),
                                providers=["CPUExecutionProvider"])
    dec = json.loads((model_path.parent / "genai_config.json").read_text())["model"]["decoder"]
    nll, n = 0.0, 0
    for w in windows:
        logits = KVDecoder(sess, dec["num_key_value_heads"], dec["head_size"]).feed(w).astype(np.float64)
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        nll -= float(logp[np.arange(len(w) - 1), w[1:]].sum())
        n += len(w) - 1
    return float(np.exp(nll / n))


def wikitext_windows(bundle: Path, n: int, seqlen: int = 256) -> np.ndarray:
    """``n`` WikiText-2 test windows, tokenised with the bundle's own tokenizer."""
    from transformers import PreTrainedTokenizerFast

    from dipdeploy.data import load_text, windows

    tok = PreTrainedTokenizerFast(tokenizer_file=str(bundle / "tokenizer.json"))
    return windows(tok, load_text("wikitext2", "test"), seqlen, n).numpy()


def genai_int4(genai_path: str | None, hf_dir: Path, work: Path) -> tuple[Path | None, str]:
    """Build onnxruntime-genai's int4 CPU export of the HF dir; (model.onnx, note)."""
    if not genai_path:
        return None, "not run: pass --genai-path DIR holding onnxruntime-genai (pip install --target DIR)"
    env = {**os.environ, "PYTHONPATH": genai_path + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = work / "genai-int4"
    cmd = [PY, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out), "-p", "int4",
           "-e", "cpu", "-c", str(work / "genai-cache")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0 or not (out / "model.onnx").is_file():
        return None, "builder failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:200]
    return out / "model.onnx", "onnxruntime-genai model builder -p int4 -e cpu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--work", default=None, help="where bundles go (default: a temp dir, removed)")
    ap.add_argument("--genai-path", default=None)
    ap.add_argument("--genai-model", default=None,
                    help="an existing onnxruntime-genai int4 model.onnx (skips the build)")
    ap.add_argument("--rounds", type=int, default=None, help="round-robin decode rounds (default 3, --quick 2)")
    ap.add_argument("--ppl-windows", type=int, default=None, help="WikiText-2 windows (default 4, --quick 1; 0 = none)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tokens = 32 if args.quick else args.tokens
    rounds = args.rounds or (2 if args.quick else 3)
    n_windows = args.ppl_windows if args.ppl_windows is not None else (1 if args.quick else 4)
    work = Path(args.work or tempfile.mkdtemp(prefix="dipdeploy-bench-"))
    base = {"model": "smollm2-135m", "rho_in": 0.55, "density": 0.5}
    exports = {"smollm2 dense fp32": {**base, "method": "dense"},
               "smollm2 dip fp32": {**base, "method": "dip"},
               "smollm2 dip bq4": {**base, "method": "dip", "quant": "bq4"},
               "smollm2 dip bq4 gqa": {**base, "method": "dip", "quant": "bq4", "attention": "gqa"},
               "smollm2 dip bq4 gqa level4": {**base, "method": "dip", "quant": "bq4", "attention": "gqa",
                                               "accuracy_level": 4}}
    if not args.quick:
        exports["smollm2 dip vq3"] = {**base, "method": "dip", "quant": "vq3"}
    rows, sizes = [], {}
    for name, cfg in exports.items():
        r = run_export(cfg, work / name.replace(" ", "-"))
        lv = r.pop("level4", None) or {}
        rows.append({"export": name, **r, "level4_tokens_agree": f"{lv['tokens_agree']}/{lv['tokens']}" if lv else None,
                     "level4_max_abs_diff": lv.get("max_abs_diff")})
        if "error" not in r:
            sizes[name] = file_sizes(work / name.replace(" ", "-"))
        print(name, r.get("seconds"), r.get("error", ""), flush=True)
    if not args.quick:
        hf = work / "llama-1b-random-hf"
        subprocess.run([PY, "-c", _RANDOM_1B, str(hf)], check=True)
        for stream in (False, True):
            r = run_export({"model": str(hf), "method": "dip", "rho_in": 0.55, "density": 0.5, "validate_tokens": 0,
                            "stream": stream}, work / "llama-1b-dip-fp32")
            rows.append({"export": f"llama-1b-random dip fp32 ({'streamed, ' if stream else ''}no validation)", **r})
            print("1b", "streamed" if stream else "", r.get("seconds"), r.get("error", ""), flush=True)
    graphs = []  # (row name, ops, model.onnx, native, with perplexity)
    for name, native, ppl in (("smollm2 dense fp32", False, True), ("smollm2 dip fp32", False, False),
                              ("smollm2 dip fp32", True, False), ("smollm2 dip bq4", False, False),
                              ("smollm2 dip bq4", True, False), ("smollm2 dip bq4 gqa", True, True),
                              ("smollm2 dip bq4 gqa level4", True, True)):
        if name in sizes:
            graphs.append((name, "native" if native else "stock ORT", work / name.replace(" ", "-") / "model.onnx",
                           native, ppl))
    from dipdeploy.loading import resolve

    if args.genai_model:
        path, note = Path(args.genai_model), f"onnxruntime-genai int4 export given ({args.genai_model})"
    else:
        path, note = genai_int4(args.genai_path, Path(resolve("smollm2-135m")[0]), work)
    if path is not None:
        graphs.append(("onnxruntime-genai int4", "stock ORT", path, False, True))
    tps: dict[str, list[float]] = {f"{g[0]} | {g[1]}": [] for g in graphs}
    for _ in range(rounds):
        for name, ops, model, native, _ in graphs:
            tps[f"{name} | {ops}"].append(decode_tps(model, native, 16, tokens))
            print(name, ops, round(tps[f"{name} | {ops}"][-1], 1), flush=True)
    wins = wikitext_windows(graphs[0][2].parent, n_windows) if n_windows and graphs else None
    decode = []
    for name, ops, model, native, ppl in graphs:
        runs = tps[f"{name} | {ops}"]
        decode.append({"graph": name, "ops": ops, "tokens_per_s": float(np.median(runs)),
                       "rounds": " / ".join(f"{t:.1f}" for t in runs),
                       "wikitext2_ppl": ort_perplexity(model, native, wins) if ppl and wins is not None else None,
                       "note": note if name.startswith("onnxruntime-genai") else ""})
        print(decode[-1], flush=True)
    if path is None:
        decode.append({"graph": "onnxruntime-genai int4", "ops": "stock ORT", "note": note, "tokens_per_s": None})
    env = machine()
    text = [f"# Export benchmark\n\n{env} · `python benchmarks/export.py{' --quick' if args.quick else ''}` · "
            f"1 intra-op thread for decode · prompt 16 tokens, {tokens} new tokens\n",
            "## Export (one process each; validation included)\n",
            md_table(rows, ["export", "seconds", "peak_rss_mb", "bytes_total", "bytes_dense", "bytes_mlp",
                            "bits_per_weight_mlp", "agrees_stock", "agrees_native", "near_ties_native", "max_abs_diff",
                            "max_abs_diff_native", "max_abs_diff_free_stock", "tolerance", "level4_tokens_agree",
                            "level4_max_abs_diff", "error"]),
            "\n## Files (bytes)\n"]
    for name, files in sizes.items():
        text.append(f"- {name}: " + ", ".join(f"{k} {v:,}" for k, v in files.items()))
    text += [f"\n## Decode tokens/s (plain ORT, model.onnx; median of {rounds} round-robin rounds) and WikiText-2 "
             f"perplexity ({n_windows} × 256 tokens, same graph)\n",
             md_table(decode, ["graph", "ops", "tokens_per_s", "rounds", "wikitext2_ppl", "note"])]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "export.md").write_text("\n".join(text) + "\n")
    write_rows_json([{"machine": env}, *rows, *decode], args.json)
    print("\n".join(text))
    if args.work is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
