"""The reads suite: what reading rows costs on this disk (and in this DRAM), through the runtime's own reader.

Every configuration of the grid reads the same rows through ``dipdeploy.runtime.flash.FlashStore``, the
store ``dipdeploy run`` reads its misses with: ``--io mmap`` (a vectorised gather from the mapping),
``pread`` (a ``preadv`` per run of adjacent rows) or ``direct`` (``O_DIRECT``: block-aligned requests,
neighbours closer than ``--gap`` blocks read as one, ``--depth`` in flight through the op library's io_uring
ring or pread threads, ``--io-engine``). ``--io dram`` runs instead a plain AVX2 load loop over a
resident buffer (``read_sources``: the hardware's ceiling, the rows in address order or ``--order
shuffled``, with ``--prefetch`` rows of software prefetch). The rows are a scratch file's (``--row-bytes``,
``--density``: rows kept at random, one call per group of rows) or, with ``-m BUNDLE``, the misses of a
real decode of that bundle (one call per token, layer and group; ``--budget`` is that decode's).

``--cache cold`` (mmap, pread) drops the file from the page cache before each repetition, so the reads
reach the disk; ``warm`` reads it once first, untimed. A direct read always reaches the device. A flag that
does not apply to an io mode (the gap of mmap, the cache of direct) is left out of its cases, so the
product of the lists holds no duplicates. A row: MB/s of the rows wanted and of the bytes read (whole
blocks, gaps read through), requests per second (IOPS: the requests the device served, for mmap and pread
a run of touching blocks each), requests, megabytes read and wanted per repetition and their ratio, and for
a bundle the milliseconds of one decode token's reads. Repetitions run round-robin; MB/s is the mean ±
standard deviation over them.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np

from dipdeploy.bench.grid import check_runs, order
from dipdeploy.bench.rows import SuiteResult, mean_std
from dipdeploy.limits import check_count

Notice = Callable[[str], None]
IOS = ("dram", "mmap", "pread", "direct")
ENGINES = ("auto", "threads", "io_uring")
ORDERS = ("sorted", "shuffled")
CACHES = ("cold", "warm")
DEFAULT_ROW_BYTES, DEFAULT_SIZE, QUICK_SIZE = 1536, 256 << 20, 64 << 20
MAX_ROW_BYTES, MAX_SIZE, MAX_PREFETCH, MAX_TOKENS = 1 << 20, 16 << 30, 1024, 256
DEFAULT_TOKENS, QUICK_TOKENS = 16, 4
DEFAULT_REPETITIONS, QUICK_REPETITIONS = 3, 1
SCRATCH = "scratch"
DIR = "build/bench/reads"
_MB = 1e6


@dataclass(frozen=True)
class ReadCase:
    source: str  # SCRATCH or a bundle folder
    io: str
    row_bytes: int | None = None  # scratch rows
    density: float | None = None
    order: str | None = None  # dram only
    prefetch: int | None = None  # dram only
    engine: str | None = None  # direct only
    gap: int | None = None  # direct only
    depth: int | None = None  # direct only; None: the reader's default
    cache: str | None = None  # mmap, pread
    budget: str | None = None  # a bundle's decode


@dataclass
class ReadGrid:
    bundles: list[str] = field(default_factory=list)  # empty: the scratch file
    ios: list[str] = field(default_factory=lambda: ["direct"])
    row_bytes: list[int] = field(default_factory=lambda: [DEFAULT_ROW_BYTES])
    densities: list[float] = field(default_factory=lambda: [0.5])
    orders: list[str] = field(default_factory=lambda: ["sorted"])
    prefetch: list[int] = field(default_factory=lambda: [0])
    engines: list[str] = field(default_factory=lambda: ["auto"])
    gaps: list[int] = field(default_factory=list)  # empty: the runtime's IO_GAP
    depths: list[int] = field(default_factory=list)  # empty: the reader's default
    caches: list[str] = field(default_factory=lambda: ["cold"])
    budgets: list[str] = field(default_factory=lambda: ["50%"])
    size: int = DEFAULT_SIZE
    tokens: int = DEFAULT_TOKENS
    repetitions: int = DEFAULT_REPETITIONS
    folder: Path = Path(DIR)

    def __post_init__(self) -> None:
        check_count(self.repetitions, "-r/--repetitions", 1, 100, "repetitions")
        check_count(self.tokens, "--tokens", 2, MAX_TOKENS, "tokens")
        check_count(self.size, "--size", 1 << 20, MAX_SIZE, "bytes")
        for rb in self.row_bytes:
            if rb > self.size:
                raise ValueError(f"--row-bytes {rb} is larger than --size {self.size}; give a larger --size")
        if self.bundles and "dram" in self.ios and len(self.ios) == 1:
            raise ValueError("--io dram reads a buffer in memory, not a bundle; give --io mmap, pread or direct with -m")

    def cases(self) -> list[ReadCase]:
        from dipdeploy.runtime.blockio import IO_GAP

        out = []
        gaps = self.gaps or [IO_GAP]
        depths = self.depths or [None]
        for source in (self.bundles or [SCRATCH]):
            bundle = source != SCRATCH
            for io in self.ios:
                if bundle and io == "dram":
                    continue
                shapes = [(None, None)] if bundle else list(itertools.product(self.row_bytes, self.densities))
                for (rb, rho), budget in itertools.product(shapes, self.budgets if bundle else [None]):
                    if io == "dram":
                        out += [ReadCase(source, io, rb, rho, o, p) for o in self.orders for p in self.prefetch]
                    elif io == "direct":
                        out += [ReadCase(source, io, rb, rho, engine=e, gap=g, depth=d, budget=budget)
                                for e in self.engines for g in gaps for d in depths]
                    else:
                        out += [ReadCase(source, io, rb, rho, cache=c, budget=budget) for c in self.caches]
        cases = list(dict.fromkeys(out))
        check_runs(len(cases), self.repetitions)
        return cases


@dataclass(frozen=True)
class Pass:
    """One repetition of one case."""

    seconds: float
    wanted: int  # bytes of the rows
    read: int  # bytes of the blocks read (dram: the rows')
    requests: int | None
    calls: int
    reader: str | None = None  # direct: the reader that ran (io_uring, threads, python)


@dataclass(frozen=True)
class ReadRow:
    source: str
    io: str
    row_bytes: int | None
    density: float | None
    order: str | None
    prefetch: int | None
    engine: str | None
    gap: int | None
    depth: int | None
    cache: str | None
    budget: str | None
    mb_s: float  # MB/s of the rows wanted: mean over the repetitions
    mb_s_std: float
    read_mb_s: float  # MB/s of the bytes read
    iops: float | None
    requests: float | None  # per repetition
    mb_read: float
    mb_wanted: float
    read_over_wanted: float
    calls: int
    repetitions: int
    ms_per_token: float | None = None  # a bundle's: one decode token's reads
    reader: str | None = None

    MD_COLUMNS: ClassVar[tuple[str, ...]] = ("source", "io", "row B", "ρ", "order", "prefetch", "engine", "gap",
                                             "depth", "cache", "budget", "MB/s", "read MB/s", "IOPS", "requests",
                                             "MB read", "MB wanted", "read/wanted", "ms/token")
    MD_OPTIONAL: ClassVar[dict[str, str]] = {c: "" for c in ("row B", "ρ", "order", "prefetch", "engine", "gap",
                                                              "depth", "cache", "budget", "IOPS", "requests",
                                                              "ms/token")}
    MD_NUMERIC: ClassVar[tuple[str, ...]] = ("row B", "ρ", "prefetch", "gap", "depth", "IOPS", "requests",
                                             "read/wanted", "ms/token")
    SCHEMA: ClassVar[str] = "bench.reads"

    def as_dict(self) -> dict:
        return asdict(self)

    def cells(self) -> tuple[str, ...]:
        def opt(v, fmt="{}"):
            return "" if v is None else fmt.format(v)

        engine = None if self.engine is None else (self.engine if self.reader in (None, self.engine)
                                                   else f"{self.engine}→{self.reader}")
        return (self.source, self.io, opt(self.row_bytes), opt(self.density, "{:g}"), opt(self.order),
                opt(self.prefetch), opt(engine), opt(self.gap), "default" if self.io == "direct" and self.depth is None
                else opt(self.depth), opt(self.cache), opt(self.budget), f"{self.mb_s:.1f} ± {self.mb_s_std:.1f}",
                f"{self.read_mb_s:.1f}", opt(self.iops, "{:.0f}"), opt(self.requests, "{:.0f}"),
                f"{self.mb_read:.4g}", f"{self.mb_wanted:.4g}", f"{self.read_over_wanted:.3f}",
                opt(self.ms_per_token, "{:.2f}"))


class Sources:
    """The batches of each source, made once per run: scratch files, bundles' traces, the DRAM probe."""

    def __init__(self, grid: ReadGrid, notice: Notice):
        self.grid, self.notice = grid, notice
        self._batches: dict[tuple, tuple[Path, list, int]] = {}
        self._probe: Path | None = None

    def prepare(self, cases: list[ReadCase]) -> None:
        """Everything slow or fallible before the first timed pass: files written, traces made, probe built."""
        for c in cases:
            if c.io == "dram":
                self.probe()
            else:
                self.batches(c)

    def probe(self) -> Path:
        from dipdeploy.bench.read_sources import probe_binary

        if self._probe is None:
            self._probe = probe_binary(self.grid.folder)
        return self._probe

    def batches(self, c: ReadCase) -> tuple[Path, list, int]:
        """(file, batches, decode tokens: 0 for the scratch file) of ``c``'s rows."""
        from dipdeploy.bench import read_sources as rs

        key = (c.source, c.row_bytes, c.density, c.budget)
        if key not in self._batches:
            if c.source == SCRATCH:
                path = rs.scratch_file(self.grid.folder, self.grid.size, self.notice)
                self._batches[key] = (path, rs.scratch_batches(self.grid.size, c.row_bytes, c.density), 0)
            else:
                from dipdeploy.bench.bundles import bundle_spec

                bundle = Path(c.source)
                trace = rs.trace_path(self.grid.folder, bundle, c.budget, self.grid.tokens)
                if not trace.is_file():
                    policy = bundle_spec(bundle).policy
                    self.notice(f"decoding {self.grid.tokens} tokens of {bundle} at budget {c.budget} for its "
                                f"misses (once): {trace}")
                    rs.make_trace(bundle, trace, self.grid.tokens, c.budget, policy)
                batches, tokens = rs.trace_batches(bundle, trace, self.grid.tokens)
                self._batches[key] = (bundle / "mlp.bin", batches, tokens)
        return self._batches[key]


