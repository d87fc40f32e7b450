"""Golden vectors for the Android engine's JUnit tests, produced by the Python code itself.

    .venv/bin/python android_demo/golden/make_golden.py [--out build/android-golden] [--force]

Writes JSON (never committed; build/ is ignored) that the Java tests compare with exactly:

  rowcache.json   RowCache hits/residency per step, every policy, several capacities, on a recorded
                  selection trace of tiny-llama (`dipdeploy trace`) and on synthetic selections with ties
                  and duplicates; static_rows
  score.json      dipca_scores / topk_indices / topk_rows / gamma_at on random data with ties and zeros,
                  plus numpy argmax (the greedy sampler)
  replay.json     DIP-CA token loop on the trace's magnitudes: scores under the cache → top-K → access
  slots.json      SlotTable steps (slots, Flash reads, releases, deferred moves) behind RowCache
  bundle.json     manifest parsing of a tiny exported bundle, accepted/rejected variants, verify() problems
                  of a damaged copy, per-layer graph I/O names, FlashStore reads (bytes and counters), and a
                  per-token MlpGroup run (slots + sha256 of the rows the op would read)
  runtime.json    the Python host runtime (dipdeploy.runtime.Engine) on that bundle, greedy, per policy and
                  cache split: prompt ids, generated tokens and text, every token's selections and hits per
                  layer and group, cache capacities and the Flash byte/request totals (skipped if the runtime
                  is absent)
  split.json      dipdeploy.cache.split on random groups (rows, row bytes, K, cache bytes): the capacities
                  of the reads split, and dipdeploy.flash.miss_cost of row sizes around the 4 KiB block
  sandbox.json    the bundle checks of issue #56 (sandbox_cases.py): external-data problems of hand-built graph
                  bytes, and verify() of bundle copies with a genai op library, a hard link, a FIFO, graphs
                  naming data outside the bundle
  tokenizer.json  encode/decode (tokenizer_cases.py) with SmolLM2's tokenizer.json, the tiny models' byte
                  tokenizer and the SentencePiece-style BPE files of sp_tokenizers.py (Gemma, Llama 2,
                  Metaspace; built here), all from the `tokenizers` library

Everything is deterministic (fixed seeds); the bundle and the trace are rebuilt with --force.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from dipdeploy.bundle.manifest import Manifest, open_tensor, read_manifest, verify
from dipdeploy.cache import RowCache, SlotTable, dipca_scores, gamma_at, policy_of, static_rows, topk_indices, topk_rows
from sandbox_cases import sandbox_golden  # beside this script
from tokenizer_cases import tokenizer_golden

ROOT = Path(__file__).resolve().parents[2]
TEXT = ("The quick brown fox jumps over the lazy dog. 12345 numbers, café and naïve.\n"
        "A second line of text for the tracer to chew on; it repeats. The quick brown fox.\n") * 4


def bits(a: np.ndarray) -> str:
    return "".join("1" if v else "0" for v in np.asarray(a, dtype=bool).reshape(-1))


def f32bits(a) -> list[int]:
    return np.asarray(a, dtype=np.float32).reshape(-1).view(np.uint32).astype(np.int64).tolist()


def ints(a) -> list[int]:
    return np.asarray(a, dtype=np.int64).reshape(-1).tolist()


def cli() -> Path:
    exe = Path(sys.executable).parent / "dipdeploy"
    return exe if exe.exists() else Path("dipdeploy")


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


# ---------------------------------------------------------------- inputs: bundle and trace

def make_bundle(out: Path, force: bool) -> Path:
    bundle = out / "bundle"
    if force or not (bundle / "manifest.json").is_file():
        cmd = [str(cli()), "export", "--model", "tiny-llama", "--method", "dip-ca", "--density", "0.5",
               "--quant", "bq4", "--out", str(bundle), "--force", "--validate-tokens", "4",
               "--row-order", "natural"]  # the Java engine reads the natural order only (Manifest.java)
        data = os.environ.get("DIPDEPLOY_DATA") or str(ROOT.parent / "shared" / "data")  # as .ci/run sets it
        if (Path(data) / "wikitext-2-raw" / "wiki.valid.raw").is_file():
            cmd += ["--data-dir", data]
        else:  # no calibration text: a fixed input share instead of the calibrated split
            print(f"make_golden: no WikiText-2 under {data}; exporting with --rho-in 0.6", file=sys.stderr)
            cmd += ["--rho-in", "0.6"]
        run(cmd)
    return bundle


def make_trace(out: Path, bundle: Path, force: bool):
    from dipdeploy.trace import Trace

    trace = out / "trace.npz"
    if force or not trace.is_file():
        plan = out / "plan.json"  # the bundle's own plan: no calibration data needed, same K
        plan.write_text(json.dumps(read_manifest(bundle).plan))
        text = out / "trace.txt"
        text.write_text(TEXT)
        run([str(cli()), "trace", "--model", "tiny-llama", "--method", "dip-ca", "--plan", str(plan),
             "--tokens", "48", "--text-file", str(text), "--out", str(trace), "--force"])
    return Trace.load(trace)


# ---------------------------------------------------------------- cache rule

def cache_case(name, rows, capacity, policy, sels, pinned=None):
    future = np.asarray(sels) if policy_of(policy).needs_future else None
    c = RowCache(rows, capacity, policy, future=future, pinned=pinned)
    hits, res = [], []
    for s in sels:
        hits.append(bits(c.access(np.asarray(s)[None, :])))
        res.append(bits(c.resident[0]))
    return {"name": name, "rows": rows, "capacity": capacity, "policy": policy,
            "pinned": bits(pinned) if pinned is not None else None,
            "selections": [ints(s) for s in sels], "hits": hits, "resident": res,
            "hits_total": c.hits, "misses_total": c.misses, "capacity_effective": c.capacity}


def rowcache_golden(trace) -> dict:
    cases = []
    for layer in range(trace.num_layers):
        for group, sels, rows in (("in", trace.sel_in[layer], trace.hidden_size),
                                  ("glu", trace.sel_glu[layer], trace.intermediate_size)):
            sels = [np.asarray(s, dtype=np.int64) for s in sels]
            counts = np.bincount(np.concatenate(sels), minlength=rows)
            for cap in (round(0.5 * rows), 1, 0, rows - 5, rows + 3):
                for pol in ("none", "lru", "lfu", "belady", "static"):
                    pinned = static_rows(counts, cap) if policy_of(pol).pinned else None
                    cases.append(cache_case(f"trace L{layer} {group} {pol} C={cap}", rows, cap, pol, sels, pinned))
    rng = np.random.default_rng(7)
    rows, K = 20, 5
    sels = [np.sort(rng.choice(rows, K, replace=False)) for _ in range(60)]
    for cap in (3, 8, 19):
        for pol in ("lru", "lfu", "belady"):
            cases.append(cache_case(f"synthetic {pol} C={cap}", rows, cap, pol, sels))
    dup = [np.array([1, 1, 4]), np.array([4, 2, 2]), np.array([0, 1, 1]), np.array([3, 3, 3]), np.array([2, 4, 0])]
    for pol in ("lru", "lfu", "belady"):
        cases.append(cache_case(f"duplicates {pol}", 6, 3, pol, dup))
    statics = []
    for seed in range(4):
        r = np.random.default_rng(seed)
        counts = r.integers(0, 4, size=25)
        for cap in (0, 1, 7, 25, 30):
            statics.append({"counts": ints(counts), "capacity": cap, "mask": bits(static_rows(counts, cap))})
    return {"cases": cases, "static_rows": statics}


def score_golden() -> dict:
    rng = np.random.default_rng(11)
    cases = []
    for n, R in enumerate((1, 7, 37, 64, 100)):
        for kind in ("random", "ties", "zeros", "negzero"):
            if kind == "random":
                x = np.abs(rng.standard_normal(R)).astype(np.float32)
            elif kind == "ties":
                x = (np.round(np.abs(rng.standard_normal(R)) * 2) / 2).astype(np.float32)
            elif kind == "zeros":
                x = np.zeros(R, dtype=np.float32)
                x[rng.integers(0, R, size=max(1, R // 5))] = 0.5
                if n % 2 == 0:
                    x[:] = 0
            else:
                x = np.where(rng.random(R) < 0.5, np.float32(-0.0), np.float32(0.25)).astype(np.float32)
            res = rng.random(R) < 0.5
            for gamma in (0.0, 0.2, 0.5, 1.0):
                for top_n in (0, 3, R + 5):
                    for resident in (res, None):
                        s = dipca_scores(x[None], None if resident is None else resident[None], gamma, top_n)[0]
                        ks = sorted({1, min(5, R), R})
                        cases.append({"x": f32bits(x), "resident": None if resident is None else bits(resident),
                                      "gamma": gamma, "fixed_top_n": top_n, "scores": f32bits(s),
                                      "topk": {str(k): ints(topk_indices(s[None], k)[0]) for k in ks},
                                      "rows": {str(k): ints(topk_rows(s[None], k)[0]) for k in ks}})
    warm = [{"gamma": g, "step": t, "warmup": w, "value": gamma_at(g, t, w)}
            for g in (0.1, 0.2, 0.3) for w in (0, 3, 16) for t in (0, 1, 2, 5, 15, 16, 40)]
    argmax = []
    for R in (1, 5, 256):
        for kind in ("random", "ties"):
            v = rng.standard_normal(R).astype(np.float32)
            if kind == "ties":
                v = np.round(v).astype(np.float32)
            argmax.append({"logits": f32bits(v), "argmax": int(np.argmax(v))})
    return {"cases": cases, "gamma_at": warm, "argmax": argmax}


def replay_golden(trace, plan: dict) -> dict:
    """The DIP-CA token loop (as the simulator and the torch reference run it) on the trace's magnitudes."""
    out = []
    gamma = float(plan["gamma"])
    for layer in range(trace.num_layers):
        for group, mags, rows, k in (("in", trace.x_abs[layer], trace.hidden_size, plan["layers"][layer]["k_in"]),
                                     ("glu", trace.glu_abs[layer], trace.intermediate_size,
                                      plan["layers"][layer]["k_glu"])):
            for pol in ("lfu", "lru"):
                cap = round(plan["cache_frac"] * rows)
                c = RowCache(rows, cap, pol)
                steps = []
                mags32 = np.asarray(mags, dtype=np.float32)
                for t in range(mags32.shape[0]):
                    s = dipca_scores(mags32[t][None], c.resident, gamma, plan["fixed_top_n"])
                    sel = topk_indices(s, k)
                    hit = c.access(sel)
                    steps.append({"sel": ints(sel), "hits": bits(hit)})
                out.append({"layer": layer, "group": group, "rows": rows, "k": k, "capacity": cap, "policy": pol,
                            "gamma": gamma, "fixed_top_n": plan["fixed_top_n"],
                            "x_abs": [f32bits(m) for m in mags32], "steps": steps})
    return {"cases": out}


