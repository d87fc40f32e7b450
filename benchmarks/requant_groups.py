"""Where a bundle's re-quantisation loses perplexity against the GGUF it came from: one group of tensors at a time.

Usage: python benchmarks/requant_groups.py VARIANT[,VARIANT...]   (WikiText-2 in /work/shared/data or $DIPDEPLOY_DATA)

A variant is ``dense`` or ``PART=HOW[+PART=HOW...]``: PART is mlp (up, gate, down), mlpq6 (the down rows of the
layers whose GGUF ``ffn_down`` is Q6_K), mlpq4 (the other MLP rows), attn (q, k, v, o), head (lm_head) or emb;
HOW is bq4 (block 64 symmetric, round to nearest), bq4s (with the scale search), bq4b32 / bq4b32s, bq4a32 /
bq4a32s (block 32 asymmetric), q8 (8-bit symmetric blocks of 32), gptq / gptqa32 (error feedback through the
dense Hessian of 4 × 512 validation tokens, 4 layers at a time). The model is the registry's
qwen2.5-coder-1.5b in the torch reference (fp32, the GGUF's values); each variant's weights are put in, the
perplexity of 4 × 512 test tokens measured, and the GGUF's values put back. One JSON line per variant on
stdout. The figures: benchmarks/results/accuracy-qwen2.5-coder-1.5b.md, "The bundle's weight format".
Folds into `dipdeploy bench quant` when that suite lands (docs/benchmarks.md).
"""
import json, os, sys, time
import numpy as np, torch, gguf
from dipdeploy.loading import load_model, gguf_of
from dipdeploy.data import load_text, windows
from dipdeploy.eval.perplexity import perplexity
from dipdeploy.quant.api import quantize, quantize_dense, dequantize_rows
from dipdeploy.quant.config import Block4QuantConfig
from dipdeploy.quant.layout import mlp_to_rows, rows_to_mlp

torch.set_num_threads(2)
DATA = os.environ.get("DIPDEPLOY_DATA", "/work/shared/data")
variants = sys.argv[1].split(",")
lm = load_model("qwen2.5-coder-1.5b")
model, tok = lm.model, lm.tokenizer
text = load_text("wikitext2", "test", data_dir=DATA)
W = windows(tok, text, 512, 4)
path, _ = gguf_of("qwen2.5-coder-1.5b")
types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
layers = model.model.layers

def q8_rows(w, block=32):  # symmetric 8-bit blocks along the last dim, fp16 scale
    R, C = w.shape
    x = w.reshape(R, C // block, block)
    s = (np.abs(x).max(axis=2, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    s = np.where(s == 0, 1, s)
    return (np.clip(np.rint(x / s), -127, 127) * s).reshape(R, C)

def dense_q(w, how):
    if how == "q8":
        return q8_rows(w)
    cfg = {"bq4": Block4QuantConfig(), "bq4s": Block4QuantConfig(scale_search=True),
           "bq4a32s": Block4QuantConfig(block_size=32, symmetric=False, scale_search=True)}[how]
    return dequantize_rows(quantize_dense(w, cfg))

def rows_q(rows, how, H=None):
    if how == "q8":
        return q8_rows(rows)
    cfg = {"bq4": Block4QuantConfig(), "bq4s": Block4QuantConfig(scale_search=True),
           "bq4a32s": Block4QuantConfig(block_size=32, symmetric=False, scale_search=True),
           "bq4b32s": Block4QuantConfig(block_size=32, scale_search=True),
           "bq4b32": Block4QuantConfig(block_size=32), "bq4a32": Block4QuantConfig(block_size=32, symmetric=False),
           "gptq": Block4QuantConfig(error_feedback=True), "gptqa32": Block4QuantConfig(block_size=32, symmetric=False, error_feedback=True)}[how]
    return dequantize_rows(quantize(rows, cfg, hessian=H))

saved = {}
def setw(mod, arr):
    if id(mod) not in saved:
        saved[id(mod)] = (mod, mod.weight.detach().clone())
    with torch.no_grad():
        mod.weight.copy_(torch.from_numpy(np.ascontiguousarray(arr)).reshape(mod.weight.shape))

def restore():
    with torch.no_grad():
        for mod, w in saved.values():
            mod.weight.copy_(w)
    saved.clear()

def npw(mod):
    return mod.weight.detach().float().numpy()

def apply(spec):
    """spec: part=how[+part=how...]; parts: mlp, mlpq6 (down of Q6_K-source layers), mlpq4 (the rest), attn, head, emb"""
    for item in spec.split("+"):
        part, how = item.split("=")
        if part == "head":
            setw(model.lm_head, dense_q(npw(model.lm_head), how))
        elif part == "emb":
            e = model.get_input_embeddings(); setw(e, dense_q(npw(e), how))
        elif part == "attn":
            for L in layers:
                for m in (L.self_attn.q_proj, L.self_attn.k_proj, L.self_attn.v_proj, L.self_attn.o_proj):
                    setw(m, dense_q(npw(m), how))
        elif part.startswith("mlp"):
            gptq = how.startswith("gptq")
            if gptq:
                from dipdeploy.quant.calib import row_statistics
                from dipdeploy.data import calibration_windows
                cal = calibration_windows(tok, 4, 512, data_dir=DATA)
            for g0 in range(0, len(layers), 4):
                group = tuple(range(g0, min(g0 + 4, len(layers))))
                stats = row_statistics(model, cal, full=True, layers=group) if gptq else None
                for i in group:
                    mlp = layers[i].mlp
                    st = stats[i] if gptq else {"up_gate": None, "down": None}
                    q6 = types[f"blk.{i}.ffn_down.weight"] == "Q6_K"
                    ug, dn = mlp_to_rows(npw(mlp.up_proj), npw(mlp.gate_proj), npw(mlp.down_proj))
                    if part in ("mlp", "mlpq4"):
                        ug = rows_q(ug, how, st["up_gate"])
                    if part == "mlp" or (part == "mlpq6" and q6) or (part == "mlpq4" and not q6):
                        dn = rows_q(dn, how, st["down"])
                    u, g, d = rows_to_mlp(ug, dn)
                    setw(mlp.up_proj, u); setw(mlp.gate_proj, g); setw(mlp.down_proj, d)
                del stats
        else:
            raise SystemExit(f"unknown part {part}")

for v in variants:
    t0 = time.time()
    if v != "dense":
        apply(v)
    t1 = time.time()
    ppl, n = perplexity(model, W)
    restore()
    row = {"variant": v, "ppl": ppl, "tokens": n, "quant_s": round(t1 - t0, 1), "eval_s": round(time.time() - t1, 1)}
    print(json.dumps(row), flush=True)
