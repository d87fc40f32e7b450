"""Speculative decoding: several tokens per sweep of the MLP rows.

Under a memory limit a decoded token is bound by the rows it reads from Flash. Here a draft proposes up
to K tokens, and the target checks them in one verification pass (``Decoder.verify``): the K + 1 tokens
run as one batch, so the union of their selected rows is read once, in the bundle's order, through the
same caches, reader and counters as decode (the batched prefill's semantics: ``dipdeploy/runtime/DESIGN.md``,
"Prefill"), and the target's logits after every token decide how many drafts are kept. The KV cache is
then cut back to the kept tokens (``KvCache.truncate``: the length alone with GroupQueryAttention, a
repack with standard attention); the row caches keep what the pass brought in, as a cache does.

Acceptance. Greedy (temperature 0): a draft is kept while it equals the target's choice after the tokens
before it; the first mismatch is replaced by that choice, and when every draft is kept the pass's last
logits give one more token. Sampling: the speculative-sampling rule (Leviathan et al. 2023, Chen et al.
2023): draft d, drawn from the draft's distribution q, is kept with probability min(1, p(d) / q(d)),
where p is the target's distribution after the same tokens (both through the ``Sampler``'s penalty,
temperature, top-k and top-p), else the token is drawn from max(0, p − q) renormalised; every emitted
token is then distributed as the target's sampler would draw it.

What is guaranteed (greedy). Every emitted token is the target's greedy choice after the tokens before
it, computed by a verification pass in which each token selects against the caches as they stood when
the pass began. At γ = 1 (plain DIP), or where every row is resident, a selection does not depend on the
cache, so the output is the non-speculative greedy output of the same bundle and budget, up to the
floating-point summation of a batched run (docs/numerics.md's agreement rule; ``tests/test_speculate.py``).
At γ < 1 the non-speculative run selects against a cache that changes after every token, the
speculative one against the cache at its pass's start: both are DIP-CA at the same γ over different
cache histories, and they need not agree token for token.

Drafts:

* ``CacheDraft`` (``--draft cache``): the target itself in draft mode (``Decoder.draft_mode``): each layer
  multiplies only the selected rows its caches hold, reads nothing and changes no cache. It costs no
  Flash read and no memory beyond the verification's logits.
* ``NgramDraft`` (``--draft ngram``): the tokens that followed an earlier occurrence of the sequence's
  last few tokens (prompt lookup); no model at all.
* ``ModelDraft`` (``--draft BUNDLE``): a second engine on a smaller bundle of the same tokenizer, every row
  resident; its plan comes out of the same ``--dram-budget`` (``open_model_draft``), so a comparison with
  plain decoding is at equal memory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol

import numpy as np

from dipdeploy.runtime.budget import DramBudget
from dipdeploy.runtime.config import EngineConfig
from dipdeploy.runtime.embedding import check_token_ids
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.runtime.stats import Timer

#: ``--draft``'s value for the target drafting from its own caches
CACHE_DRAFT = "cache"
#: ``--draft``'s value for drafts copied from the sequence itself (prompt lookup)
NGRAM_DRAFT = "ngram"
#: prompt lookup: the longest suffix of the sequence searched for an earlier occurrence, in tokens
NGRAM_MAX = 3
#: ``--draft``'s default: prompt lookup was kept more often and decoded faster than the cache draft in every
#: row of benchmarks/results/speculate.md
DEFAULT_DRAFT = NGRAM_DRAFT


@dataclass
class SpeculationStats:
    """What speculation did in one generation: verification passes, draft tokens proposed and kept, and
    the seconds spent drafting and verifying."""

    passes: int = 0
    plain: int = 0  # tokens decoded plainly: a draft with nothing to propose, or no room for one
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0

    @property
    def acceptance(self) -> float:
        """The share of draft tokens the target kept."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Tokens emitted per verification pass: the kept drafts plus the target's own token of each pass."""
        return (self.accepted + self.passes) / self.passes if self.passes else 0.0

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "acceptance": self.acceptance, "tokens_per_pass": self.tokens_per_pass}