def slot_case(name, rows, capacity, policy, sels, staging, pinned=None):
    future = np.asarray([np.sort(s) for s in sels]) if policy_of(policy).needs_future else None
    c = RowCache(rows, capacity, policy, future=future, pinned=pinned)
    t = SlotTable(rows, c.capacity, staging)
    pre = None
    if pinned is not None:
        p = t.preload(np.flatnonzero(pinned))
        pre = {"read_rows": ints(p.read_rows), "read_slots": ints(p.read_slots)}
    steps = []
    for s in sels:
        hit = c.access(s[None, :])[0]
        st = t.assign(s, hit, c.resident[0])
        mv_from, mv_to = t.finish(st)
        assert np.array_equal(t.resident(), c.resident[0])
        steps.append({"sel": ints(s), "hits": bits(hit), "resident_after": bits(c.resident[0]),
                      "slots": ints(st.slots), "read_rows": ints(st.read_rows), "read_slots": ints(st.read_slots),
                      "release": ints(st.release), "deferred_rows": ints(st.deferred_rows),
                      "deferred_from": ints(st.deferred_from), "moves_from": ints(mv_from), "moves_to": ints(mv_to)})
    return {"name": name, "rows": rows, "capacity": capacity, "capacity_effective": c.capacity, "policy": policy,
            "staging": staging, "pinned": bits(pinned) if pinned is not None else None, "preload": pre,
            "steps": steps}


