"""How well a row order fitted on one text serves another: blocks the missed rows touch per decode token.

The export fits each group's order on the calibration text's misses (docs/method.md "Flash layout"); what
matters is what it does on other text. This replays the host runtime (SmolLM2 DIP-CA BQ4, LFU, the
flash.py bundles) on a held-out decode (flash.py's prompt) and counts, per group kind, the 4 KiB blocks its
misses touch (``roworder.blocks_touched``, the direct reader's count) under:

- ``natural``; ``bundle``: the calibrated bundle's own order (fitted at export on 4 × 512 WikiText-2
  validation tokens through the torch reference);
- ``frequency``, ``chain``: the candidates fitted on a runtime decode of another WikiText-2 passage;
- ``oracle``: ``chain`` fitted on the held-out misses themselves: what this kind of ordering could buy if
  the misses were known, an upper bound, not a layout one can ship.

    python benchmarks/row_order.py           # 160 training tokens, 48 held-out tokens (~2 min)
    python benchmarks/row_order.py --quick   # 48 and 16
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from _common import machine, md_table, write_rows_json
from flash import BUNDLES, PROMPT, ensure_bundles

from dipdeploy.quant.roworder import GroupGeometry, blocks_touched, candidate_order, miss_matrix, position_of

RESULTS = Path(__file__).resolve().parent / "results"
SKIP = 8  # held-out tokens from this one on: the prompt's are a batched prefill


def decode_trace(bundle: Path, prompt: str, tokens: int, budget: str):
    from dipdeploy.runtime import Engine

    eng = Engine(bundle, dram_budget=budget, policy="lfu", io="mmap", context=512, prefill="token",
                 fused=False)  # a trace is the host cache step's selections
    rec = eng.trace_recorder()
    eng.generate(prompt, tokens, stop_at_eos=False, trace=rec)
    eng.close()
    return rec.finish()


def misses(trace, layer: int, group: str, skip: int = 0) -> np.ndarray:
    sel, hits = ((trace.sel_in[layer], trace.hits_in[layer]) if group == "up_gate"
                 else (trace.sel_glu[layer], trace.hits_glu[layer]))
    rows = trace.hidden_size if group == "up_gate" else trace.intermediate_size
    return miss_matrix([s[~h] for s, h in zip(sel[skip:], hits[skip:])], rows)


def geometry(manifest, group: str) -> GroupGeometry:
    row_bytes = []
    for label in ("qweight", "scales"):
        t = manifest.tensors[f"model.layers.0.mlp.{group}.{label}"]
        row_bytes.append(int(np.prod(t["shape"][1:])) * np.dtype(t["dtype"]).itemsize)
    return GroupGeometry((0, 0), tuple(row_bytes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="48 training and 16 held-out tokens")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--json", help="write the rows as a JSON list")
    args = ap.parse_args()
    from dipdeploy.bundle.manifest import read_manifest, row_positions
    from dipdeploy.data import load_text

    paths = ensure_bundles(args.model, ("natural", "calibrated"))
    natural, calibrated = paths["dip-ca", "natural"], paths["dip-ca", "calibrated"]
    train_n, test_n = (48, 16) if args.quick else (160, 48)
    text = load_text("wikitext2", "validation")
    train = decode_trace(natural, text[5000:5600], train_n, args.budget)
    test = decode_trace(natural, PROMPT, SKIP + test_n, args.budget)
    m = read_manifest(calibrated)
    rows = []
    for group in ("up_gate", "down"):
        geo = geometry(m, group)
        total: dict[str, int] = {}
        for layer in range(test.num_layers):
            held, fit = misses(test, layer, group, SKIP), misses(train, layer, group)
            R = held.shape[1]
            orders = {"natural": np.arange(R), "bundle": row_positions(calibrated, m, layer, group, R),
                      "frequency": position_of(candidate_order("frequency", fit, geo)),
                      "chain": position_of(candidate_order("chain", fit, geo)),
                      "oracle": position_of(candidate_order("chain", held, geo))}
            for name, position in orders.items():
                total[name] = total.get(name, 0) + blocks_touched(position, held, geo)
        tokens = held.shape[0]
        for name, blocks in total.items():
            rows.append({"group": group, "order": name, "blocks_per_token": blocks / tokens,
                         "mb_per_token": blocks * geo.block / tokens / 1e6,
                         "vs_natural": blocks / total["natural"] - 1})
    text_out = "\n".join([
        "# Row orders on held-out decoding (benchmarks/row_order.py)", "",
        f"`python benchmarks/row_order.py{' --quick' if args.quick else ''}` · {machine()} · {args.model} DIP-CA BQ4 "
        f"({BUNDLES['dip-ca'][1]}), LFU, budget {args.budget}; held out: {test_n} decode tokens after \"{PROMPT}\"; "
        f"fitted: {train_n} decode tokens after a WikiText-2 validation passage", "",
        "Blocks (4 KiB) touched by each token's missed rows, summed over the layers; `bundle` is the order "
        "`export --row-order calibrated` wrote, `oracle` is fitted on the held-out misses themselves.", "",
        md_table(rows, ["group", "order", "blocks_per_token", "mb_per_token", "vs_natural"]), ""])
    (RESULTS / f"row_order{'-quick' if args.quick else ''}.md").write_text(text_out)
    write_rows_json(rows, args.json)
    print(text_out)


if __name__ == "__main__":
    main()
