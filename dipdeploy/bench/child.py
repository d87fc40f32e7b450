"""One run of the memory suite, in a process of its own (``python -m dipdeploy.bench.child SPEC``).

Why a process: its peak resident memory (``VmHWM``) and its cgroup's peak are the run's alone, not the
parent's imports or an earlier run's freed pages. The spec is JSON: the bundle, the engine's options
(budget, io, threads, policy, context), the prompt length ``n_prompt`` and the decode steps ``n_gen``.
It opens the engine, feeds a prompt of ``n_prompt`` tokens (``dipdeploy.bench.decode.prompt_ids``; one
token when 0) and generates ``n_gen`` + 1 tokens greedily, end-of-sequence ignored, then prints one JSON
line: the planned residency, ``/proc/self/status`` after the imports, after the engine opened and at the
end, and the run's tokens/s. A budget the engine refuses (under the group's limit, ``check_budget``) is a
``refused`` line, not a failure; a kill by the limit leaves no line (the parent reads the exit status).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    from dipdeploy.runtime.stats import memory_now

    imports = memory_now()
    from dipdeploy.bench.decode import prompt_ids
    from dipdeploy.runtime import Engine, EngineConfig
    from dipdeploy.runtime.sampler import Sampler

    options = {k: spec[k] for k in ("dram_budget", "io", "threads", "context") if spec.get(k) is not None}
    if spec.get("policy"):
        options["policy"] = spec["policy"]
    try:
        engine = Engine(spec["bundle"], EngineConfig(**options))
    except ValueError as err:  # the budget does not fit under the limit, or a bad option: said, not crashed
        print(json.dumps({"status": "refused", "why": " ".join(str(err).split())}), flush=True)
        return 0
    opened = memory_now()
    ids = prompt_ids(engine, max(spec["n_prompt"], 1))
    g = engine.generate(ids, spec["n_gen"] + 1, sampler=Sampler(temperature=0.0), stop_at_eos=False)
    end = memory_now()
    print(json.dumps({"status": "ok", "planned": engine.residency.total, "imports": imports, "opened": opened,
                      "end": end, "prefill_tok_s": g.stats.prefill_tok_s, "decode_tok_s": g.stats.decode_tok_s,
                      "io": g.stats.io}), flush=True)
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
