"""The decode suite: llama-bench's pp and tg tests run by the host runtime on each configuration of a grid.

For each repetition, round-robin over the configurations (``grid.order``), the configuration's bundle
is opened in a fresh ``Engine`` (its budget, io mode, threads and the method's cache policy), warmed by
one short generation that is not measured (the sessions' first-run allocations), and then runs each test:

* ``ppN``: the prefill of an N-token prompt, nothing generated; tokens/s is the engine's
  ``prefill_tok_s`` (N over the prefill's wall time), its Flash figures the prompt's.
* ``tgN``: N decode steps after a one-token prompt, greedy, end-of-sequence ignored (the engine generates
  N + 1 tokens: the first comes from the prompt's logits, each of the N steps feeds one); tokens/s is the
  engine's ``decode_tok_s``, its Flash figures and hit rate per decode step.

Every test starts from the engine's reset state (an empty KV cache, caches as the policy starts them), so
the order of the tests does not change their figures; with ``cold`` the engine also drops the MLP file
from the page cache before each test, so its reads come from the disk. The prompt is ``PASSAGE``'s
tokens, repeated to N: text the model reads like text, so the selections DIP makes are those of real
input, not of random ids. The engine is closed after each repetition, so one configuration's memory never
holds another's. Under a ``--limit`` each repetition runs in a child process in a cgroup memory group of
that limit instead (``dipdeploy.bench.child``: the bundle dropped from the page cache first); a
repetition that is refused or killed there is counted in its rows' ``failed`` and said in the notes under
the table, and each test's row carries the group's peak over the test. An interrupt (Ctrl-C) ends the
run: the rows keep the repetitions done before it.

With ``gammas`` (``--gamma``) each DIP-CA bundle runs once per γ (``EngineConfig.gamma``), so one run
sweeps the cache awareness of one export; with ``accuracy_levels`` (``--accuracy-level``) each of our
configurations runs once per native accuracy level (int8 activations at 4, as the peers compute). The peers (``dipdeploy.bench.peers``) run the same tests, on
the same passage, in children of their own interpreters, each repetition interleaved with ours.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Callable

from dipdeploy.bench.bundles import BundleSpec, ensure, specs_for
from dipdeploy.bench.grid import NO_LIMIT, Case, DecodeGrid, method_label, order, parse_limit
from dipdeploy.bench.rows import Sample, SuiteResult, row, with_kept

Notice = Callable[[str], None]

#: the text every prompt is cut from (repeated to the prompt's length): plain prose, no special tokens
PASSAGE = (
    "The river town grew up around a ford where travellers crossed on their way to the coast. Its first "
    "houses were built of timber from the forest on the hill, and its market met every week in the square "
    "beside the church. Over the centuries the ford became a stone bridge, the market became a hall, and "
    "the town sent wool, grain and later cloth down the river to the port. Many of the old streets still "
    "follow the lines of the medieval plots, and the records of the town council, kept since the fourteenth "
    "century, describe floods, fires, fairs and the slow arrival of the railway. "
)
#: the warm-up generation: a prompt of at most this many tokens, then two generated
WARMUP_PROMPT = 32


def prompt_ids(engine, n: int) -> list[int]:
    """``n`` token ids of ``PASSAGE`` repeated (its first encoding keeps the tokenizer's leading special
    tokens, the repeats are the text's tokens alone)."""
    first = engine.encode(PASSAGE)
    ids = list(first)
    if len(ids) < n:
        again = engine.encode(PASSAGE, special_tokens=False) or first
        while len(ids) < n:
            ids += again
    return ids[:n]


def engine_options(case: Case, need: int, cold: bool) -> dict:
    """The ``EngineConfig`` fields of ``case`` for runs of ``need`` positions (plain values: a child process
    is handed them as JSON). The context is ``need``, the one the peers get (``peers.child_spec``): the KV
    cache a budget reserves is the tests', so a limit weighs on the engines alike."""
    options = {"dram_budget": case.budget, "io": case.io, "threads": case.threads, "cold": cold, "context": need}
    if case.bundle.policy:
        options["policy"] = case.bundle.policy
    if case.gamma is not None:
        options["gamma"] = case.gamma
    if case.accuracy_level is not None:
        options["accuracy_level"] = case.accuracy_level
    return options


def open_engine(bundle: str | Path, options: dict):
    from dipdeploy.runtime import Engine, EngineConfig

    return Engine(bundle, EngineConfig(**options))


def _sample(stats, tok_s: float, decode: bool, peak_mb: float | None) -> Sample:
    """A test's figures. The hit rate is a decode figure: the batched prefill reads each layer's selected
    rows once for the whole prompt, so it has none; nor has a bundle whose every row is resident. Device
    requests are counted where device bytes are (``--io direct``: the requests the reader sent)."""
    direct = stats.flash_device_mb_per_token is not None
    return Sample(tok_s=tok_s, flash_mb_per_token=stats.flash_mb_per_token,
                  device_mb_per_token=stats.flash_device_mb_per_token,
                  hit_rate=stats.hit_rate if decode and not stats.single_session else None, io_used=stats.io,
                  cgroup_peak_mb=peak_mb,
                  device_requests_per_token=stats.flash_block_requests_per_token if direct else None)


def needed_context(grid: DecodeGrid) -> int:
    """Positions the longest test needs: its prompt, or a token and N + 1 generated."""
    return max([p for p in grid.n_prompt] + [n + 2 for n in grid.n_gen] + [WARMUP_PROMPT + 2])


class RunFailed(Exception):
    """A repetition under a cgroup limit that did not finish: ``status`` (refused, killed, failed), ``why``."""

    def __init__(self, status: str, why: str):
        super().__init__(f"{status}: {why}")
        self.status, self.why = status, why


def run_tests(engine, tests: list[tuple[str, int]], need: int, group=None) -> dict[str, Sample]:
    """The warm-up, then every test on ``engine`` (see the module docstring): {"pp512": Sample, ...}.
    ``group`` (a ``peer_child.Group``, in a child under a limit): its peak is reset before each test and
    read after it, as a peer's child does."""
    from dipdeploy.runtime.sampler import Sampler

    if engine.cfg.context < need:
        raise ValueError(f"-p/-n need {need} positions; {engine.path} runs {engine.cfg.context} (its model's or "
                         f"its export's --max-length): give shorter -p/-n")
    greedy = Sampler(temperature=0.0)
    longest = max([n for kind, n in tests if kind == "pp"] + [1])
    ids = prompt_ids(engine, max(longest, WARMUP_PROMPT))
    engine.generate(ids[:WARMUP_PROMPT], 2, sampler=greedy, stop_at_eos=False)
    out = {}
    for kind, n in tests:
        if group is not None:
            group.reset_peak()
        if kind == "pp":
            stats = engine.generate(ids[:n], 0, sampler=greedy, stop_at_eos=False).stats
        else:
            stats = engine.generate(ids[:1], n + 1, sampler=greedy, stop_at_eos=False).stats
        peak = group.peak_mb() if group is not None else None
        out[f"{kind}{n}"] = _sample(stats, stats.prefill_tok_s if kind == "pp" else stats.decode_tok_s,
                                    decode=kind == "tg", peak_mb=peak)
    return out


def measure(case: Case, grid: DecodeGrid) -> dict[str, Sample]:
    """One repetition of every test of ``case`` in a fresh engine: in this process, or, under a limit, in a
    child process in a cgroup memory group of that limit (``dipdeploy.bench.child``; RunFailed when it
    does not finish)."""
    tests, need = grid.tests(), needed_context(grid)
    options = engine_options(case, need, grid.cold)
    if case.limit == NO_LIMIT:
        engine = open_engine(case.bundle.path, options)
        try:
            return run_tests(engine, tests, need)
        finally:
            engine.close()
            del engine
            gc.collect()
    from dipdeploy.bench.child import spawn

    done = spawn({"suite": "decode", "bundle": str(case.bundle.path), "options": options, "tests": tests,
                  "need": need}, parse_limit(case.limit), use_group=True)
    if done.status != "ok":
        raise RunFailed(done.status, done.why)
    return {test: Sample(**fields) for test, fields in done.reply["samples"].items()}


def labels(case: Case) -> dict:
    b: BundleSpec = case.bundle
    return {"model": b.model, "method": method_label(b.method, case.gamma, case.accuracy_level), "density": b.density,
            "budget": case.budget, "io": case.io, "threads": case.threads, "limit": case.limit}


def _describe(case: Case) -> str:
    b = case.bundle
    limit = "" if case.limit == NO_LIMIT else f", limit {case.limit}"
    if b.density is None:  # a peer
        return f"{b.model} {b.method}, {case.threads} thread(s){limit}"
    return (f"{b.model} {method_label(b.method, case.gamma, case.accuracy_level)} ρ {b.density:g}, budget {case.budget}, io {case.io}, "
            f"{case.threads} thread(s){limit}")


def cases_of(grid: DecodeGrid) -> list[Case]:
    specs = []
    for target in grid.models:
        for spec in specs_for(target, tuple(grid.methods), tuple(grid.densities), grid.cache, grid.quant):
            if spec not in specs:
                specs.append(spec)
    cases = grid.cases(specs)
    grid.check_size(len(cases))
    return cases


def run_decode(grid: DecodeGrid, notice: Notice = lambda line: None) -> SuiteResult:
    """Export what is missing, then every case × repetition round-robin, the peers' among ours; the rows in
    case order, each test's rows after the other (pp before tg, as llama-bench prints them), each limited
    row's ``kept`` against its configuration at limit none."""
    from dipdeploy.bench.peers import PeerSpec, measure_peer

    t0 = time.perf_counter()
    cases = cases_of(grid)
    if any(c.limit != NO_LIMIT for c in cases):
        from dipdeploy.bench.cgroup import require

        require()
    peer_groups = False
    if grid.peers:  # a peer runs in a child always, in a group where one can be made (its peak)
        from dipdeploy.bench.cgroup import probe

        peer_groups = probe() is None
    for spec in dict.fromkeys(c.bundle for c in cases if not isinstance(c.bundle, PeerSpec)):
        ensure(spec, notice)
    samples: dict[int, dict[str, list[Sample]]] = {i: {} for i in range(len(cases))}
    failed: dict[int, int] = {}
    notes: list[str] = []
    plan = order(len(cases), grid.repetitions)
    interrupted = False
    try:
        for step, (rep, i) in enumerate(plan, 1):
            where = f"[{step}/{len(plan)}] repetition {rep + 1}/{grid.repetitions}: {_describe(cases[i])}"
            try:
                if isinstance(cases[i].bundle, PeerSpec):
                    got, said = measure_peer(cases[i], grid, peer_groups)
                    notes += [f"{_describe(cases[i])}, repetition {rep + 1}: {line}" for line in said]
                else:
                    got = measure(cases[i], grid)
            except RunFailed as err:
                failed[i] = failed.get(i, 0) + 1
                notes.append(f"{_describe(cases[i])}, repetition {rep + 1}: {err}")
                notice(f"{where}: {err}")
                continue
            for test, sample in got.items():
                samples[i].setdefault(test, []).append(sample)
            notice(f"{where}: " + ", ".join(f"{t} {s.tok_s:.2f} t/s" for t, s in got.items()))
    except KeyboardInterrupt:
        interrupted = True
        notice("interrupted: the rows hold the repetitions measured so far")
    rows = [row(labels(case), test, samples[i][test], failed.get(i, 0)) for i, case in enumerate(cases)
            for test in samples[i]]
    return SuiteResult(with_kept(rows), time.perf_counter() - t0, notes, interrupted)
