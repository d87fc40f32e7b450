"""Mistral-7B at its real scale on this machine: a random checkpoint of its shapes, a streamed DIP-CA BQ4
export WITH calibration, then `dipdeploy run` under cgroup v1 memory limits and `dipdeploy simulate` on
the run's own trace (README, "Models larger than memory").

Every stage is the CLI in a child process, timed, with the child's peak RSS and blocks read from
``wait4``'s rusage (``ru_maxrss``, ``ru_inblock``):

1. ``scripts/random_checkpoint.py`` writes the checkpoint (bf16 safetensors shards, Mistral-7B-v0.1's
   config; ``--quick``: ``--layers 2``, a 2-layer cut of the same shapes).
2. ``dipdeploy export --stream --method dip-ca --quant bq4`` without ``--plan``/``--rho-in``: the split is
   calibrated layer by layer (``dipdeploy/sparsity/streamed.py``) on WikiText-2 validation, then each
   layer is read, quantised and written; the stage times are the export's own (``--json`` ``steps_s``).
3. ``dipdeploy run`` (``--io direct --cold``: every row the caches miss is read from the device) in a
   fresh memory group limited to 4 GB and to 2 GB (page cache counted, as v1 does), with ``--dram-budget``
   the limit less :data:`HEADROOM_SHARE` of it for the interpreter and ORT; decode tok/s, the MB read from the device
   per decode token (the store's count of O_DIRECT blocks) and the group's peak.
4. ``dipdeploy simulate --trace`` of the 4 GB run (``--model mistral-7b``: the trace's layers projected
   onto the full model's shape when the run was a cut).

The weights are random: no accuracy figure applies, and DIP-CA's hit rates on random activations are not
a trained model's. The checkpoint is deleted afterwards unless ``--keep``.

    python benchmarks/scale.py --quick          # 2 layers: ~3 GB on disk, minutes
    python benchmarks/scale.py                  # 32 layers: 14.5 GB checkpoint + the bundle under build/scale
    python benchmarks/scale.py --bundle DIR     # steps 3-4 only, on a bundle step 2 wrote → scale-runs.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import lscpu, machine, md_table, memory_group, write_rows_json

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The history of the city begins in the early"
TOKENS = 8
LIMITS_GB = (4, 2)
SIM_DRAM, SIM_STEPS = "1GB..4GB", 4  # the simulated phone's DRAM budgets (a18 profile)
RUN_COLS = ["limit_gb", "dram_budget", "rc", "decode_tok_s", "device_mb_per_token", "wanted_mb_per_token",
            "hit_rate", "peak_rss_mb", "group_peak_mb", "failcnt", "read_mb", "seconds"]
HEADROOM_SHARE = 0.25  # of a run's limit left to the interpreter, onnxruntime and the page cache
NOTE = ("**Random weights** (`scripts/random_checkpoint.py`): no accuracy figure applies; only shapes, bytes, "
        "memory and time carry over.")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from dipdeploy.cli import app; app()", *args]


def child(argv: list[str], log: Path, preexec=None, timeout: float | None = None) -> dict:
    """Run ``argv``; its wall seconds, exit code, peak RSS and bytes read from storage (its rusage)."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "w") as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, preexec_fn=preexec)
        deadline = None if timeout is None else time.time() + timeout
        progress, last = log.with_suffix(".progress"), 0.0
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if deadline and time.time() > deadline:
                p.kill()
            if time.perf_counter() - last > 10:  # a run stopped before its end still says how far it got
                last = time.perf_counter()
                progress.write_text(f"{last - t0:.0f} s, VmHWM {_hwm(p.pid)} kB\n")
            time.sleep(0.2)
    p.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": p.returncode, "seconds": round(time.perf_counter() - t0, 1),
            "peak_rss_mb": usage.ru_maxrss / 1e3, "read_mb": usage.ru_inblock * 512 / 1e6,
            "tail": log.read_text()[-600:] if p.returncode else ""}


