"""Throughput-vs-DRAM sweeps and the paper's two summary numbers (docs/method.md, headline of the paper):

* **DRAM reduction at equal throughput**: for a baseline point (D_b, tok/s_b), the smallest DRAM D_m at
  which the method's curve reaches tok/s_b (linear interpolation on the curve's running maximum);
  reduction = 1 − D_m / D_b. When the method already beats tok/s_b at the smallest swept DRAM, D_m is
  that DRAM and the reduction is a lower bound (``bound=True``).
* **Throughput gain at equal DRAM**: tok/s_m(D) / tok/s_b(D) − 1 at each swept D.

DRAM is the whole budget (non-MLP weights, KV cache and MLP caches), as on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dipdeploy.cache import POLICY_RECORDS, policy_of
from dipdeploy.sim.config import SimConfig
from dipdeploy.sim.devices import get_device
from dipdeploy.sim.memory import minimum_budget
from dipdeploy.sim.pattern import build_pattern
from dipdeploy.sim.precision import bytes_per_weight
from dipdeploy.sim.simulate import SimResult, resolve_shape, shape_only_pattern, simulate
from dipdeploy.trace import Trace


def auto_budgets(trace: Trace | None, cfg: SimConfig, steps: int) -> list[float]:
    """From the smallest budget that fits (non-MLP + KV) to the whole model in DRAM."""
    _, shape = resolve_shape(trace, cfg.model)
    bpw = bytes_per_weight(cfg.precision)
    lo = minimum_budget(shape, bpw, cfg.context, cfg.kv_bytes_per_value)
    hi = lo + shape.num_hidden_layers * shape.mlp_params_per_layer() * bpw
    return [lo + (hi - lo) * i / (steps - 1) for i in range(steps)]


def sweep(trace: Trace | None, cfgs: list[SimConfig], budgets: list[float], progress=None) -> list[SimResult]:
    """Every config at every budget, budget by budget. Patterns are built once; a replay is shared by
    the configs (devices, precisions) that give the same capacities, and dropped after its budget."""
    patterns: dict = {}
    devices: dict = {}
    rows = []
    for b in budgets:
        memo: dict = {}
        for cfg in cfgs:
            device = devices.setdefault(cfg.device, get_device(cfg.device))
            _, shape = resolve_shape(trace, cfg.model)
            key = ("dense", shape) if cfg.method == "dense" else (shape, cfg.seed)
            if key not in patterns:
                patterns[key] = (shape_only_pattern(shape) if cfg.method == "dense"
                                 else build_pattern(trace, shape, cfg.seed))
            rows.append(simulate(trace, replace(cfg, dram_budget=b), pattern=patterns[key], device=device, memo=memo))
            if progress is not None:
                progress()
    return rows


@dataclass
class Comparison:
    """One method vs the baseline at one baseline DRAM point."""

    dram_bytes: float
    base_tok_s: float
    tok_s: float
    gain: float  # tok/s at equal DRAM, relative
    dram_for_base_tok_s: float | None  # None: not reached within the sweep
    dram_reduction: float | None
    bound: bool


def _dram_to_reach(drams: np.ndarray, tps: np.ndarray, target: float) -> tuple[float | None, bool]:
    env = np.maximum.accumulate(tps)
    if env[0] >= target:
        return float(drams[0]), True
    if env[-1] < target:
        return None, False
    j = int(np.argmax(env >= target))
    t0, t1, d0, d1 = env[j - 1], env[j], drams[j - 1], drams[j]
    return float(d0 + (d1 - d0) * (target - t0) / (t1 - t0)) if t1 > t0 else float(d1), False


def compare(base: list[SimResult], method: list[SimResult], overlap: bool = False) -> list[Comparison]:
    """Per baseline point: the gain at equal DRAM and the DRAM reduction at equal throughput."""
    key = "tok_s_overlap" if overlap else "tok_s"
    base = sorted(base, key=lambda r: r.dram_bytes)
    method = sorted(method, key=lambda r: r.dram_bytes)
    md = np.array([r.dram_bytes for r in method])
    mt = np.array([getattr(r, key) for r in method])
    out = []
    for b in base:
        tp_b = getattr(b, key)
        tp_m = float(np.interp(b.dram_bytes, md, mt))
        d_m, bound = _dram_to_reach(md, mt, tp_b)
        out.append(Comparison(
            dram_bytes=b.dram_bytes, base_tok_s=tp_b, tok_s=tp_m, gain=tp_m / tp_b - 1.0,
            dram_for_base_tok_s=d_m, dram_reduction=None if d_m is None else 1.0 - d_m / b.dram_bytes, bound=bound))
    return out


def expand_variants(base: SimConfig, methods: list[str], policies: list[str], gammas: list[float]) -> list[SimConfig]:
    """The configs to compare: methods × policies (× γ for DIP-CA). ``dense`` runs once, as dense-static
    (with ``none`` too if asked); DIP-CA is not paired with Belady (its masks depend on the cache)."""
    out: list[SimConfig] = []
    for m in methods:
        if m == "dense":
            for p in [p.name for p in POLICY_RECORDS.values() if not p.updates and (p.pinned or p.name in policies)]:
                out.append(replace(base, method="dense", policy=p))
            continue
        for p in policies:
            if m == "dip-ca":
                if policy_of(p).needs_future:
                    continue
                out.extend(replace(base, method=m, policy=p, gamma=g) for g in gammas)
            else:
                out.append(replace(base, method=m, policy=p))
    if not out:
        raise ValueError("no configuration left to simulate (dip-ca + belady only?); add a policy such as lfu")
    return out