def shuffled(sels, seed):
    rng = np.random.default_rng(seed)
    return [rng.permutation(np.asarray(s, dtype=np.int64)) for s in sels]


def slots_golden(trace) -> dict:
    cases = []
    for layer in range(trace.num_layers):
        for group, sels, rows in (("in", trace.sel_in[layer], trace.hidden_size),
                                  ("glu", trace.sel_glu[layer], trace.intermediate_size)):
            sels = shuffled(sels, layer * 2 + (group == "glu"))
            K = len(sels[0])
            counts = np.bincount(np.concatenate(sels), minlength=rows)
            for cap in (round(0.5 * rows), 3, rows):
                for pol in ("none", "lru", "lfu", "belady", "static"):
                    pinned = static_rows(counts, cap) if policy_of(pol).pinned else None
                    cases.append(slot_case(f"trace L{layer} {group} {pol} C={cap}", rows, cap, pol, sels, K, pinned))
    rng = np.random.default_rng(5)
    sels = [rng.permutation(rng.choice(16, 6, replace=False)) for _ in range(50)]
    for cap in (2, 7, 12):
        for pol in ("lru", "lfu", "belady"):
            cases.append(slot_case(f"synthetic {pol} C={cap}", 16, cap, pol, sels, 6))
    return {"cases": cases}


