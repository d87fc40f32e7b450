"""Every command in README.md's ```bash blocks runs as written (parsed from the README, so a new line is
tested as soon as it is added), in order in one folder so outputs chain (plan.json → eval --plan,
export → inspect → run), with substitutions that keep it to seconds: the default model becomes the tiny
registry model and the options that set an amount of work get small values."""

import re
import shlex
from pathlib import Path

import typer
from typer.testing import CliRunner

from dipdeploy import defaults
from dipdeploy.cli import app
from dipdeploy.registry import get_model, is_registered

from conftest import TINY_CHAT_TEMPLATE

README = Path(__file__).resolve().parents[1] / "README.md"
TINY = "tiny-llama"
# Options that set how much work a command does → a small value, applied to every command that has the
# option (found by introspection, aliases such as -n included).
FAST = {"--seqlen": "64", "--max-windows": "1", "--windows": "1", "--steps": "2", "--tokens": "32",
        "--max-new-tokens": "4", "--validate-tokens": "4", "--limit": "1"}
# Lines not run, each by an explicit rule (keep this short; the test prints what it skipped).
SKIP_RULES = {
    "make": "Makefile targets set up a venv, or build the shared native library",
    "dipdeploy build-ops": "rebuilds the native op library that the other tests use (`make ops`)",
}


def readme_commands(text: str) -> list[str]:
    """The shell lines of every ```bash block: comments stripped, backslash continuations joined."""
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                lines.append(shlex.join(words))
    return lines


def _options(name: str) -> dict[str, list[str]]:
    """Each option of a command: its canonical long name → every spelling (e.g. --max-new-tokens, -n)."""
    cmd = typer.main.get_command(app).commands[name]
    out = {}
    for p in cmd.params:
        spellings = [o for o in p.opts + p.secondary_opts if o.startswith("-")]
        if spellings:
            out[max(spellings, key=len)] = spellings
    return out


def _set(args: list[str], spellings: list[str], value: str) -> list[str]:
    """``args`` with the option (any spelling) set to ``value``: replaced where given, else appended."""
    for i, a in enumerate(args):
        if a in spellings and i + 1 < len(args):
            return args[:i + 1] + [value] + args[i + 2:]
    return args + [spellings[0], value]


def fast_args(line: str) -> list[str]:
    """The CLI arguments of a README line, with the tiny model and small amounts of work."""
    args = shlex.split(line)[1:]
    opts = _options(args[0])
    if "--model" in opts:
        given = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in opts["--model"]), None)
        # a registry model other than the default stays for simulate (it projects onto its shape); the
        # default model, a real model another command would load, a local path or a hub id become the tiny one
        real = given is not None and is_registered(given) and get_model(given).source is not None
        if given is None or given == defaults.MODEL or not is_registered(given) or (real and args[0] != "simulate"):
            args = _set(args, opts["--model"], TINY)
    for option, value in FAST.items():
        if option in opts:
            args = _set(args, opts[option], value)
    return args


def _skip_rule(line: str) -> str | None:
    return next((rule for rule in SKIP_RULES if line == rule or line.startswith(rule + " ")), None)


def test_readme_parser_handles_comments_continuations_and_new_options():
    text = "```bash\ndipdeploy run b -p \"a # b\" --top-k 5 \\\n  -n 64  # comment\nmake demo\n```\n"
    assert readme_commands(text) == ["dipdeploy run b -p 'a # b' --top-k 5 -n 64", "make demo"]
    args = fast_args("dipdeploy run b -p Hi -n 64")
    assert args[args.index("-n") + 1] == "4" and "--max-new-tokens" not in args
    ev = fast_args("dipdeploy eval --method dip")
    assert ev[ev.index("--max-windows") + 1] == "1" and ev[ev.index("--model") + 1] == TINY
    sim = fast_args("dipdeploy simulate --trace t.npz --model phi-3-medium")
    assert sim[sim.index("--model") + 1] == "phi-3-medium"
    exp = fast_args("dipdeploy export --model ~/models/Mistral-7B-v0.1 --out m")
    assert exp[exp.index("--model") + 1] == TINY
    assert get_model(TINY).is_tiny


def _with_chat_template(load_model):
    """The README's model is an instruct model whose bundle carries a chat template (`chat`, `run --chat`
    need one); the tiny stand-in gets the test suite's template the same way ``chat_bundle`` does."""
    import copy
    import dataclasses

    def load(name, *args, **kwargs):
        lm = load_model(name, *args, **kwargs)
        if getattr(lm.tokenizer, "chat_template", None):
            return lm
        tokenizer = copy.deepcopy(lm.tokenizer)
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
        return dataclasses.replace(lm, tokenizer=tokenizer)

    return load


def test_every_readme_command_runs(tmp_path, monkeypatch, data_dir, capsys):
    import dipdeploy.loading

    lines = readme_commands(README.read_text())
    assert len(lines) >= 10  # the parser found the blocks
    monkeypatch.setattr(dipdeploy.loading, "load_model", _with_chat_template(dipdeploy.loading.load_model))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DIPDEPLOY_DATA", str(data_dir))
    runner = CliRunner()
    skipped, ran = [], 0
    for line in lines:
        rule = _skip_rule(line)
        if rule is not None:
            skipped.append(f"{line}  ({SKIP_RULES[rule]})")
            continue
        assert line.startswith("dipdeploy "), f"README line {line!r} is neither a dipdeploy command nor skipped " \
                                              "by a rule of SKIP_RULES"
        args = fast_args(line)
        res = runner.invoke(app, args, input="")  # stdin at EOF: `chat` ends after its greeting
        assert res.exit_code == 0, f"README: {line}\nran: dipdeploy {shlex.join(args)}\n{res.output}"
        assert "Traceback" not in res.output, res.output
        ran += 1
    with capsys.disabled():
        print(f"\nREADME commands: {ran} run, {len(skipped)} skipped:\n  " + "\n  ".join(skipped))
    assert len(skipped) <= 4, skipped
