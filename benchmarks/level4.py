"""What int8 activations cost a trained model: WikiText-2 perplexity through the runtime at accuracy levels 0
and 4.

onnxruntime-genai's int4 export sets ``accuracy_level`` 4 on its MatMulNBits and llama.cpp's Q4_0 kernels
multiply by 8-bit activations, so ``flash-1b-levels.md`` compares our bundles at level 4 with them; its
random-weight 1 B model cannot say what level 4 does to a trained model's predictions. This runs the
SmolLM2-135M bundles of ``flash.py`` (BQ4; DIP-CA ρ_in 0.55 with LFU, the same bundle at γ = 1 as plain
DIP, dense-static ρ = 1 with its most used rows pinned) through ``Engine.teacher_forced`` at levels 0 and
4 on the same WikiText-2 test windows (``dipdeploy.data.windows``, the bundle's tokenizer): the
per-layer path, 1 thread, the budget's caches, so DIP-CA's mask is the one it decodes with. Each window
starts a new sequence (empty caches). ``ppl_vs_level0`` is the level-4 perplexity over the level-0 one of
the same bundle; ``top1_agree`` the share of positions whose most likely next token is the same at both
levels.

    python benchmarks/level4.py --quick       # 1 window of 128 tokens
    python benchmarks/level4.py               # 4 windows of 512 tokens (about 6 min on 2 Xeon cores)

Writes benchmarks/results/level4.md (and --json OUT).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from _common import lscpu, machine, md_table, positive_int, write_rows_json

import flash

from dipdeploy.paths import write_atomic

RESULTS = Path(__file__).resolve().parent / "results"
LEVELS = (0, 4)
BUDGET = "50%"
CONFIGS = {  # row label → (flash.py bundle, Engine options); dip is the DIP-CA bundle at γ = 1 (plain DIP)
    "dense-static": ("dense-static", dict(policy=flash.POLICY["dense-static"])),
    "dip": ("dip-ca", dict(policy="lfu", gamma=1.0)),
    "dip-ca": ("dip-ca", dict(policy=flash.POLICY["dip-ca"])),
}


def nll(logits: list[np.ndarray], targets: list[int]) -> np.ndarray:
    """The negative log-likelihood of each target under the logits before it (float64 log-softmax)."""
    z = np.stack(logits).astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    logz = np.log(np.exp(z).sum(axis=1))
    return logz - z[np.arange(len(targets)), targets]


def measure(bundle: Path, method: str, level: int, windows: list[list[int]]) -> dict:
    """One configuration (:data:`CONFIGS`) at one level: the windows teacher-forced, their NLL and each
    position's top-1 token."""
    from dipdeploy.runtime import Engine

    eng = Engine(bundle, dram_budget=BUDGET, native=True, fused=False, context=len(windows[0]) + 1, io="mmap",
                 accuracy_level=level, **CONFIGS[method][1])
    losses, top1, t0 = [], [], time.time()
    for w in windows:
        logits, _ = eng.teacher_forced(w[:1], w[1:])
        losses.append(nll(logits, w[1:]))
        top1.append(np.array([int(np.argmax(x)) for x in logits]))
    eng.close()
    loss = np.concatenate(losses)
    return dict(method=method, level=level, ppl=float(np.exp(loss.mean())), tokens=int(loss.size),
                seconds=round(time.time() - t0, 1), top1=np.concatenate(top1))


def compare(rows: list[dict]) -> list[dict]:
    """Each level-4 row gets its perplexity over the same method's level-0 one and the top-1 agreement."""
    base = {r["method"]: r for r in rows if r["level"] == 0}
    for r in rows:
        b = base.get(r["method"])
        if r["level"] != 0 and b is not None:
            r["ppl_vs_level0"] = r["ppl"] / b["ppl"]
            r["top1_agree"] = float(np.mean(r["top1"] == b["top1"]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 window of 128 tokens")
    ap.add_argument("--windows", type=positive_int, default=4, help="WikiText-2 test windows")
    ap.add_argument("--seqlen", type=positive_int, default=512, help="tokens per window")
    ap.add_argument("--json", help="write the rows as a JSON list")
    args = ap.parse_args()
    count, seqlen = (1, 128) if args.quick else (args.windows, args.seqlen)
    if seqlen < 2:
        ap.error("--seqlen: give at least 2 (a window predicts its tokens after the first)")
    from transformers import PreTrainedTokenizerFast

    from dipdeploy.data import load_text, windows as text_windows
    from dipdeploy.runtime import Engine

    paths = flash.ensure_bundles("smollm2-135m")
    probe = Engine(paths["dense-static", "natural"], dram_budget=BUDGET)  # the bundle's own tokenizer
    try:
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=probe.tokenizer)
        windows = text_windows(tokenizer, load_text(), seqlen, count).tolist()
    finally:
        probe.close()
    rows = []
    for method, (bundle, _) in CONFIGS.items():
        for level in LEVELS:
            rows.append(measure(paths[bundle, "natural"], method, level, windows))
            r = rows[-1]
            print(f"{method:12s} level {level}: ppl {r['ppl']:.3f} over {r['tokens']} tokens ({r['seconds']} s)",
                  flush=True)
    rows = compare(rows)
    for r in rows:
        r.pop("top1")
    name = "level4" + ("-quick" if args.quick else "")
    text = "\n".join([
        "# What int8 activations cost: perplexity at accuracy levels 0 and 4 (benchmarks/level4.py)", "",
        f"`python benchmarks/level4.py {' '.join(sys.argv[1:])}` · {machine()} · WikiText-2 test, {count} × "
        f"{seqlen} tokens, teacher-forced through the runtime", "",
        f"- machine (lscpu): {lscpu()}",
        f"- bundles: flash.py's SmolLM2-135M BQ4 bundles (DIP-CA ρ_in 0.55, γ 0.5, LFU; `dip`: the same bundle at "
        f"γ = 1; dense-static ρ = 1, static pinning) at a {BUDGET} budget, the per-layer path, native kernels, 1 "
        "thread; each window a new sequence",
        "- `level`: MatMulNBits and BQ4 SparseGatherMatMul at 0 (float32 activations, the bundles' own) or 4 "
        "(int8 activations, as onnxruntime-genai's int4 export and llama.cpp's Q4_0 kernels); `ppl_vs_level0`: "
        "level 4 over level 0 for the same bundle; `top1_agree`: positions whose most likely next token is the "
        "same at both levels", "",
        md_table(rows, ["method", "level", "ppl", "ppl_vs_level0", "top1_agree", "tokens", "seconds"]), ""])
    write_atomic(RESULTS / f"{name}.md", text, force=True)
    write_rows_json(rows, args.json)
    print(text)


if __name__ == "__main__":
    main()