def _buffers(batches) -> dict[int, np.ndarray]:
    """A touched destination per row size, as large as the largest call needs (the runtime's slabs)."""
    most: dict[int, int] = {}
    for b in batches:
        for rb in b.row_bytes:
            most[rb] = max(most.get(rb, 0), len(b.rows))
    return {rb: np.ones((n, rb), dtype=np.uint8) for rb, n in most.items()}


def disk_pass(path: Path, batches, c: ReadCase) -> tuple[Pass, str | None]:
    """One pass of ``c`` over ``batches`` through a fresh ``FlashStore``; and its note (O_DIRECT refused)."""
    from dipdeploy.runtime.flash import FlashStore, RowArray

    store = FlashStore(path, io=c.io, cold=c.cache == "cold", io_threads=c.depth,
                       io_engine=c.engine or "auto", io_gap=c.gap if c.gap is not None else 0)
    try:
        dest = _buffers(batches)
        calls = []
        for b in batches:
            arrays = [RowArray(f"a{i}", off, int(b.rows[-1]) + 1, rb, "uint8", (rb,))
                      for i, (off, rb) in enumerate(zip(b.offsets, b.row_bytes))]
            calls.append((arrays, [dest[rb][:len(b.rows)] for rb in b.row_bytes], b.rows, np.arange(len(b.rows))))
        if c.cache == "warm":
            for call in calls:
                store.read(*call)
        before = store.counters.snapshot()
        t0 = time.perf_counter()
        for call in calls:
            store.read(*call)
        seconds = time.perf_counter() - t0
        d = store.counters - before
        return Pass(seconds, d.bytes, d.block_bytes, d.block_requests, len(calls), store.reader_kind), store.note
    finally:
        store.close()


