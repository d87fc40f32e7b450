"""The simulator's stage function: a trace (or only a shape, for dense) + a device + a ``SimConfig`` →
tokens/s, DRAM and Flash bytes per token, hit rate and the memory breakdown.

Cost per token (docs/method.md, "The HW simulator"; compute is ignored — decoding is memory-bound):

    dram_bytes  = non-MLP weights read + KV cache read + Σ_layers (K_in·row_in + K_glu·row_glu)
    flash_bytes = Σ_layers blocks touched by the missed rows × read unit   (= missed·row bytes when the
                  device has no read granularity, as in the paper; see dipdeploy/flash.py)
    t_serial    = dram_bytes / DRAM_BW + requests · request_s + flash_bytes / Flash_BW
    t_overlap   = max(dram_bytes / DRAM_BW, Flash time)           (ours: Flash reads hidden behind compute)
    tokens/s    = 1 / mean_t(t)

Every weight a token uses is read from DRAM, including rows just loaded from Flash. Row bytes:
input-feature row = 2F weights, GLU row = d weights, times the precision's bytes per weight.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from dipdeploy.registry import ModelShape, get_model, is_registered
from dipdeploy.sim.config import SimConfig
from dipdeploy.sim.devices import DeviceProfile, get_device
from dipdeploy.sim.memory import MemoryPlan, plan_memory
from dipdeploy.sim.pattern import AccessPattern, build_pattern
from dipdeploy.sim.precision import bytes_per_weight
from dipdeploy.sim.replay import ReplayCounts, replay
from dipdeploy.trace import Trace


@dataclass
class SimResult:
    """One simulated configuration (the ``--json`` row)."""

    device: str
    model: str
    trace_model: str | None
    method: str
    policy: str
    gamma: float | None
    precision: str
    dram_bytes: float  # the DRAM budget
    tok_s: float
    tok_s_overlap: float
    dram_bytes_per_token: float
    flash_bytes_per_token: float
    flash_requests_per_token: float
    hit_rate: float
    density: float
    tokens: int
    extrapolated: bool
    extrapolation: str | None
    memory: dict = field(default_factory=dict)

    def row(self) -> dict:
        return asdict(self)


def resolve_shape(trace: Trace | None, model: str | None) -> tuple[str, ModelShape]:
    """The target shape: ``model`` from the registry, else the trace's own model."""
    name = model or (trace.model if trace is not None else None)
    if name is None:
        raise ValueError("no model shape: pass --model NAME (registry) or a --trace")
    if not is_registered(name):
        raise ValueError(f"model {name!r} is not in the registry (`dipdeploy models`), so its non-MLP size is "
                         f"unknown; pass --model with a registered name whose shape to simulate")
    return name, get_model(name).shape


def shape_only_pattern(shape: ModelShape) -> AccessPattern:
    """What ``dense`` needs when there is no trace: the widths and the layer count."""
    return AccessPattern(rows_in=shape.hidden_size, rows_glu=shape.intermediate_size,
                         num_layers=shape.num_hidden_layers, sel_in=[], sel_glu=[],
                         weights=np.ones(shape.num_hidden_layers), source_layers=[])


def cost(counts: ReplayCounts, plan: MemoryPlan, device: DeviceProfile, io_gap: int = 0) -> dict:
    """Per-token bytes and times from replay counts (module docstring); ``io_gap`` > 0 models the runtime's
    reads (``SimConfig.io_gap``)."""
    from dipdeploy.flash import MAX_REQUEST

    kv_read = plan.kv_bytes
    dram = (plan.non_mlp_read_bytes + kv_read + counts.inp.selected * plan.row_bytes_in
            + counts.glu.selected * plan.row_bytes_glu)
    unit = device.flash.read_unit
    cut = MAX_REQUEST if io_gap > 0 else 0
    bytes_in, req_in = counts.inp.reads(plan.row_bytes_in, unit, io_gap, cut)
    bytes_glu, req_glu = counts.glu.reads(plan.row_bytes_glu, unit, io_gap, cut)
    flash, requests = bytes_in + bytes_glu, req_in + req_glu
    t_dram = dram / device.dram_bandwidth
    t_flash = device.flash.read_time(requests, flash)
    return {
        "tok_s": 1.0 / float(np.mean(t_dram + t_flash)),
        "tok_s_overlap": 1.0 / float(np.mean(np.maximum(t_dram, t_flash))),
        "dram_bytes_per_token": float(np.mean(dram)),
        "flash_bytes_per_token": float(np.mean(flash)),
        "flash_requests_per_token": float(np.mean(requests)),
        "t_dram_s": float(np.mean(t_dram)),
        "t_flash_s": float(np.mean(t_flash)),
    }


def default_budget(device: DeviceProfile) -> float:
    """Half the device's DRAM (assumption: the OS and other apps keep the rest)."""
    return device.dram_capacity / 2


def simulate(trace: Trace | None, cfg: SimConfig, pattern: AccessPattern | None = None,
             device: DeviceProfile | None = None, memo: dict | None = None) -> SimResult:
    """Simulate one configuration. ``pattern`` reuses a (projected) access pattern; ``memo`` (a dict the
    caller keeps) reuses replay counts across devices and precisions that give the same capacities."""
    device = device or get_device(cfg.device)
    name, shape = resolve_shape(trace, cfg.model)
    if trace is None and cfg.method != "dense":
        raise ValueError(f"method {cfg.method!r} needs a --trace; only 'dense' runs from the shape alone")
    if pattern is None:
        pattern = shape_only_pattern(shape) if cfg.method == "dense" else build_pattern(trace, shape, cfg.seed)
    bpw = bytes_per_weight(cfg.precision)
    budget = cfg.dram_budget if cfg.dram_budget is not None else default_budget(device)
    k = (0.0, 0.0)
    if cfg.cache_split == "reads":  # rows selected per token and layer, the worth of a cached row
        k = tuple(float(np.mean([s.shape[1] for s in sel])) for sel in (pattern.sel_in, pattern.sel_glu))
    plan = plan_memory(shape, budget, bpw, cfg.context, cfg.kv_bytes_per_value, cfg.cache_split, k, device.flash)
    key = (id(pattern), plan.capacity_in, plan.capacity_glu, cfg.method, cfg.policy, cfg.gamma,
           cfg.gamma_warmup, cfg.fixed_top_n, cfg.warmup, cfg.preload)
    counts = memo.get(key) if memo is not None else None
    if counts is None:
        counts = replay(pattern, plan.capacity_in, plan.capacity_glu, cfg)
        if memo is not None:
            memo[key] = counts
    c = cost(counts, plan, device, cfg.io_gap)
    return SimResult(
        device=device.name, model=name, trace_model=trace.model if trace is not None else None,
        method=cfg.method if cfg.method != "traced" else f"traced:{trace.method}",
        policy=cfg.policy, gamma=cfg.gamma if cfg.method == "dip-ca" else None, precision=cfg.precision,
        dram_bytes=budget, tok_s=c["tok_s"], tok_s_overlap=c["tok_s_overlap"],
        dram_bytes_per_token=c["dram_bytes_per_token"], flash_bytes_per_token=c["flash_bytes_per_token"],
        flash_requests_per_token=c["flash_requests_per_token"], hit_rate=counts.hit_rate,
        density=1.0 if cfg.method == "dense" else pattern.density(), tokens=counts.tokens,
        extrapolated=pattern.extrapolation is not None and cfg.method != "dense",
        extrapolation=pattern.extrapolation if cfg.method != "dense" else None,
        memory={**plan.breakdown(), "t_dram_s": c["t_dram_s"], "t_flash_s": c["t_flash_s"]},
    )
