"""Upper bounds on the counts a user gives or a file declares, each written once (floor 1, no imports).

A count read from a flag, a trace, a registry file or a model's config sizes loops, allocations and
threads before any work starts, so a mistyped or hostile value (``--io-threads 100000``, ``num_layers =
1e12``) would exhaust memory, threads or time before a later check could say why. Each bound sits far
above every real model and device the project targets, so only such values meet it, and each refusal
names the bound and the value to give instead (:func:`check_count`).
"""

from __future__ import annotations

#: Tokens: a context, an answer's --max-new-tokens, a prefill chunk, an eval window, a trace's length.
#: Above every registry model's positions; the KV cache and the windows' tensors scale with it.
MAX_TOKENS = 1 << 20
#: Decoder layers of a model, a trace or a plan (the readers make one entry, graph or loop per layer).
MAX_LAYERS = 4096
#: A hidden or MLP width (rows of one group), attention heads, a vocabulary: far above every LLM's.
MAX_WIDTH = 1 << 22
#: Windows, problems or points of an evaluation, calibration or sweep: each costs a forward pass or a run.
MAX_WINDOWS = 1 << 16
#: Windows run side by side (eval --batch-size): their activations are held at once.
MAX_BATCH = 1024
#: Compute threads (ORT intra-op, torch): beyond a machine's cores they only contend, and on the runtime's
#: per-layer path each session starts its own pool, so a mistyped count would exhaust the process's threads.
MAX_THREADS = 256
#: The predictor baseline's rank (eval --predictor-rank; also at most the model's width) and its Adam steps per
#: layer (--predictor-steps): each step is a pass over a batch of calibration tokens for every layer.
MAX_PREDICTOR_RANK = 4096
MAX_PREDICTOR_STEPS = 100_000


def check_count(value, name: str, low: int, high: int, unit: str = "") -> int:
    """``value`` when it is an integer in [``low``, ``high``]; else ValueError with one line naming
    ``name`` (an option or a field), the bound and what to give."""
    unit = f" {unit}" if unit else ""
    if type(value) is not int:
        raise ValueError(f"{name} must be a whole number{unit} in [{low}, {high}], got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}{unit}, got {value}")
    if value > high:
        raise ValueError(f"{name} {value} is over the cap of {high}{unit}; give {high} or less")
    return value


def check_caps(*counts: tuple[str, object, int, str]) -> None:
    """For each (name, value, cap, unit): ValueError with one line when ``value`` (not None) is over
    ``cap``; the lower bounds stay with each owner's own checks."""
    for name, value, cap, unit in counts:
        if value is not None and type(value) is int and value > cap:
            raise ValueError(f"{name} {value} is over the cap of {cap}{' ' + unit if unit else ''}; give {cap} or less")