def _labels(c: ReadCase) -> dict:
    out = asdict(c)
    out["source"] = SCRATCH if c.source == SCRATCH else Path(c.source).name
    return out


def describe(c: ReadCase) -> str:
    bits = [f"{k} {v}" for k, v in asdict(c).items() if v is not None and k not in ("source", "io")]
    return f"{_labels(c)['source']} {c.io}" + (f" ({', '.join(bits)})" if bits else "")


def aggregate(c: ReadCase, passes: list[Pass], tokens: int) -> ReadRow:
    mean, std = mean_std([p.wanted / p.seconds / _MB for p in passes])
    s = sum(p.seconds for p in passes) / len(passes)
    p0 = passes[0]  # the rows read are the same every repetition
    return ReadRow(**_labels(c), mb_s=mean, mb_s_std=std,
                   read_mb_s=float(np.mean([p.read / p.seconds / _MB for p in passes])),
                   iops=None if p0.requests is None else float(np.mean([p.requests / p.seconds for p in passes])),
                   requests=p0.requests, mb_read=p0.read / _MB, mb_wanted=p0.wanted / _MB,
                   read_over_wanted=p0.read / p0.wanted, calls=p0.calls, repetitions=len(passes),
                   ms_per_token=s / tokens * 1e3 if tokens else None, reader=p0.reader)