class Draft(Protocol):
    """Proposes up to ``k`` tokens after ``engine``'s sequence followed by ``first`` (not fed yet)."""

    name: str

    def propose(self, engine, first: int, k: int, sampler: Sampler, timer: Timer) -> tuple[list[int], list]:
        """The draft tokens and, per token, the distribution it was drawn from (None when greedy).
        ``engine``'s sequence is as it was on return."""

    def close(self) -> None: ...


class CacheDraft:
    """The target drafting from its own caches (module docstring): ``k`` steps in draft mode over the KV
    cache's next positions, which are then cut back off."""

    name = CACHE_DRAFT

    def propose(self, engine, first: int, k: int, sampler: Sampler, timer: Timer) -> tuple[list[int], list]:
        pos = engine._state["pos"]
        context = engine._state["ids"] + [first]
        tokens, dists, tok = [], [], first
        engine.backend.draft_mode(True)
        try:
            for _ in range(k):
                logits = engine.backend.step(tok, timer, None)
                tok, q = sampler.draw(logits, context)
                tokens.append(tok)
                dists.append(q)
                context.append(tok)
        finally:
            engine.backend.draft_mode(False)
            engine.truncate(pos)
        return tokens, dists

    def close(self) -> None:
        pass


class NgramDraft:
    """Drafts copied from the sequence itself (prompt lookup decoding, as transformers'
    ``prompt_lookup_num_tokens`` and vLLM's n-gram speculator): the tokens that followed the latest earlier
    occurrence of the sequence's last ``n`` tokens (``n`` from ``NGRAM_MAX`` down to 1), up to ``k`` of them.
    No model runs, nothing is read, nothing is held; code and answers that quote their prompt repeat
    long spans. No occurrence: no draft, and the token is decoded plainly."""

    name = NGRAM_DRAFT

    def propose(self, engine, first: int, k: int, sampler: Sampler, timer: Timer) -> tuple[list[int], list]:
        seq = engine._state["ids"] + [first]
        for n in range(min(NGRAM_MAX, len(seq) - 1), 0, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):  # the latest occurrence first
                if seq[start:start + n] == tail:
                    drafts = seq[start + n:start + n + k]
                    if sampler.temperature > 0:  # a copied token's draft distribution is certain
                        dists = [np.eye(1, engine.vocab_rows, t, dtype=np.float64)[0] for t in drafts]
                    else:
                        dists = [None] * len(drafts)
                    return drafts, dists
        return [], []

    def close(self) -> None:
        pass


class ModelDraft:
    """A smaller bundle of the same tokenizer as the draft (module docstring). Its engine keeps the tokens
    both engines have fed in its KV cache and catches up on the rest in one batched run per proposal."""

    def __init__(self, engine):
        self.engine = engine
        self.name = str(engine.path)

    def propose(self, engine, first: int, k: int, sampler: Sampler, timer: Timer) -> tuple[list[int], list]:
        d = self.engine
        want = engine._state["ids"] + [first]
        have = d._state["ids"] if d._state is not None else []
        same = 0
        for a, b in zip(have, want):
            if a != b:
                break
            same += 1
        same = min(same, len(want) - 1)  # feed at least ``first``: its logits give the first draft
        if d._state is None:
            d.reset()
        d.truncate(same)
        logits = d.prefill(want[same:], timer)
        context, tokens, dists = list(want), [], []
        for j in range(k):
            tok, q = sampler.draw(logits, context)
            tokens.append(tok)
            dists.append(q)
            context.append(tok)
            if j < k - 1:
                logits = d.step(tok, timer)
        return tokens, dists

    def close(self) -> None:
        self.engine.close()


def open_model_draft(cfg: EngineConfig, path: str | Path) -> tuple[ModelDraft, EngineConfig]:
    """The draft engine on bundle ``path`` (every row resident, ``cfg``'s threads and context) and the
    target's configuration with the draft's plan taken out of its ``--dram-budget``, which must then be a
    size: a share of the target's MLP rows cannot pay for another model's bytes."""
    from dipdeploy.runtime.engine import Engine

    budget = DramBudget.parse(cfg.dram_budget)
    if budget.total_bytes is None:
        raise ValueError(f"--draft {path}: give --dram-budget as a size (e.g. 600MB), so that the draft's weights "
                         f"come out of the same budget; {budget} is a share of the target's MLP rows")
    draft = Engine(path, EngineConfig(dram_budget="100%", threads=cfg.threads, thread_pool=cfg.thread_pool,
                                      context=cfg.context, prefill_chunk=max(cfg.prefill_chunk, 2),
                                      verify=cfg.verify))
    held = draft.backend.residency.total
    if held >= budget.total_bytes:
        draft.close()
        raise ValueError(f"--draft {path}: the draft alone holds {held / 1e6:.1f} MB, the whole --dram-budget of "
                         f"{budget}; give a larger budget or a smaller draft")
    return ModelDraft(draft), dataclasses.replace(cfg, dram_budget=f"{budget.total_bytes - held}B")