# ---------------------------------------------------------------- bundle: manifest, graphs, Flash reads

def graph_io(bundle: Path) -> dict:
    import onnx

    out = {}
    for f in sorted(bundle.glob("*.onnx")):
        if f.name == "model.onnx":
            continue
        m = onnx.load(str(f), load_external_data=False)
        out[f.name] = {"inputs": [i.name for i in m.graph.input], "outputs": [o.name for o in m.graph.output]}
    return out


def manifest_variants(text: str) -> list[dict]:
    raw = json.loads(text)
    variants = []

    def add(name, obj):
        t = json.dumps(obj)
        try:
            Manifest.from_json(t)
            ok, err = True, None
        except (ValueError, TypeError) as e:
            ok, err = False, type(e).__name__
        variants.append({"name": name, "text": t, "ok": ok, "error": err})

    add("as written", raw)
    v = raw["version"]
    for name, key, value in ((f"version {v + 1}", "version", v + 1), (f"version {v - 1}", "version", v - 1),
                             (f"version {v}.0", "version", float(v)), (f"version '{v}'", "version", str(v)),
                             ("version true", "version", True),
                             ("format other", "format", "onnx-bundle")):
        r = copy.deepcopy(raw)
        r[key] = value
        add(name, r)
    for key in ("version", "format", "tensors", "dipca"):
        r = copy.deepcopy(raw)
        del r[key]
        add(f"without {key}", r)
    r = copy.deepcopy(raw)
    r["extra"] = 1
    add("unknown field", r)
    return variants


def damaged_copy(bundle: Path, out: Path) -> list[str]:
    broken = out / "bundle-damaged"
    shutil.rmtree(broken, ignore_errors=True)
    shutil.copytree(bundle, broken)
    (broken / "genai_config.json").unlink()
    with open(broken / "head.onnx", "ab") as f:
        f.write(b"\0")
    data = bytearray((broken / "embed.onnx").read_bytes())
    data[10] ^= 0xFF
    (broken / "embed.onnx").write_bytes(bytes(data))
    raw = json.loads((broken / "manifest.json").read_text())
    name = next(n for n in raw["tensors"] if n.endswith("mlp.down.scales"))
    raw["tensors"][name]["offset"] += 3  # misaligned and beyond the file's end for the last tensor
    raw["tensors"][name]["length"] += 10 ** 6
    (broken / "manifest.json").write_text(json.dumps(raw, indent=1))
    return verify(broken)


def group_arrays(man, layer: int, group: str):
    prefix = f"model.layers.{layer}.mlp.{group}."
    names = [n for n in man.tensors if n.startswith(prefix) and "." not in n[len(prefix):]]
    rows = man.tensors[names[0]]["shape"][0]
    return [n for n in names if man.tensors[n]["shape"][0] == rows], rows


def runs(rows: np.ndarray) -> np.ndarray:
    try:
        from dipdeploy.runtime.flash import runs as rt_runs  # the host runtime's own definition when present
        return rt_runs(rows)
    except ImportError:
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        return np.concatenate([[0], breaks, [len(rows)]]).astype(np.int64)