def side_by_side(rows: list[ReadRow], dense: set[str]) -> list[str]:
    """Notes: for each bundle row read as a ``dense`` source's row was (same io, reader, gap, depth, cache and
    budget), dense-static's milliseconds of reads per token over the other's: where both methods' tokens
    wait on the device, the most the sparse method can gain on dense-static."""
    def same(r: ReadRow) -> tuple:
        return (r.io, r.engine, r.gap, r.depth, r.cache, r.budget)

    base = {same(r): r for r in rows if r.source in dense and r.ms_per_token}
    out = []
    for r in rows:
        d = base.get(same(r))
        if d is not None and r.source not in dense and r.ms_per_token:
            out.append(f"{r.io} {r.engine or ''} gap {r.gap}, budget {r.budget}: dense-static's reads "
                       f"{d.ms_per_token:.2f} ms a token against {r.source}'s {r.ms_per_token:.2f} ms: "
                       f"{d.ms_per_token / r.ms_per_token:.2f}× ({d.source} / {r.source})".replace("  ", " "))
    return out


def _dense(sources: list[str]) -> set[str]:
    """The names of the bundles run as dense-static (a ρ = 1 bundle: ``bench.bundles.bundle_spec``)."""
    from dipdeploy.bench.bundles import bundle_spec

    return {Path(s).name for s in sources if s != SCRATCH and bundle_spec(Path(s)).method == "dense"}


def run_reads(grid: ReadGrid, notice: Notice = lambda line: None) -> SuiteResult:
    """Make every source, then every case × repetition round-robin; one row per case."""
    from dipdeploy.bench.read_sources import dram_pass

    t0 = time.perf_counter()
    cases = grid.cases()
    sources = Sources(grid, notice)
    sources.prepare(cases)
    passes: dict[int, list[Pass]] = {}
    notes: list[str] = []
    plan = order(len(cases), grid.repetitions)
    interrupted = False
    try:
        for step, (rep, i) in enumerate(plan, 1):
            c = cases[i]
            if c.io == "dram":
                seconds, rows = dram_pass(sources.probe(), grid.size, c.row_bytes, c.density, c.prefetch, c.order)
                got = Pass(seconds, rows * c.row_bytes, rows * c.row_bytes, None, 1)
            else:
                path, batches, _ = sources.batches(c)
                got, note = disk_pass(path, batches, c)
                if note and note not in notes:
                    notes.append(note)
            passes.setdefault(i, []).append(got)
            notice(f"[{step}/{len(plan)}] repetition {rep + 1}/{grid.repetitions}: {describe(c)}: "
                   f"{got.wanted / got.seconds / _MB:.1f} MB/s wanted, {got.read / _MB:.1f} MB read")
    except KeyboardInterrupt:
        interrupted = True
        notice("interrupted: the rows hold the repetitions measured so far")
    rows = [aggregate(c, passes[i], 0 if c.io == "dram" else sources.batches(c)[2])
            for i, c in enumerate(cases) if i in passes]
    notes += side_by_side(rows, _dense(grid.bundles))
    return SuiteResult(rows, time.perf_counter() - t0, notes, interrupted)
