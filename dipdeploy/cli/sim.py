"""CLI commands of the sim stage: ``dipdeploy simulate`` and ``dipdeploy devices``.

Parses, calls the simulator (dipdeploy.sim), presents. Defaults live in ``SimConfig`` only: an option
left unset here falls back to it.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import typer
from dipdeploy.cli._app import app
from dipdeploy.cli.core import check_inputs, console, fail, floats, kept, trace_room, write_json, write_output
from dipdeploy.cli.tables import table as make_table
from dipdeploy.limits import MAX_TOKENS, check_count
from dipdeploy.terminal import shown

_ERRORS = (ValueError, OSError, KeyError)
MAX_STEPS = 1000  # --steps: each point of a sweep is a whole simulation of every configuration


def _csv(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


@app.command("devices")
def devices_cmd(
    json_out: Path = typer.Option(None, "--json", help="Write the profiles to this JSON file (docs/json.md)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --json file."),
) -> None:
    """List the device profiles (dipdeploy/sim/devices/*.toml) with their Flash read-size curve."""
    from dipdeploy.sim.devices import CURVE_SIZES, list_devices

    try:
        check_inputs(outputs={"--json": json_out}, force=force)
        devices = list_devices()
    except _ERRORS as err:
        fail(err)
    table = make_table("name", "DRAM\nGB/s", "DRAM\nGB", "Flash\nGB/s", "µs/\nreq", "4 KiB", "64 KiB", "1 MiB",
                       "assumed", wrap=("assumed",))
    for d in devices:
        eff = [f"{d.flash.effective_bandwidth(s) / 1e9:.2f}" for s in CURVE_SIZES]
        table.add_row(shown(d.name), f"{d.dram_bandwidth / 1e9:g}", f"{d.dram_capacity / 1e9:g}",
                      f"{d.flash.seq_bandwidth / 1e9:g}", f"{d.flash.request_s * 1e6:.2f}", *eff,
                      shown(", ".join(d.assumptions) or "-"))
    console.print(table)
    for d in devices:  # a profile is a user's .toml too: its strings go through shown
        console.print(f"{shown(d.name)}: {shown(d.description)}")
    console.print("Flash GB/s: sequential read rate; µs/req: the cost of one request. Columns 4 KiB / 64 KiB / "
                  "1 MiB: effective GB/s at that request size (t = request cost + bytes / sequential bandwidth). "
                  "Sources: each profile's *_source fields.")
    kept(write_json({"devices": [d.as_dict() for d in devices]}, json_out, force, schema="devices"))


@app.command("simulate")
def simulate_cmd(
    trace: Path = typer.Option(None, "--trace", help="Trace file (.npz) from `dipdeploy trace` or the runtime's --trace. "
                               "Not needed for --method dense."),
    device: str = typer.Option(None, "--device", help="Device profile name (see `dipdeploy devices`) or a .toml path."),
    model: str = typer.Option(None, "--model", "-m", help="Registry model whose shape to simulate (default: the trace's). "
                              "A larger model than the trace's is an extrapolation."),
    dram: str = typer.Option(None, "--dram", help="DRAM budget, e.g. 4GB or 3.5GiB (default: half the device's DRAM)."),
    sweep_dram: str = typer.Option(None, "--sweep-dram", help="Sweep the budget: A..B (e.g. 2GB..8GB) or 'auto' "
                                   "(smallest that fits .. whole model)."),
    steps: int = typer.Option(9, "--steps", help="Points of --sweep-dram."),
    precision: str = typer.Option(None, "--precision", help="fp32, fp16, bq4 (4.25 b), bq4-b32 (4.5 b), vq3 (≈3.13 b), rtn3… (quant presets)."),
    method: str = typer.Option(None, "--method", help="Comma list of: traced (as recorded), dense, dip, dip-ca."),
    policy: str = typer.Option(None, "--policy", help="Comma list of cache policies: none, lru, lfu, belady, static."),
    gamma: str = typer.Option(None, "--gamma", help="Comma list of DIP-CA γ values in [0, 1]."),
    gamma_warmup: int = typer.Option(None, "--gamma-warmup", help="DIP-CA: tokens over which γ falls from 1."),
    fixed_top_n: int = typer.Option(None, "--fixed-top-n", help="DIP-CA: the n largest |x| are never re-weighted."),
    context: int = typer.Option(None, "--context", help="KV-cache tokens placed in DRAM and read per token."),
    warmup: int = typer.Option(None, "--warmup", help="First trace tokens replayed but not measured."),
    cold: bool = typer.Option(False, "--cold", help="Start dynamic caches empty instead of preloaded with the "
                              "most used rows of the warm-up tokens."),
    cache_split: str = typer.Option(None, "--cache-split", help="How the MLP caches' bytes are shared between the "
                                    "groups: reads (the group whose misses cost the device more per byte first) or "
                                    "even (the same share of each group's rows), as `run --cache-split` (default "
                                    "even, the paper's)."),
    io_gap: int = typer.Option(None, "--io-gap", help="On a device with a read unit, model the runtime's reads: "
                               "read through gaps of up to N blocks and cut requests at 128 KiB, as `run --io-gap` "
                               "(default 0: touching blocks coalesce only)."),
    tokens: int = typer.Option(None, "--tokens", help="Use only the first N trace tokens (quick runs)."),
    overlap: bool = typer.Option(False, "--overlap", help="Plot and compare the overlapped variant max(DRAM, Flash)."),
    plot: Path = typer.Option(None, "--plot", help="Write the tokens/s-vs-DRAM curves to this PNG."),
    json_out: Path = typer.Option(None, "--json", help="Write the result rows to this JSON file."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing --json/--plot outputs."),
) -> None:
    """Project a trace onto a device profile: tokens/s, DRAM and Flash bytes per token, hit rate, memory."""
    from dipdeploy.cache import policy_of
    from dipdeploy.progress import Progress
    from dipdeploy.sim import SimConfig
    from dipdeploy.sim.devices import get_device
    from dipdeploy.sim.plot import label, plot_curves
    from dipdeploy.sim.report import to_json, write_json
    from dipdeploy.sim.sweep import auto_budgets, compare, expand_variants, resolve_shape, sweep
    from dipdeploy.sim.units import parse_range, parse_size
    from dipdeploy.trace import Trace

    try:
        check_inputs(files={"--trace": trace}, outputs={"--json": json_out, "--plot": plot}, force=force)
        if dram and sweep_dram:
            raise ValueError("give --dram or --sweep-dram, not both")
        if steps < 2 and sweep_dram:
            raise ValueError(f"--steps {steps}: a sweep needs at least 2 points")
        if steps > MAX_STEPS:
            raise ValueError(f"--steps {steps} is over the cap of {MAX_STEPS} points; give {MAX_STEPS} or less")
        if tokens is not None and tokens < 1:
            raise ValueError(f"--tokens {tokens}: give at least 1 token (or leave --tokens out for all)")
        if tokens is not None:
            check_count(tokens, "--tokens", 1, MAX_TOKENS, "tokens")
        given = {"device": device, "model": model, "precision": precision, "context": context, "warmup": warmup,
                 "preload": False if cold else None, "gamma_warmup": gamma_warmup, "fixed_top_n": fixed_top_n,
                 "cache_split": cache_split, "io_gap": io_gap}
        base = SimConfig(**{k: v for k, v in given.items() if v is not None})
        defaults = {f.name: f.default for f in fields(SimConfig)}
        methods = _csv(method) or [base.method]
        policies = _csv(policy) or [base.policy]
        gammas = floats(gamma, "--gamma") if gamma is not None else [defaults["gamma"]]
        tr = Trace.load(trace, max_bytes=trace_room()) if trace is not None else None
        if tr is not None and tokens:
            tr = tr.head(tokens)
        cfgs = expand_variants(base, methods, policies, gammas)
        if sweep_dram:
            budgets = auto_budgets(tr, base, steps) if sweep_dram == "auto" else parse_range(sweep_dram, steps)
        else:
            budgets = [parse_size(dram)] if dram else [None]
        for c in cfgs:  # unknown devices and models are refused before the stage starts
            get_device(c.device)
            resolve_shape(tr, c.model)
        with Progress().stage(f"simulate {len(cfgs)} configuration(s) × {len(budgets)} budget(s)",
                              total=len(cfgs) * len(budgets)) as stage:
            if budgets == [None]:
                from dipdeploy.sim.simulate import simulate

                rows = []
                for c in cfgs:
                    rows.append(simulate(tr, c))
                    stage.advance()
            else:
                rows = sweep(tr, cfgs, budgets, progress=stage.advance)
    except _ERRORS as err:
        fail(err)

    # device and model go to the title when every row shares them (the usual case): 80 columns suffice
    shared = {k: {getattr(r, k) for r in rows} for k in ("device", "model")}
    lead = [k for k, v in shared.items() if len(v) > 1]
    title = " · ".join(shown(next(iter(v))) for k, v in shared.items() if len(v) == 1) or None
    table = make_table(*lead, "method /\npolicy", "DRAM\nGB", "tok/s", "tok/s\novl", "DRAM\nGB/tok",
                       "Flash\nMB/tok", "req/\ntok", "hit\nrate", "ρ", title=title,
                       wrap=(*lead, "method /\npolicy"))
    for r in rows:
        table.add_row(*[shown(getattr(r, k)) for k in lead], shown(label(r)), f"{r.dram_bytes / 1e9:.3f}", f"{r.tok_s:.3f}",
                      f"{r.tok_s_overlap:.3f}", f"{r.dram_bytes_per_token / 1e9:.3f}",
                      f"{r.flash_bytes_per_token / 1e6:.1f}", f"{r.flash_requests_per_token:.0f}",
                      f"{r.hit_rate:.3f}", f"{r.density:.3f}")
    console.print(table)
    mem = rows[-1].memory
    console.print(f"memory (last row): non-MLP {mem['non_mlp'] / 1e9:.3f} GB, KV {mem['kv_cache'] / 1e9:.3f} GB, "
                  f"MLP caches {mem['mlp_cache'] / 1e9:.3f} GB of {mem['mlp_total'] / 1e9:.3f} GB "
                  f"(f = {mem['cache_fraction']:.3f} of each layer's rows)")
    if tr is not None and tr.hits_in is not None:
        hits = sum(int(h.sum()) for h in tr.hits_in + tr.hits_glu)
        total = sum(h.size for h in tr.hits_in + tr.hits_glu)
        console.print(f"hit rate recorded in the trace ({shown(tr.source)}, policy {shown(tr.policy)}): "
                      f"{hits / total:.3f}")
    notes = {r.extrapolation for r in rows if r.extrapolation}
    for note in notes:
        console.print(f"[yellow]{shown(note)}[/yellow]")

    dense = [r for r in rows if r.method == "dense" and policy_of(r.policy).pinned]
    if sweep_dram and dense:
        others: dict[str, list] = {}
        for r in rows:
            if r.method != "dense":
                others.setdefault(label(r), []).append(r)
        summary = make_table("vs dense-static", "DRAM\nGB", "dense\ntok/s", "tok/s", "gain at\nequal DRAM",
                             "DRAM GB for\ndense tok/s", "DRAM\nreduction", wrap=("vs dense-static",))
        for name, rs in others.items():
            for c in compare(dense, rs, overlap=overlap):
                red = "-" if c.dram_reduction is None else f"{'≥' if c.bound else ''}{100 * c.dram_reduction:.0f} %"
                need = "-" if c.dram_for_base_tok_s is None else f"{c.dram_for_base_tok_s / 1e9:.2f}"
                summary.add_row(shown(name), f"{c.dram_bytes / 1e9:.2f}", f"{c.base_tok_s:.3f}", f"{c.tok_s:.3f}",
                                f"{100 * c.gain:+.0f} %", need, red)
        if summary.row_count:
            console.print(summary)
    text = to_json([r.row() for r in rows])  # what sim.report.write_json writes
    title = f"{rows[0].model} on {rows[0].device}, {rows[0].precision}"
    kept(write_output(lambda p, f: write_json([r.row() for r in rows], p, force=f), json_out, force, "--json",
                      text=text),
         write_output(lambda p, f: plot_curves(rows, p, title=title, overlap=overlap, force=f), plot, force,
                      "--plot"))
