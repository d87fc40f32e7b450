"""The job of ``dipdeploy demo`` (``make demo``): one model, dense against DIP-CA at two densities, each
as a bundle run by the host runtime under the same DRAM budget, with its perplexity and its answer.

Every configuration is a BQ4 bundle with per-layer graphs: the dense one is a ρ = 1 DIP bundle run with
``static`` pinning (the README's fair dense baseline: the same DRAM holds its most used rows, the rest
streams from Flash); the DIP-CA ones use LFU and the plan's γ. The plans are uniform with ρ_in = 1.1 ρ
(inside the 1.0–1.3 ρ range the split search of docs/method.md covers, without its minutes). Perplexity
is the torch reference of each bundle (fake-quantised weights, the same plan, cache and γ: what the
runtime computes up to rounding, docs/runtime.md, "Correctness") on WikiText-2 test windows, the protocol of
``dipdeploy eval``; speed, Flash and memory come from the runtime's own stats. Flash is the phone's,
emulated: the rows read through the mapping (``--io mmap``, not the engine's default ``auto``) and the
4 KiB blocks holding them paced at ``flash_bandwidth`` (what a device returns: a row smaller than a block,
such as SmolLM2's BQ4 down rows, costs the block), so the rows compare at one device whatever disk
runs the demo. Per-request costs are not emulated here (``run --flash-device`` adds a device profile's);
``benchmarks/flash.py`` and ``benchmarks/iso_runtime.py`` measure real reads.
"""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from dipdeploy import defaults
from dipdeploy.limits import MAX_TOKENS, MAX_WINDOWS, check_caps

Progress = Callable[[str], None]


