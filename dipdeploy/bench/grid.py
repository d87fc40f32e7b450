"""The grid of a benchmark: comma lists that expand to every combination, as llama-bench's flags do, each
value checked and every count bounded before any work starts.

A flag given a comma list (``--budget 50%,100%``) or given several times contributes every value, in the
order given, duplicates dropped. The cases are the product of the lists; ``order`` repeats them
round-robin (every case's first repetition, then every case's second, ...), so a drift of the machine
during the run spreads over all cases instead of falling on the last ones. Each bound is a constant here
and a refusal names the flag, the bound and the value to give (``dipdeploy.limits.check_count``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from dipdeploy.limits import check_count

#: repetitions of each case (``-r``)
MAX_REPETITIONS = 100
#: tokens of a pp test's prompt (``-p``) and of a tg test's generation (``-n``)
MAX_PROMPT = 4096
MAX_GEN = 4096
#: values of one grid flag, and cases × repetitions of one run: a typo's grid must not run for days
MAX_VALUES = 32
MAX_RUNS = 2000
#: llama-bench's defaults (pp512, tg128, five repetitions) and ``--quick``'s
DEFAULT_PROMPT, DEFAULT_GEN, DEFAULT_REPETITIONS = 512, 128, 5
QUICK_PROMPT, QUICK_GEN, QUICK_REPETITIONS = 64, 16, 1
DEFAULT_BUDGET = "50%"
#: ``--limit``'s value for a run under no cgroup limit
NO_LIMIT = "none"


def split(values: list[str] | tuple[str, ...] | str | None, flag: str) -> list[str]:
    """The items of one grid flag: each value split at commas and stripped, in order, without repeats;
    an empty item (``50%,,100%``) or more than ``MAX_VALUES`` items is refused."""
    if values is None:
        return []
    out: list[str] = []
    for value in ([values] if isinstance(values, str) else values):
        for item in str(value).split(","):
            item = item.strip()
            if not item:
                raise ValueError(f"{flag} {value!r} holds an empty item; give a comma list such as {flag} a,b")
            if item not in out:
                out.append(item)
    if len(out) > MAX_VALUES:
        raise ValueError(f"{flag} lists {len(out)} values, over the cap of {MAX_VALUES}; give {MAX_VALUES} or fewer")
    return out


def ints(values, flag: str, low: int, high: int, unit: str) -> list[int]:
    out = []
    for item in split(values, flag):
        try:
            number = int(item)
        except ValueError:
            raise ValueError(f"{flag} must be whole numbers{' of ' + unit if unit else ''} in [{low}, {high}], "
                             f"got {item!r}") from None
        out.append(check_count(number, flag, low, high, unit))
    return out


def densities(values, flag: str = "--density") -> list[float]:
    out = []
    for item in split(values, flag):
        try:
            rho = float(item)
        except ValueError:
            raise ValueError(f"{flag} must be MLP densities in (0, 1], got {item!r}") from None
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"{flag} must be MLP densities in (0, 1], got {item}")
        out.append(rho)
    return out


def _engine_field(name: str, value, flag: str) -> None:
    """Refuse ``value`` of ``EngineConfig.<name>`` with the engine's own check (its one definition of the
    range), named as ``flag``, as ``budgets`` does."""
    from dipdeploy.runtime.config import EngineConfig, FieldError

    try:
        EngineConfig(**{name: value})
    except FieldError as err:
        raise ValueError(err.named(flag)) from None


def gammas(values, flag: str = "--gamma") -> list[float]:
    """DIP-CA's γ values (``EngineConfig.gamma``), each in the range the engine takes."""
    out = []
    for item in split(values, flag):
        try:
            gamma = float(item)
        except ValueError:
            raise ValueError(f"{flag} must be values of DIP-CA's γ in [0, 1], got {item!r}") from None
        _engine_field("gamma", gamma, flag)
        out.append(gamma)
    return out


def accuracy_levels(values, flag: str = "--accuracy-level") -> list[int]:
    """The native kernels' accuracy levels (``EngineConfig.accuracy_level``: 0 fp32 activations, 4 int8),
    each one the engine takes."""
    out = []
    for item in split(values, flag):
        if not item.isdigit():
            raise ValueError(f"{flag} must be whole numbers, accuracy levels such as 0 or 4, got {item!r}")
        _engine_field("accuracy_level", int(item), flag)
        out.append(int(item))
    return out


def method_label(method: str, gamma: float | None, level: int | None = None) -> str:
    """A row's method: the bundle's, with the γ it ran at where ``--gamma`` set one (γ 1 is DIP's
    selection, no cache awareness, over DIP-CA's cache) and the accuracy level where
    ``--accuracy-level`` set one."""
    name = method if gamma is None else "dip (γ 1)" if gamma == 1.0 else f"{method} γ{gamma:g}"
    return name if level is None else f"{name} L{level}"


def choices(values, flag: str, allowed: tuple[str, ...]) -> list[str]:
    items = split(values, flag)
    for item in items:
        if item not in allowed:
            raise ValueError(f"{flag} {item!r} is not one of {', '.join(allowed)}")
    return items


def budgets(values, flag: str = "--budget") -> list[str]:
    """DRAM budgets as the engine takes them (a share of the MLP bytes, "50%", or a total, "120MB"),
    each checked by ``EngineConfig``'s own parser."""
    from dipdeploy.runtime.config import EngineConfig, FieldError

    items = split(values, flag)
    for item in items:
        try:
            EngineConfig(dram_budget=item)
        except FieldError as err:
            raise ValueError(err.named(f"{flag} {item}:")) from None
        except ValueError as err:
            raise ValueError(f"{flag} {item}: {err}") from None
    return items