def _hwm(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def file_kind(name: str) -> str:
    if name in ("mlp.bin", "dense.bin", "model.onnx"):
        return name
    if name.startswith("layer."):
        return "layer.{i}.*.onnx (per-layer graphs)"
    if name.endswith(".onnx"):
        return "embed.onnx + head.onnx"
    if name.endswith(".so"):
        return "libdipdeploy_ops.so"
    return "tokenizer + configs + manifest"


def checkpoint(work: Path, layers: int | None) -> tuple[Path, dict]:
    out = work / "checkpoint"
    argv = [sys.executable, str(ROOT / "scripts/random_checkpoint.py"), "--out", str(out), "--force",
            "--json", str(work / "checkpoint.json")] + (["--layers", str(layers)] if layers else [])
    res = child(argv, work / "checkpoint.log")
    if res["rc"]:
        raise SystemExit(f"random_checkpoint.py failed: {res['tail']}")
    return out, {**res, "bytes": du(out)}


def export(work: Path, ckpt: Path, data_dir: str) -> tuple[Path, dict]:
    bundle, js = work / "bundle", work / "export.json"
    argv = cli("export", "--model", str(ckpt), "--method", "dip-ca", "--quant", "bq4", "--stream", "--out", str(bundle),
               "--json", str(js), "--force", "--data-dir", data_dir)
    res = child(argv, work / "export.log")
    if res["rc"]:
        raise SystemExit(f"export failed: {res['tail']}")
    summary = json.loads(js.read_text())
    manifest = json.loads((bundle / "manifest.json").read_text())
    sizes: dict[str, int] = {}
    for name, rec in manifest["files"].items():
        sizes[file_kind(name)] = sizes.get(file_kind(name), 0) + rec["size"]
    sizes["manifest.json"] = (bundle / "manifest.json").stat().st_size
    plan = manifest["plan"]
    return bundle, {**res, "steps_s": summary["steps_s"], "bundle_bytes": du(bundle), "sizes": sizes,
                    "split_nll": plan["calibration"].get("split_nll"), "rho_in": plan.get("rho_in"),
                    "k": (plan["layers"][0]["k_in"], plan["layers"][0]["k_glu"])}


def run(work: Path, bundle: Path, limit_gb: int) -> dict:
    limit = int(limit_gb * 1e9)
    js, trace = work / f"run-{limit_gb}g.json", work / f"trace-{limit_gb}g.npz"
    argv = cli("run", str(bundle), "-p", PROMPT, "-n", str(TOKENS), "--io", "direct", "--cold",
               "--dram-budget", f"{limit * (1 - HEADROOM_SHARE) / 1e9:g}GB", "--json", str(js), "--trace", str(trace), "--force")
    with memory_group("dipdeploy-scale", limit) as (group, enter):
        res = child(argv, work / f"run-{limit_gb}g.log", preexec=enter, timeout=1800)
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        fails = int((group / "memory.failcnt").read_text())
    row = {"limit_gb": limit_gb, "dram_budget": argv[argv.index("--dram-budget") + 1], **res,
           "group_peak_mb": peak / 1e6, "failcnt": fails}
    if res["rc"] == 0:
        s = json.loads(js.read_text())
        row.update(decode_tok_s=s["decode_tok_s"], device_mb_per_token=s["flash_device_mb_per_token"],
                   wanted_mb_per_token=s["flash_mb_per_token"], hit_rate=s["hit_rate"],
                   text=s["text"], trace=str(trace))
    return row


def simulate(work: Path, trace: str) -> list[dict] | dict:
    js = work / "simulate.json"
    res = child(cli("simulate", "--trace", trace, "--model", "mistral-7b", "--sweep-dram", SIM_DRAM, "--steps",
                    str(SIM_STEPS), "--json", str(js), "--force"), work / "simulate.log")
    if res["rc"]:
        return {"error": res["tail"][-300:]}
    from dipdeploy.jsonout import read

    return read(json.loads(js.read_text()), "simulate", js)["rows"]


def _run_rows(r: dict) -> tuple[list[dict], list[str], dict | list, list[dict]]:
    """The runs' table rows, their error lines, the simulation's result and its table rows."""
    runs = [{**x, "read_mb": round(x["read_mb"], 1)} for x in r["runs"]]
    errors = [f"- {x['limit_gb']} GB: exit {x['rc']}: `{x['tail'].strip().splitlines()[-1][:300]}`"
              for x in r["runs"] if x["rc"]]
    sim = r.get("simulate") or {}
    sim_rows = [{**x, "dram_gb": x["dram_bytes"] / 1e9, "flash_mb_per_token": x["flash_bytes_per_token"] / 1e6,
                 "dram_mb_per_token": x["dram_bytes_per_token"] / 1e6} for x in (sim if isinstance(sim, list) else [])]
    return runs, errors, sim, sim_rows


def report(r: dict, quick: bool) -> str:
    c, e = r["checkpoint"], r["export"]
    stage_rows = [{"stage": "write random checkpoint (scripts/random_checkpoint.py)", "seconds": c["seconds"],
                   "peak_rss_mb": c["peak_rss_mb"], "note": f"{c['bytes'] / 1e9:.2f} GB on disk"},
                  {"stage": "export --stream (whole command)", "seconds": e["seconds"],
                   "peak_rss_mb": e["peak_rss_mb"],
                   "note": f"read {e['read_mb'] / 1e3:.2f} GB from storage; bundle {e['bundle_bytes'] / 1e9:.2f} GB"}]
    stage_rows += [{"stage": f"  export step: {k}", "seconds": v} for k, v in e["steps_s"].items()]
    size_rows = [{"file": k, "MB": v / 1e6} for k, v in sorted(e["sizes"].items(), key=lambda kv: -kv[1])]
    runs, errors, sim, sim_rows = _run_rows(r)
    sim_cols = ["device", "model", "method", "policy", "dram_gb", "tok_s", "flash_mb_per_token", "dram_mb_per_token",
                "hit_rate"]
    sim_note = sorted({x.get("extrapolation") or "" for x in sim_rows} - {""})
    layers = "2-layer cut (`--layers 2`)" if quick else "all 32 layers"
    lines = [
        f"# Mistral-7B shapes, streamed export with calibration (benchmarks/scale.py{' --quick' if quick else ''})", "",
        NOTE, "",
        f"- model: random Mistral-7B-v0.1-shaped checkpoint, {layers}; `dipdeploy export --stream --method dip-ca "
        f"--quant bq4` with calibration (no `--plan`/`--rho-in`: split searched on WikiText-2 validation, "
        f"4 windows × 512 tokens, layer by layer); chose ρ_in {e['rho_in']} (K_in/K_glu {e['k'][0]}/{e['k'][1]}); "
        f"split NLL {e['split_nll']} (random weights: the NLLs are near log(vocab) and the choice means nothing)",
        f"- machine: {r['machine']}; lscpu: {r['lscpu']}; load (1 min) before {r['load_before']}, after {r['load_after']}",
        f"- disk: {r['disk_before']} free before, {r['disk_after']} after (checkpoint {'kept' if r['kept'] else 'deleted'})",
        "", "## Stages", "", md_table(stage_rows, ["stage", "seconds", "peak_rss_mb", "note"]), "",
        "Peak RSS: the child's `ru_maxrss` (wait4). Export steps: the export's own `steps_s`.", "",
        "## Bundle size per file kind", "", md_table(size_rows, ["file", "MB"]), "",
        f"## `dipdeploy run` under cgroup v1 memory limits ({TOKENS} greedy tokens, `--io direct --cold`)", "",
        NOTE, "", md_table(runs, RUN_COLS), "",
        f"`device_mb_per_token`: the MB the store read from the device per decode token (O_DIRECT blocks); "
        f"`wanted_mb_per_token`: the rows' bytes the caches asked for; `group_peak_mb`: the memory group's "
        f"`memory.max_usage_in_bytes` (page cache included); `read_mb`: the whole process's `ru_inblock` "
        f"(load included). `--dram-budget` = the limit less {HEADROOM_SHARE:.0%} of it."
        + (f" On this cut `mlp.bin` ({e['sizes'].get('mlp.bin', 0) / 1e6:.0f} MB) fits in either budget: the runs "
           f"measure the dense part and the engine, not the limits' pressure on the row caches (that needs "
           f"the 32 layers, {32 * e['sizes'].get('mlp.bin', 0) / 2 / 1e9:.1f} GB of rows)." if quick else ""),
        *([""] + errors if errors else []), "",
        f"## `dipdeploy simulate` on the 4 GB run's trace (`--sweep-dram {SIM_DRAM} --steps {SIM_STEPS}`)", "", NOTE, "",
        (md_table(sim_rows, sim_cols) if sim_rows else f"not run: {sim.get('error', 'no trace')}"), "",
        *[f"- {n}" for n in sim_note], "",
    ]
    return "\n".join(lines)


def runs_report(r: dict) -> str:
    """``--bundle``: the runs and the simulation on an exported bundle, stages 1-2 not repeated."""
    runs, errors, sim, sim_rows = _run_rows(r)
    return "\n".join([
        "# Mistral-7B shapes: `dipdeploy run` under cgroup v1 limits and `simulate` on its trace "
        "(benchmarks/scale.py --bundle)", "", NOTE, "",
        f"- bundle: `{r['bundle']}` (ρ_in {r['rho_in']}, K_in/K_glu {r['k'][0]}/{r['k'][1]}; its export: scale.md)",
        f"- code: commit {r['commit']}; machine: {r['machine']}; lscpu: {r['lscpu']}; load (1 min) before "
        f"{r['load_before']}, after {r['load_after']}", "",
        f"## `dipdeploy run` ({TOKENS} greedy tokens, `--io direct --cold`)", "", md_table(runs, RUN_COLS), "",
        f"`--dram-budget` = the limit less {HEADROOM_SHARE:.0%} of it. `peak_rss_mb`: the child's `ru_maxrss`, which "
        f"counts the shared staging pages once per slab that maps them (README, \"The host runtime\"); "
        f"`group_peak_mb`: the memory group's `memory.max_usage_in_bytes` (page cache included), which counts "
        f"them once; `device_mb_per_token`: MB read from the device per decode token (O_DIRECT blocks); "
        f"`wanted_mb_per_token`: the rows' bytes the caches asked for; `read_mb`: the process's `ru_inblock`.",
        *([""] + errors if errors else []), "",
        f"## `dipdeploy simulate` on the {r['runs'][0]['limit_gb']} GB run's trace "
        f"(`--sweep-dram {SIM_DRAM} --steps {SIM_STEPS}`)", "",
        (md_table(sim_rows, ["device", "model", "method", "policy", "dram_gb", "tok_s", "flash_mb_per_token",
                             "dram_mb_per_token", "hit_rate"]) if sim_rows else f"not run: {sim.get('error', 'no trace')}"),
        ""])


def runs_and_simulate(work: Path, bundle: Path, r: dict) -> None:
    """Steps 3-4 into ``r``: a run under each of :data:`LIMITS_GB`, then simulate on the first trace."""
    r["runs"] = []
    for gb in LIMITS_GB:
        print(f"run under {gb} GB …", flush=True)
        r["runs"].append(run(work, bundle, gb))
        x = r["runs"][-1]
        print(f"  rc {x['rc']}, {x.get('decode_tok_s')} tok/s, {x.get('device_mb_per_token')} MB/token", flush=True)
    traced = [x["trace"] for x in r["runs"] if x.get("trace")]
    r["simulate"] = simulate(work, traced[0]) if traced else {"error": "no run finished"}


def runs_only(bundle: Path, json_out: str | None) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    plan = manifest["plan"]
    work = bundle.parent
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    r = {"bundle": str(bundle), "rho_in": plan.get("rho_in"), "k": (plan["layers"][0]["k_in"], plan["layers"][0]["k_glu"]),
         "commit": commit, "machine": machine(), "lscpu": lscpu(), "load_before": round(os.getloadavg()[0], 2)}
    runs_and_simulate(work, bundle, r)
    r["load_after"] = round(os.getloadavg()[0], 2)
    write_rows_json([r], json_out)
    (RESULTS / "scale-runs.md").write_text(runs_report(r))
    print(f"wrote {RESULTS / 'scale-runs.md'}")


def disk_free(path: Path) -> str:
    return f"{shutil.disk_usage(path).free / 1e9:.1f} GB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a 2-layer cut of the same shapes")
    ap.add_argument("--json", help="write the measurements as JSON")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "scale", help="checkpoint and bundle go here")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint afterwards")
    ap.add_argument("--render", action="store_true", help="re-run only simulate on the kept trace and rewrite the "
                    "table from --json (the stages before are not repeated)")
    ap.add_argument("--bundle", type=Path, help="an exported bundle: only the runs and simulate (steps 3-4), "
                    "to benchmarks/results/scale-runs.md")
    args = ap.parse_args()
    if args.bundle:
        if not (args.bundle / "manifest.json").is_file():
            ap.error(f"{args.bundle} holds no manifest.json; give a bundle `dipdeploy export` wrote")
        runs_only(args.bundle, args.json)
        return
    name = "scale" + ("-quick" if args.quick else "")
    if args.render:
        r = json.loads(Path(args.json).read_text())[0]
        traced = [x["trace"] for x in r["runs"] if x.get("trace")]
        if traced:
            r["simulate"] = simulate(Path(traced[0]).parent, traced[0])
        write_rows_json([r], args.json)
        (RESULTS / f"{name}.md").write_text(report(r, args.quick))
        return
    data_dir = os.environ.get("DIPDEPLOY_DATA")
    if not data_dir:
        ap.error("set DIPDEPLOY_DATA to the folder holding wikitext-2-raw/ (calibration text)")
    work = args.work / ("quick" if args.quick else "full")
    work.mkdir(parents=True, exist_ok=True)
    r = {"machine": machine(), "lscpu": lscpu(), "load_before": round(os.getloadavg()[0], 2),
         "disk_before": disk_free(work)}
    print("writing the checkpoint …", flush=True)
    ckpt, r["checkpoint"] = checkpoint(work, 2 if args.quick else None)
    print(f"  {r['checkpoint']['seconds']} s; exporting (streamed, calibrated) …", flush=True)
    bundle, r["export"] = export(work, ckpt, data_dir)
    print(f"  {r['export']['seconds']} s, peak RSS {r['export']['peak_rss_mb']:.0f} MB", flush=True)
    if not args.keep:
        shutil.rmtree(ckpt)
    r["kept"] = args.keep
    runs_and_simulate(work, bundle, r)
    r["load_after"], r["disk_after"] = round(os.getloadavg()[0], 2), disk_free(work)
    write_rows_json([r], args.json)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(report(r, args.quick))
    print(f"wrote {RESULTS / (name + '.md')}")


if __name__ == "__main__":
    main()