@dataclass(frozen=True)
class DemoConfig:
    model: str = defaults.MODEL
    #: MLP densities of the DIP-CA bundles: the default one, whose answers stay sane on SmolLM2-135M-Instruct
    #: (``defaults.DENSITY``: benchmarks/results/default-density-smollm2-135m.md), and the paper's ρ = 0.5.
    densities: tuple[float, ...] = (defaults.DENSITY, 0.5)
    quant: str = "bq4"
    input_share: float = 1.1
    windows: int = 2
    seqlen: int = 512
    question: str = "What is the capital of France?"
    max_new_tokens: int = 48
    dram_budget: str = "50%"
    flash_bandwidth: str = "1GB/s"
    out: str = "build/demo"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        if not self.densities or not all(0.0 < d < 1.0 for d in self.densities):
            raise ValueError(f"--density values must lie in (0, 1) (dense runs anyway), got {list(self.densities)}")
        for name in ("windows", "seqlen", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        check_caps(("--windows", self.windows, MAX_WINDOWS, "windows"), ("--seqlen", self.seqlen, MAX_TOKENS, "tokens"),
                   ("--max-new-tokens", self.max_new_tokens, MAX_TOKENS, "tokens"))


@dataclass
class DemoRow:
    label: str
    density: float
    ppl: float
    decode_tok_s: float  # over max_new_tokens, past the EOS when the answer is shorter
    flash_mb_per_token: float  # the missed rows' bytes
    flash_block_mb_per_token: float  # the 4 KiB blocks holding them: what the emulated Flash paces
    dram_mb: float  # the runtime's planned residency: dense weights + KV cache + row caches + staging
    text: str
    finish: str
    new_tokens: int
    bundle: str

    def as_dict(self) -> dict:
        return asdict(self)


def chat_hint(cfg: DemoConfig, bundle: str) -> list[str]:
    """The ``dipdeploy chat`` arguments that talk to ``bundle`` under the demo's own conditions (its budget,
    reads through the mapping paced at its Flash bandwidth), so the speed a user sees there is the one the
    demo's table printed; the engine's default reader would read from this disk instead."""
    return ["chat", bundle, "--dram-budget", cfg.dram_budget, "--io", "mmap", "--flash-bandwidth", cfg.flash_bandwidth]


def run_demo(cfg: DemoConfig, force: bool, progress: Progress) -> tuple[list[DemoRow], bool]:
    """The rows (dense first) and whether the native op library ran them."""
    from dipdeploy.data import load_text
    from dipdeploy.ops.native import library_path, missing_library_hint

    text = load_text("wikitext2", "test", None, cfg.data_dir)  # missing data fails before minutes of work
    native = library_path() is not None
    progress("native op library: " + ("found" if native else "not built, running the ONNX fallback functions "
                                       f"(slower; {missing_library_hint()})"))
    rows = []
    configs = [("dense", 1.0)] + [("DIP-CA", d) for d in cfg.densities]
    for n, (label, density) in enumerate(configs, 1):
        step = f"[{n}/{len(configs)}] {label} ρ = {density:g}:"
        rows.append(_one(cfg, label, density, native, force, text, lambda line, step=step: progress(f"{step} {line}")))
        gc.collect()
    return rows, native


def _one(cfg: DemoConfig, label: str, density: float, native: bool, force: bool, text: str,
         progress: Progress) -> DemoRow:
    from dipdeploy.bundle.manifest import read_manifest
    from dipdeploy.data import windows
    from dipdeploy.eval.perplexity import perplexity
    from dipdeploy.export.bundle import export
    from dipdeploy.export.config import ExportConfig
    from dipdeploy.loading import load_model
    from dipdeploy.runtime import Engine, EngineConfig, Sampler, parse_bandwidth
    from dipdeploy.runtime.template import ChatTemplate, messages
    from dipdeploy.runtime.backends.whole import mlp_row_bytes
    from dipdeploy.sparsity.methods import sparsify_, unsparsify_
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

    method = "dip" if density == 1.0 else "dip-ca"
    rho_in = min(1.0, cfg.input_share * density)
    lm = load_model(cfg.model)
    c = lm.model.config
    plan = uniform_plan(SparsityConfig(method=method, density=density, rho_in=rho_in), lm.name,
                        c.num_hidden_layers, c.hidden_size, c.intermediate_size)
    out = Path(cfg.out) / ("dense" if method == "dip" else f"dipca-{density:g}")
    progress(f"export a {cfg.quant.upper()} bundle → {out}")
    export(lm, ExportConfig(model=cfg.model, method=method, density=density, rho_in=rho_in, quant=cfg.quant,
                            validate_tokens=0), out, plan, force=force)
    progress(f"perplexity on {cfg.windows}×{cfg.seqlen} WikiText-2 test tokens (torch reference of the bundle)")
    unsparsify_(lm.model)  # export leaves it at plain DIP; the reference of a DIP-CA bundle has its cache
    if method == "dip-ca":  # the cache split priced in the bundle's rows, as the runtime prices them
        plan.row_bytes = list(mlp_row_bytes(read_manifest(out), 0))
    sparsify_(lm.model, plan)
    test = windows(lm.tokenizer, text, cfg.seqlen, cfg.windows)
    ppl, _ = perplexity(lm.model, test, 16 if method == "dip-ca" else 1)
    del lm
    gc.collect()
    progress(f"answer through the chat template, DRAM budget {cfg.dram_budget}, Flash at {cfg.flash_bandwidth}")
    engine = Engine(out, EngineConfig(dram_budget=cfg.dram_budget, policy="static" if method == "dip" else "lfu",
                                      native=native, flash_bandwidth=parse_bandwidth(cfg.flash_bandwidth),
                                      io="mmap"))
    try:
        try:
            rendered = ChatTemplate.from_bundle(engine.files, engine.manifest.files).render(messages(cfg.question))
            prompt = engine.encode(rendered, special_tokens=False)  # the template writes its special tokens
        except ValueError as err:  # a base model: no turn format to follow
            progress(f"{err}; continuing the question as raw text")
            prompt = cfg.question
        g = engine.generate(prompt, cfg.max_new_tokens, sampler=Sampler())
        s = g.stats
        if g.finish != "length":  # a short answer times too few tokens: time -n tokens past the EOS too
            progress(f"decode speed over {cfg.max_new_tokens} tokens")
            s = engine.generate(prompt, cfg.max_new_tokens, sampler=Sampler(), stop_at_eos=False).stats
    finally:
        engine.close()
    return DemoRow(label, plan.density, ppl, s.decode_tok_s, s.flash_mb_per_token, s.flash_block_mb_per_token,
                   s.resident["total"] / 1e6, g.text, g.finish, len(g.tokens), str(out))