def check_draft(engine, draft: Draft) -> None:
    """Refuse a draft the target cannot verify: another tokenizer, or a speculation the engine was not
    planned for (``EngineConfig.speculate``)."""
    if engine.cfg.speculate < 1:
        raise ValueError("this engine was opened without speculation: give EngineConfig(speculate=K) (--speculate K)")
    other = getattr(draft, "engine", None)
    if other is not None and other.tokenizer.get_vocab() != engine.tokenizer.get_vocab():
        raise ValueError(f"--draft {draft.name}: its tokenizer differs from the target's; a draft must share the "
                         f"target's vocabulary")


def accept(sampler: Sampler, drafts: list[int], dists: list, logits: np.ndarray,
           context: list[int]) -> tuple[int, int]:
    """How many of ``drafts`` the target keeps, and the token that follows them (module docstring,
    "Acceptance"). ``logits`` [len(drafts) + 1, V]: the target's after the pass's first token and after
    each draft; ``context``: the sequence before the drafts (its first token included)."""
    context = list(context)
    for i, d in enumerate(drafts):
        if sampler.temperature == 0.0:
            best = int(np.argmax(sampler.penalise(logits[i], context)))
            if best != d:
                return i, best
        else:
            p, q = sampler.probabilities(logits[i], context), dists[i]
            if sampler._rng.random() * q[d] >= p[d]:  # kept with probability min(1, p(d) / q(d))
                rest = np.maximum(p - q, 0.0)
                return i, sampler.pick(rest / rest.sum())
        context.append(d)
    return len(drafts), sampler.draw(logits[len(drafts)], context)[0]


def tokens(engine, draft: Draft, logits: np.ndarray, sampler: Sampler, max_new_tokens: int, timer: Timer,
           stats: SpeculationStats, clock: Callable[[], float]) -> Iterator[tuple[int, np.ndarray | None]]:
    """The generated tokens, each with the logits it was chosen from (the target's), for ``Engine.extend``:
    the first from ``logits`` (after the prompt), then per verification pass the kept drafts and the
    target's own token. The engine's sequence may hold tokens past the last one consumed; the consumer
    cuts it back (``Engine.extend``)."""
    k = engine.cfg.speculate
    tok, _ = sampler.draw(logits, engine._state["ids"])
    yield tok, logits
    made = 1
    while made < max_new_tokens:
        n = min(k, max_new_tokens - made - 1, engine.cfg.context - engine._state["pos"] - 1)
        t0 = clock()
        drafts, dists = draft.propose(engine, tok, n, sampler, timer) if n > 0 else ([], [])
        check_token_ids(drafts, engine.vocab_rows)
        t1 = clock()
        stats.draft_s += t1 - t0
        if not drafts:  # no room for a draft, or nothing proposed: one plain step
            logits = engine.step(tok, timer)
            tok, _ = sampler.draw(logits, engine._state["ids"])
            made += 1
            stats.plain += 1
            yield tok, logits
            continue
        pos, context = engine._state["pos"], engine._state["ids"] + [tok]
        checked = engine.backend.verify([tok] + drafts, timer)
        kept, nxt = accept(sampler, drafts, dists, checked, context)
        rows = checked[: kept + 1].copy()
        engine.truncate(pos + 1 + kept)
        stats.passes += 1
        stats.drafted += len(drafts)
        stats.accepted += kept
        stats.verify_s += clock() - t1
        for i in range(kept):
            yield drafts[i], rows[i]
        tok = nxt
        made += kept + 1
        yield tok, rows[kept]