def flash_golden(bundle: Path, man) -> list[dict]:
    rng = np.random.default_rng(3)
    out = []
    for layer in range(len(man.plan["layers"])):
        for group in ("up_gate", "down"):
            names, rows = group_arrays(man, layer, group)
            for case in range(3):
                n = int(rng.integers(1, rows // 2))
                sel = np.sort(rng.choice(rows, n, replace=False))
                if case == 0:
                    sel = np.arange(5, 5 + n)  # one run
                slab_rows = n + 4
                slots = rng.permutation(slab_rows)[:n] if case != 1 else np.arange(2, 2 + n)
                arrays = []
                for name in names:
                    mm = open_tensor(bundle, man, name)
                    rb = mm[0].nbytes
                    rows_bytes = [np.ascontiguousarray(mm[r]).view(np.uint8).tobytes().hex() for r in sel]
                    arrays.append({"name": name, "row_bytes": rb, "rows_hex": rows_bytes})
                starts = runs(sel)
                out.append({"layer": layer, "group": group, "rows": ints(sel), "slots": ints(slots),
                            "slab_rows": slab_rows, "arrays": arrays,
                            "bytes": int(sum(len(sel) * a["row_bytes"] for a in arrays)),
                            "requests": int((len(starts) - 1) * len(arrays))})
    return out


def group_golden(bundle: Path, man, trace) -> list[dict]:
    """MlpGroup per token: the RowCache + SlotTable protocol on the bundle, with the bytes the op would read."""
    out = []
    plan = man.plan
    for layer in range(len(plan["layers"])):
        for group, sels, k in (("up_gate", trace.sel_in[layer], plan["layers"][layer]["k_in"]),
                               ("down", trace.sel_glu[layer], plan["layers"][layer]["k_glu"])):
            names, rows = group_arrays(man, layer, group)
            maps = [open_tensor(bundle, man, n) for n in names]
            for pol in ("lfu", "lru", "none"):
                cap = 0 if policy_of(pol).zero_capacity else round(plan["cache_frac"] * rows)
                c = RowCache(rows, cap, pol)
                t = SlotTable(rows, c.capacity, k)
                steps = []
                for s in shuffled(sels, 100 + layer):
                    hit = c.access(s[None, :])[0]
                    st = t.assign(s, hit, c.resident[0])
                    h = hashlib.sha256()
                    for mm in maps:
                        for r in s:
                            h.update(np.ascontiguousarray(mm[r]).view(np.uint8).tobytes())
                    starts = runs(st.read_rows)
                    nbytes = int(len(st.read_rows) * sum(mm[0].nbytes for mm in maps))
                    mv_from, mv_to = t.finish(st)
                    steps.append({"sel": ints(s), "slots": ints(st.slots), "sha256": h.hexdigest(),
                                  "bytes": nbytes, "requests": int((len(starts) - 1) * len(maps)) if len(st.read_rows) else 0,
                                  "moves": len(mv_from)})
                out.append({"layer": layer, "group": group, "k": k, "policy": pol, "capacity": cap,
                            "arrays": names, "steps": steps})
    return out


def bundle_golden(bundle: Path, out: Path) -> dict:
    man = read_manifest(bundle)
    text = (bundle / "manifest.json").read_text()
    cfg = man.source["config"]
    return {
        "bundle": str(bundle),
        "damaged": str(out / "bundle-damaged"),
        "expected": {
            "format": man.format, "version": man.version, "method": man.method, "alignment": man.alignment,
            "hidden_size": cfg["hidden_size"], "intermediate_size": cfg["intermediate_size"],
            "num_layers": cfg["num_hidden_layers"], "vocab_size": cfg["vocab_size"],
            "num_kv_heads": cfg.get("num_key_value_heads"), "head_dim": cfg.get("head_dim"),
            "k_in": [lp["k_in"] for lp in man.plan["layers"]], "k_glu": [lp["k_glu"] for lp in man.plan["layers"]],
            "dipca": man.dipca, "native_library": man.ops.get("native_library"),
            "graph_layers": man.graphs.get("layers"),
            "tensors": {n: {k: t[k] for k in ("file", "offset", "length", "dtype", "shape")}
                        for n, t in man.tensors.items()},
            "row_bytes": {n: int(np.prod(t["shape"][1:], dtype=np.int64) * np.dtype(t["dtype"]).itemsize)
                          for n, t in man.tensors.items()},
        },
        "verify": verify(bundle),
        "verify_damaged": damaged_copy(bundle, out),
        "variants": manifest_variants(text),
        "graph_io": graph_io(bundle),
        "flash": flash_golden(bundle, man),
        "groups": group_golden(bundle, man, _TRACE),
    }


# ---------------------------------------------------------------- the Python host runtime

RUNTIME_PROMPT = "The capital of France is"


def runtime_golden(bundle: Path) -> dict:
    """What ``dipdeploy run`` does on the bundle, token by token (``--prefill token``: the Java engine feeds
    the prompt one token at a time): the Java MlpGroups fed the same selections must agree."""
    try:
        from dipdeploy.runtime.engine import Engine
    except ImportError as exc:
        return {"available": False, "why": str(exc)}
    from dipdeploy.trace import TraceRecorder

    runs = []
    for policy, split in (("lfu", "reads"), ("lru", "reads"), ("none", "reads"), ("lfu", "even")):
        eng = Engine(bundle, policy=policy, dram_budget="50%", threads=1, prefill="token", cache_split=split,
                     fused=False,  # a trace: the host cache step the Java engine mirrors
                     io="mmap")  # the Java FlashStore reads rows as mmap does: one request per run of rows
        rec = TraceRecorder(source="runtime", model="tiny-llama", hidden_size=eng.d, intermediate_size=eng.f,
                            num_layers=eng.num_layers, method="dip-ca", density=0.5)
        gen = eng.generate(RUNTIME_PROMPT, 8, trace=rec, stop_at_eos=False)
        tr = rec.finish()
        runs.append({
            "policy": policy, "split": eng.residency.split, "prompt": RUNTIME_PROMPT,
            "prompt_ids": eng.encode(RUNTIME_PROMPT),
            "tokens": [int(t) for t in gen.tokens], "text": gen.text,
            "capacity": [[int(c) for c in layer] for layer in eng.residency.capacity],
            "k": [[int(a), int(b)] for a, b in eng.k],
            "sel_in": [[ints(row) for row in layer] for layer in tr.sel_in],
            "sel_glu": [[ints(row) for row in layer] for layer in tr.sel_glu],
            "hits_in": [[bits(row) for row in layer] for layer in tr.hits_in],
            "hits_glu": [[bits(row) for row in layer] for layer in tr.hits_glu],
            "flash_bytes": int(eng.flash.counters.bytes), "flash_requests": int(eng.flash.counters.requests),
        })
    return {"available": True, "bundle": str(bundle), "runs": runs}


def split_golden() -> dict:
    """The reads split (``dipdeploy.cache.split.split_by_reads``) on random models: layers of two groups
    whose rows, row bytes and K vary, some layers alike (one tier) and some groups empty, at several cache
    byte counts; and ``dipdeploy.flash.miss_cost`` of row sizes around the block."""
    from dipdeploy.cache.split import split_by_reads
    from dipdeploy.flash import BLOCK, miss_cost

    rng = np.random.default_rng(7)
    cases = []
    for n in range(24):
        layers = int(rng.integers(1, 6))
        shape = []
        for _ in range(layers):
            layer = []
            for _ in range(2):
                rows = int(rng.integers(0, 3000)) if n % 7 == 6 else int(rng.integers(1, 3000))
                layer.append(SimpleNamespace(rows=rows, row_bytes=int(rng.choice([2, 306, 1632, 4096, 4097, 9216,
                                                                                      int(rng.integers(1, 20000))])),
                                             k=int(rng.integers(0, rows + 1))))
            shape.append(layer)
        if n % 3 == 0:  # every layer alike: each group is one tier, filled to one fraction
            shape = [shape[0]] * layers
        total = sum(g.rows * g.row_bytes for layer in shape for g in layer)
        for frac in (0.0, 0.1, 0.5, 0.93, 1.2):
            cache = int(frac * total)
            cases.append({"rows": [[g.rows for g in layer] for layer in shape],
                          "row_bytes": [[g.row_bytes for g in layer] for layer in shape],
                          "k": [[g.k for g in layer] for layer in shape], "cache_bytes": cache,
                          "capacity": split_by_reads(shape, cache, miss_cost)})
    sizes = [1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK, 306, 1632, 9216, 10 ** 6]
    return {"cases": cases, "miss_cost": [{"row_bytes": b, "cost": miss_cost(b)} for b in sizes]}


_TRACE = None


def main() -> None:
    global _TRACE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "build" / "android-golden"))
    ap.add_argument("--force", action="store_true", help="re-export the bundle and re-record the trace")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bundle = make_bundle(out, args.force)
    _TRACE = make_trace(out, bundle, args.force)
    plan = read_manifest(bundle).plan
    parts = {
        "rowcache.json": rowcache_golden(_TRACE),
        "score.json": score_golden(),
        "replay.json": replay_golden(_TRACE, plan),
        "slots.json": slots_golden(_TRACE),
        "bundle.json": bundle_golden(bundle, out),
        "sandbox.json": sandbox_golden(bundle, out),
        "runtime.json": runtime_golden(bundle),
        "split.json": split_golden(),
        "tokenizer.json": tokenizer_golden(out),
    }
    for name, obj in parts.items():
        tmp = out / (name + ".tmp")
        tmp.write_text(json.dumps(obj, ensure_ascii=True))
        tmp.replace(out / name)
    (out / "golden.ok").write_text(json.dumps({k: (out / k).stat().st_size for k in parts}))
    print(f"golden vectors in {out}: {', '.join(parts)}")


if __name__ == "__main__":
    main()