def parse_limit(text: str) -> int | None:
    """``none`` or a size (such as "300MB" or "1.5GiB") in bytes; anything else is refused naming ``--limit``."""
    from dipdeploy.runtime.budget import parse_bytes

    if text.lower() == NO_LIMIT:
        return None
    try:
        value = parse_bytes(text, "--limit")
    except ValueError as err:
        raise ValueError(f"--limit {text}: {err}; give none or a size such as 300MB") from None
    if value <= 0:
        raise ValueError(f"--limit {text} must be above 0 bytes; give none or a size such as 300MB")
    return value


@dataclass(frozen=True)
class Case:
    """One configuration of the grid: a row per test (pp, tg) comes from its repetitions. ``bundle``
    is a ``dipdeploy.bench.bundles.BundleSpec``, or a ``dipdeploy.bench.peers.PeerSpec`` for a peer's row
    (no budget; its io is the peer's load mode)."""

    bundle: object
    budget: str
    io: str
    threads: int
    limit: str = NO_LIMIT  # the cgroup memory limit the run is under
    gamma: float | None = None  # DIP-CA's γ (``--gamma``); None: the bundle's
    accuracy_level: int | None = None  # ``--accuracy-level``; None: the bundle's

    def key(self) -> tuple:
        b = self.bundle
        return (b.model, b.method, b.density, self.budget, self.io, self.threads, self.limit, self.gamma,
                self.accuracy_level)


@dataclass
class DecodeGrid:
    """What ``dipdeploy bench decode`` runs, every list checked: models (registry names, Hugging Face folders
    or bundle folders), methods and densities (for models only: a bundle runs as exported), budgets, io
    modes, threads, the pp prompt and tg generation lengths (0 leaves that test out), repetitions,
    whether every test starts cold (``cold``), the cgroup memory limits the runs are under
    (``limits``: ``none`` runs in this process), DIP-CA's γ values (``gammas``: each DIP-CA bundle runs at
    each; empty: at the bundle's) and the peers run beside ours (``peers``: ``dipdeploy.bench.peers.PeerSpec``,
    each at every thread count and limit)."""

    models: list[str]
    methods: list[str] = field(default_factory=lambda: ["dip-ca"])
    densities: list[float] = field(default_factory=lambda: [0.5])
    budgets: list[str] = field(default_factory=lambda: [DEFAULT_BUDGET])
    ios: list[str] = field(default_factory=lambda: ["auto"])
    threads: list[int] = field(default_factory=lambda: [1])
    n_prompt: list[int] = field(default_factory=lambda: [DEFAULT_PROMPT])
    n_gen: list[int] = field(default_factory=lambda: [DEFAULT_GEN])
    repetitions: int = DEFAULT_REPETITIONS
    quant: str = "bq4"
    cache: Path = Path("build/bench/bundles")
    cold: bool = False  # the engine drops the MLP file from the page cache before each test (``EngineConfig.cold``)
    limits: list[str] = field(default_factory=lambda: [NO_LIMIT])
    gammas: list[float] = field(default_factory=list)
    accuracy_levels: list[int] = field(default_factory=list)  # each of ours once per level; empty: the bundle's
    peers: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("give a model: -m NAME (a registry model, `dipdeploy models`) or -m BUNDLE")
        check_count(self.repetitions, "-r/--repetitions", 1, MAX_REPETITIONS, "repetitions")
        if not any(self.n_prompt) and not any(self.n_gen):
            raise ValueError("-p and -n are all 0: nothing to measure; give -p N (prefill) or -n N (decode) above 0")
        for text in self.limits:
            parse_limit(text)

    def tests(self) -> list[tuple[str, int]]:
        """("pp", p) and ("tg", n) tests in llama-bench's order, a zero length left out."""
        return [("pp", p) for p in self.n_prompt if p] + [("tg", n) for n in self.n_gen if n]

    def cases(self, specs: list) -> list[Case]:
        """The product of the bundles (``specs``; a DIP-CA one once per γ of ``gammas``), the engine's lists
        and the limits, in flag order, then each peer at every thread count and limit."""
        if self.gammas and not any(s.method == "dip-ca" for s in specs):
            raise ValueError("--gamma applies to dip-ca rows and the grid has none; give --method dip-ca or a "
                             "DIP-CA bundle, or leave --gamma out")
        ours = [Case(s, b, io, t, lim, gamma, level) for s in specs
                for gamma in (self.gammas if s.method == "dip-ca" and self.gammas else [None])
                for level in (self.accuracy_levels or [None])
                for b, io, t, lim in itertools.product(self.budgets, self.ios, self.threads, self.limits)]
        return ours + [Case(p, "", p.io, t, lim) for p in self.peers for t, lim in
                       itertools.product(self.threads, self.limits)]

    def check_size(self, n_cases: int) -> None:
        check_runs(n_cases, self.repetitions)


def check_runs(configurations: int, repetitions: int) -> None:
    """Refuses a grid of more than ``MAX_RUNS`` configurations × repetitions, every suite's the same way."""
    runs = configurations * repetitions
    if runs > MAX_RUNS:
        raise ValueError(f"the grid runs {configurations} configurations × {repetitions} repetitions = {runs}, over "
                         f"the cap of {MAX_RUNS}; give fewer values or repetitions")


def order(n_cases: int, repetitions: int) -> list[tuple[int, int]]:
    """(repetition, case) pairs round-robin: every case once, then every case again."""
    return [(r, c) for r in range(repetitions) for c in range(n_cases)]
