"""What a run measured: throughput, cache hits, Flash and DRAM traffic, residency and a time breakdown.

"Prefill" is the prompt: one batch per layer (``--prefill batch``) or token by token as decode
(``--prefill token``), as ``prefill`` says; its Flash bytes are the prompt's. Per-token figures of
the decode phase divide by the decode *steps* (generated tokens fed back: n_new − 1), the tokens/s
convention of llama.cpp's eval timings. Torch-free.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np

from dipdeploy.flash import BLOCK


class Timer:
    """Accumulated wall time per named phase: ``with timer(name)`` around a phase, or ``start`` then
    ``lap(name)`` after each phase (one clock read per phase, for the per-layer decode loop)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._last = 0.0

    def start(self) -> None:
        self._last = time.perf_counter()

    def lap(self, name: str) -> float:
        """The time since ``start`` or the previous lap goes to ``name``; returns it."""
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        self.seconds[name] += elapsed
        return elapsed

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0


def memory_now() -> dict:
    """This process's resident memory from /proc in bytes ({} elsewhere): VmRSS, VmHWM, RssAnon, RssFile,
    RssShmem, and Pss, which counts a page mapped several times once (the shared staging,
    ``dipdeploy.runtime.staging``, is mapped by every slab; VmRSS counts it once per mapping)."""
    return {**proc_fields("/proc/self/status", ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")),
            **proc_fields("/proc/self/smaps_rollup", ("Pss",))}


def proc_fields(path: str, keys: tuple[str, ...]) -> dict:
    """The ``keys`` of a /proc file of ``Key: N kB`` lines, in bytes ({} where it cannot be read)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


@dataclass
class RunStats:
    prompt_tokens: int
    new_tokens: int
    prefill_s: float
    decode_s: float
    prefill_tok_s: float
    decode_tok_s: float
    hit_rate: float
    hit_rate_in: float
    hit_rate_glu: float
    layer_hit_rate: list[float]
    flash_mb_per_token: float
    flash_requests_per_token: float
    flash_device_mb_per_token: float | None  # --io direct: the blocks read from the device; else None
    flash_block_mb_per_token: float  # the whole 4 KiB blocks the reads covered (FlashCounters.block_bytes)
    flash_block_requests_per_token: float  # ... in the requests a device serves them in (FlashCounters.block_requests)
    dram_mb_per_token: float
    resident: dict
    memory: dict
    seconds: dict
    flash_emulated_bandwidth: float | None
    flash_emulated_request_us: float | None  # the emulated device's cost of a request (--flash-device); None: none
    flash_device: str | None  # the device profile emulated (--flash-device); None: --flash-bandwidth or none
    policy: str
    gamma: float
    budget: str
    native: bool
    io: str
    io_why: str = "given"  # --io auto: why it chose ``io`` (flash.choose_io); "given" when the caller chose
    kernel_set: str | None = None  # the native library's kernel set on this CPU
    accuracy_level: int = 0
    prefill: str = "token"  # how the prompt was fed (EngineConfig.prefill)
    native_cache: bool = False  # the per-token cache step ran in the op library (EngineConfig.native_cache)
    io_engine: str | None = None  # --io direct: the reader that ran ("io_uring", "threads", "python")
    single_session: bool = False  # model.onnx once per token, every row resident (dipdeploy.runtime.backends.whole)
    fused: bool = False  # the per-layer graphs joined, the cache step in the graph (dipdeploy.runtime.backends.joined)
    read_ahead_rows_per_token: float = 0.0  # joined, --io direct: rows CachePrefetch read before the selection
    read_ahead_used_per_token: float = 0.0  # ... that the selection then missed
    read_ahead: str | None = None  # joined, --io direct: "on", "off" or --prefetch auto's choice (Engine.read_ahead_setting)
    speculation: dict | None = None  # --speculate: draft, k, passes, drafted, accepted, acceptance, tokens_per_pass, seconds

    @classmethod
    def collect(cls, engine, n_prompt: int, n_new: int, prefill_s: float, decode_s: float, timer: Timer,
                hits: np.ndarray, hits_prefill: np.ndarray, flash_prefill, flash_decode, memory: dict):
        """Decode-phase figures (the prompt's when nothing was decoded). ``flash_*``: the Flash store's
        counters over each phase of this run."""
        steps = max(n_new - 1, 0)
        dec = hits - hits_prefill if steps else hits
        per = steps if steps else n_prompt
        flash = flash_decode if steps else flash_prefill

        def rate(h: np.ndarray) -> float:
            return float(h[..., 0].sum() / h[..., 1].sum()) if h[..., 1].sum() else 0.0

        sel_bytes = sum(ki * rb[0] + kg * rb[1] for (ki, kg), rb in zip(engine.k, engine.row_bytes))
        emulate = engine.flash.emulate
        return cls(
            prompt_tokens=n_prompt, new_tokens=n_new, prefill_s=prefill_s, decode_s=decode_s,
            prefill_tok_s=n_prompt / prefill_s if prefill_s else 0.0,
            decode_tok_s=steps / decode_s if steps and decode_s else 0.0,
            hit_rate=rate(dec), hit_rate_in=rate(dec[:, 0]), hit_rate_glu=rate(dec[:, 1]),
            layer_hit_rate=[rate(dec[i]) for i in range(dec.shape[0])],
            flash_mb_per_token=flash.bytes / per / 1e6, flash_requests_per_token=flash.requests / per,
            flash_device_mb_per_token=flash.device_bytes / per / 1e6 if engine.cfg.io == "direct" else None,
            flash_block_mb_per_token=flash.block_bytes / per / 1e6,
            flash_block_requests_per_token=flash.block_requests / per,
            dram_mb_per_token=(sel_bytes + engine.dram_dense_per_token) / 1e6,
            resident={**engine.residency.as_dict(),
                      "slabs": sum(s.slab_bytes for pair in engine.slabs for s in pair)},
            memory=memory, seconds={**dict(timer.seconds),
                                    "flash_io": flash_prefill.io_seconds + flash_decode.io_seconds,
                                    "flash_io_decode": flash_decode.io_seconds,
                                    "flash_emulated_wait": flash_prefill.emulated_wait + flash_decode.emulated_wait},
            flash_emulated_bandwidth=emulate.seq_bandwidth if emulate else None,
            flash_emulated_request_us=emulate.request_s * 1e6 if emulate and emulate.request_s else None,
            flash_device=engine.cfg.flash_device, policy=engine.cfg.policy,
            gamma=engine.gamma, budget=str(engine.cfg.dram_budget), native=engine.native, io=engine.cfg.io,
            io_why=engine.io_why,
            kernel_set=engine.kernel_set, accuracy_level=engine.accuracy_level,
            prefill=engine.cfg.prefill,
            native_cache=engine.native_cache and not engine.single_session, io_engine=engine.flash.reader_kind,
            single_session=engine.single_session, fused=engine.fused is not None,
            read_ahead_rows_per_token=flash.ahead_rows / per, read_ahead_used_per_token=flash.ahead_used / per,
            read_ahead=engine.read_ahead_setting,
        )

    def as_dict(self) -> dict:
        return asdict(self)

    def table(self) -> list[tuple[str, str]]:
        """(label, value) rows for the CLI's stats table."""
        mb = 1e6
        r, mem, s = self.resident, self.memory, self.seconds
        bw = (f"emulated {self.flash_emulated_bandwidth / 1e9:.3g} GB/s" if self.flash_emulated_bandwidth
              else "unthrottled")
        if self.flash_emulated_request_us:
            bw += f" + {self.flash_emulated_request_us:.3g} µs a request"
        if self.flash_device:
            bw += f" ({self.flash_device})"
        bw += f"; --io {self.io}" + ("" if self.io_why == "given" else f" (auto: {self.io_why})")
        bw += f", reads by {self.io_engine}" if self.io_engine else ""
        total = sum(v for k, v in s.items() if not k.startswith("flash_")) or 1.0
        rows = [
            ("prompt", f"{self.prompt_tokens} tokens, {self.prefill_tok_s:.1f} tok/s ({'batched' if self.prefill == 'batch' else 'token by token'})"),
            ("decode", f"{self.new_tokens} tokens, {self.decode_tok_s:.1f} tok/s"),
            ("policy / γ / budget", f"{self.policy} / {self.gamma:g} / {self.budget}"),
            ("hit rate", f"{self.hit_rate:.3f} (up|gate {self.hit_rate_in:.3f}, down {self.hit_rate_glu:.3f})"),
            ("Flash per token", f"{self.flash_mb_per_token:.3f} MB in {self.flash_requests_per_token:.0f} requests ({bw})"),
        ]
        waste = self.flash_block_mb_per_token / self.flash_mb_per_token if self.flash_mb_per_token else 0.0
        if self.flash_device_mb_per_token is not None:
            rows.append(("read from device per token", f"{self.flash_device_mb_per_token:.3f} MB in {BLOCK // 1024} KiB "
                                                       f"blocks ({waste:.2f}× the rows' bytes)"))
        elif self.flash_emulated_bandwidth and self.flash_mb_per_token:
            rows.append(("emulated Flash per token", f"{self.flash_block_mb_per_token:.3f} MB in "
                                                     f"{self.flash_block_requests_per_token:.0f} requests paced: the "
                                                     f"{BLOCK // 1024} KiB blocks holding the rows ({waste:.2f}× the "
                                                     f"rows' bytes), a run of touching blocks a request"))
        if self.read_ahead_rows_per_token:
            used = self.read_ahead_used_per_token / self.read_ahead_rows_per_token
            rows.append(("read ahead per token", f"{self.read_ahead_rows_per_token:.0f} rows predicted and read during "
                                                 f"the attention, {self.read_ahead_used_per_token:.0f} of them missed by "
                                                 f"the selection ({used:.0%} used; read-ahead {self.read_ahead})"))
        elif self.read_ahead:
            rows.append(("read-ahead", self.read_ahead))
        if self.speculation:
            sp = self.speculation
            rows.append(("speculation", f"draft {sp['draft']}, up to {sp['k']} tokens: {sp['passes']} verification "
                                        f"passes, {sp['accepted']} of {sp['drafted']} drafts kept "
                                        f"({sp['acceptance']:.0%}), {sp['tokens_per_pass']:.2f} tokens per pass"))
        rows += [
            ("DRAM read per token", f"{self.dram_mb_per_token:.2f} MB"),
            ("resident (planned)", f"{r['total'] / mb:.1f} MB = dense {r['dense'] / mb:.1f} + KV {r['kv'] / mb:.1f} + "
                                   f"caches {r['caches'] / mb:.1f}{' (split reads)' if r.get('split') == 'reads' else ''} + staging {r['staging'] / mb:.1f}"
                                   + (f" + prefill buffers {r['prefill'] / mb:.1f}" if r.get("prefill") else "")
                                   + (f" + read buffer {r['read'] / mb:.1f}" if r.get("read") else "")),
        ]
        if mem:
            rows.append(("process memory", f"RSS {mem.get('VmRSS', 0) / mb:.1f} MB (anon {mem.get('RssAnon', 0) / mb:.1f}, "
                                           f"file-backed {mem.get('RssFile', 0) / mb:.1f}, shared staging "
                                           f"{mem.get('RssShmem', 0) / mb:.1f} counted once per slab); "
                                           f"PSS {mem.get('Pss', 0) / mb:.1f} MB"))
        parts = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(s.items(), key=lambda kv: -kv[1])
                          if not k.startswith("flash_"))
        rows.append(("time", f"{parts} (Flash reads {s.get('flash_io', 0):.3f} s, emulated wait "
                             f"{s.get('flash_emulated_wait', 0):.3f} s, inside "
                             f"{'the fused graph' if self.fused else 'cache'})"))
        kernels = f"native library ({self.kernel_set})" if self.native else "ONNX fallback functions (stock ORT)"
        path = ("model.onnx in one session per token, every row resident" if self.single_session
                else "per-layer graphs joined in one session per token, cache step in the graph" if self.fused
                else f"per-layer graphs, cache step {'native' if self.native_cache else 'numpy'}")
        rows.append(("kernels", f"{kernels}, accuracy level {self.accuracy_level}; {path}"))
        return rows
