"""What the int4 token embedding buys and costs: bundle bytes and WikiText-2 perplexity, int4 vs fp32.

For SmolLM2-135M (tied lm_head), DIP-CA BQ4 bundles exported with ``--embedding int4`` (the default:
GatherBlockQuantized rows, the head's MatMulNBits reading the same blocks) and ``--embedding fp32``
(the table as the checkpoint has it, the head quantised apart), their bytes per file, and beside them
onnxruntime-genai's int4 export when ``--genai DIR`` names one (its builder: ``-p int4 -e cpu``). The
perplexity is ``dipdeploy eval --quant bq4 --embedding int4|fp32`` (the same fake-quantised weights
the bundles ship), dense and DIP at ρ = 0.5 (uniform plan, ρ_in 0.55).

    python benchmarks/embedding.py --quick                 # sizes + 1 window of 512 tokens
    python benchmarks/embedding.py --windows 4 --genai DIR

Writes benchmarks/results/embedding.md (and --json OUT).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _common import machine, md_table, write_rows_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bundle_sizes(out: Path) -> dict:
    files = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
    graphs = sum(v for k, v in files.items() if k.endswith(".onnx"))
    return {"bytes_total": sum(files.values()), "dense.bin": files.get("dense.bin"), "mlp.bin": files.get("mlp.bin"),
            "graphs": graphs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 window of 512 tokens")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--genai", type=Path, help="an onnxruntime-genai int4 export of the same model (its folder)")
    ap.add_argument("--json", help="write the rows as a JSON list")
    args = ap.parse_args()
    windows, seqlen = (1, 512) if args.quick else (args.windows, args.seqlen)
    from dipdeploy.eval import EvalConfig, evaluate
    from dipdeploy.paths import write_atomic
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig
    from dipdeploy.sparsity.plan import SparsityConfig

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for emb in ("int4", "fp32"):
            out = export_model(ExportConfig(method="dip-ca", quant="bq4", rho_in=0.55, embedding=emb,
                                            validate_tokens=0), Path(tmp) / emb).out
            row = {"bundle": f"dipdeploy DIP-CA BQ4, --embedding {emb}", **bundle_sizes(out)}
            evals = evaluate(EvalConfig(method=("dense", "dip"), density=(1.0, 0.5), seqlen=seqlen, max_windows=windows,
                                        quant="bq4", embedding=emb, sparsity=SparsityConfig(rho_in=0.55),
                                        progress=False))
            for r in evals:
                key = "ppl_dense" if r["method"] == "dense" else ("ppl_dip_0.5" if r["density"] < 1 else None)
                if key:
                    row[key] = r["ppl"]
            rows.append(row)
    if args.genai:
        files = {p.name: p.stat().st_size for p in args.genai.iterdir() if p.is_file()}
        rows.append({"bundle": "onnxruntime-genai int4 (-p int4 -e cpu)", "bytes_total": sum(files.values()),
                     "graphs": sum(v for k, v in files.items() if k.endswith(".onnx"))})
    for r in rows:
        for k in ("bytes_total", "dense.bin", "mlp.bin", "graphs"):
            if r.get(k) is not None:
                r[k] = round(r[k] / 1e6, 2)
    cols = ["bundle", "bytes_total", "dense.bin", "mlp.bin", "graphs", "ppl_dense", "ppl_dip_0.5"]
    m = machine()
    text = (f"# The int4 token embedding (benchmarks/embedding.py)\n\n`python benchmarks/embedding.py"
            f"{' --quick' if args.quick else ''}` · {m}\n\n"
            f"SmolLM2-135M-Instruct (tied lm_head). Sizes in MB (10⁶ bytes); `graphs`: every .onnx file. Perplexity: "
            f"WikiText-2 test, {windows} × {seqlen} tokens, `dipdeploy eval --quant bq4 --embedding …` (the weights "
            f"the bundle ships; dense and DIP ρ 0.5, ρ_in 0.55, uniform plan).\n\n" + md_table(rows, cols) + "\n")
    write_atomic(ROOT / "benchmarks" / "results" / "embedding.md", text, force=True)
    write_rows_json(rows, args.json)
    print(text)


if __name__ == "__main__":
    main()
