"""Recording what the per-layer path selects: the trace of a run (``generate(trace=...)``), the future
selections Belady's policy needs (a first pass with no cache), and teacher forcing (logits and selections
of a sequence fed given tokens, to compare with another implementation). Functions over an
:class:`~dipdeploy.runtime.engine.Engine`; the one-session and joined decoders record no selections and
refuse. Torch-free (floor 5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dipdeploy.runtime.embedding import check_token_ids
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.runtime.stats import Timer

if TYPE_CHECKING:
    from dipdeploy.runtime.engine import Engine


def trace_recorder(engine: Engine):
    """A ``TraceRecorder`` for ``generate(trace=...)``: source "runtime", this bundle's shape and K,
    the run's γ and policy (the simulator reads the file)."""
    from dipdeploy.trace import TraceRecorder, mlp_density

    m = engine.manifest
    density = sum(mlp_density(ki, kg, engine.d, engine.f) for ki, kg in engine.k) / len(engine.k)
    return TraceRecorder(source="runtime", model=str(m.source.get("model")), hidden_size=engine.d,
                         intermediate_size=engine.f, num_layers=engine.num_layers,
                         method=m.method if engine.gamma == 1.0 or m.method == "dip-ca" else "dip-ca",
                         density=density, gamma=engine.gamma, score=(m.plan or {}).get("score", "abs"),
                         policy=engine.cfg.policy, meta={"budget": str(engine.cfg.dram_budget)})


def feed(trace, record):
    """The ``record`` callback ``Engine.extend`` hands the decoder: each layer's selections and hits into
    ``trace`` (a ``TraceRecorder``) and to ``record``; None when neither is given."""
    if trace is None and record is None:
        return None

    def note(i, s_in, s_glu, h_in, h_glu):
        if trace is not None:
            trace.record(i, s_in[None], s_glu[None], hits_in=h_in[None], hits_glu=h_glu[None])
        if record is not None:
            record(i, s_in, s_glu, h_in, h_glu)

    return note


def teacher_forced(engine: Engine, prompt: list[int], tokens: list[int]) -> tuple[list[np.ndarray], list[dict]]:
    """A new sequence fed ``prompt`` then ``tokens[:-1]``: the next-token logits [V] after the prompt
    and after each fed token, to compare with another implementation fed the same tokens
    (``dipdeploy.agreement.compare_logits``), and the selections per fed position,
    ``{(layer, "in" | "glu"): indices [K]}`` (what ``dipdeploy.sparsity.twin.follow`` takes)."""
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token")
    if len(prompt) + len(tokens) > engine.cfg.context:
        raise ValueError(f"{len(prompt) + len(tokens)} tokens exceed the context of {engine.cfg.context}")
    check_token_ids([*prompt, *tokens], engine.vocab_rows)  # before any token is fed
    engine.reset()
    timer, sel = Timer(), []

    def keep(i, s_in, s_glu, _h_in, _h_glu):
        if i == 0:
            sel.append({})
        sel[-1][(i, "in")], sel[-1][(i, "glu")] = s_in.copy(), s_glu.copy()

    for t in prompt[:-1]:
        engine.step(int(t), timer, keep)
    out = [engine.step(int(prompt[-1]), timer, keep)]
    out += [engine.step(int(t), timer, keep) for t in tokens[:-1]]
    return out, sel


def record_future(engine: Engine, ids, max_new_tokens, sampler, stop_at_eos) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each layer's (up|gate, down) selections of the sequence ``generate`` is about to run, recorded in a
    pass with no cache (policy "none"): the future Belady's policy evicts by (γ = 1 only)."""
    if engine.gamma != 1.0:
        raise ValueError(f"policy 'belady' needs selections that do not depend on the cache (γ = 1), got "
                         f"γ = {engine.gamma}; Belady is the offline bound for plain DIP")
    sel: list[tuple[list, list]] = [([], []) for _ in range(engine.num_layers)]

    def keep(i, s_in, s_glu, _h1, _h2):
        sel[i][0].append(s_in.copy())
        sel[i][1].append(s_glu.copy())

    s = sampler or Sampler()
    s.reset()
    engine.reset(policy="none")
    engine.extend(ids, max_new_tokens, s, None, None, False, stop_at_eos, None, record=keep)
    return [(np.stack(a), np.stack(b)) for a, b in sel]
