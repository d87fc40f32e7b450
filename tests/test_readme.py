"""Every command in the ```bash blocks of README.md and of each page under docs/ runs as written (parsed
from the page, so a new line is tested as soon as it is added), in order in one folder per page so
outputs chain (plan.json → eval --plan, export → inspect → run), with substitutions that keep it to
seconds: the default model becomes the tiny registry model and the options that set an amount of work
get small values. The README's ```python blocks run after its commands, in the same folder. A page whose
commands read another page's outputs names the commands that make them in :data:`SETUP`. Every relative
link of README.md and docs/ must name a file that exists."""

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dipdeploy import defaults
from dipdeploy.cli import app
from dipdeploy.registry import get_model, is_registered

from conftest import TINY_CHAT_TEMPLATE

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# every docs page with a ```bash block; each runs in a folder of its own (a parametrized test per page)
DOC_PAGES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")
                   if "```bash" in p.read_text())
TINY = "tiny-llama"
# Options that set how much work a command does → a small value, applied to every command that has the
# option (found by introspection, aliases such as -n included).
FAST = {"--seqlen": "64", "--max-windows": "1", "--windows": "1", "--steps": "2", "--tokens": "32",
        "--max-new-tokens": "4", "--validate-tokens": "4", "--limit": "1"}
# Lines not run, each by an explicit rule (keep this short; the test prints what it skipped).
SKIP_RULES = {
    "make": "Makefile targets set up a venv, or build the shared native library",
    "dipdeploy build-ops": "rebuilds the native op library that the other tests use (`make ops`)",
    "python benchmarks/": "a benchmark script: minutes to hours on real models (docs/benchmarks.md)",
    "pip": "installs into the user's environment; `make wheel-check` builds and installs the wheel in a fresh venv",
}
# Commands a page's lines need and do not run themselves (its inputs from another page), run first.
SETUP = {
    "docs/bundle.md": ["dipdeploy calibrate --method dip --density 0.5 --out plan.json",
                       "dipdeploy finetune --method dip --density 0.5 --steps 2 --out adapter/"],
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
    if "--model" in opts and args[0] not in ("run", "chat"):  # their -m/--model names a bundle, not a model
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


def python_blocks(text: str) -> list[str]:
    """The code of every ```python block."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _run_lines(lines: list[str], where: str) -> tuple[int, list[str]]:
    """Run each line as the test runs it (tiny model, small amounts of work); (lines run, lines skipped)."""
    runner = CliRunner()
    skipped, ran = [], 0
    for line in lines:
        rule = _skip_rule(line)
        if rule is not None:
            skipped.append(f"{line}  ({SKIP_RULES[rule]})")
            continue
        assert line.startswith("dipdeploy "), f"{where} line {line!r} is neither a dipdeploy command nor " \
                                              "skipped by a rule of SKIP_RULES"
        args = fast_args(line)
        res = runner.invoke(app, args, input="")  # stdin at EOF: `chat` ends after its greeting
        assert res.exit_code == 0, f"{where}: {line}\nran: dipdeploy {shlex.join(args)}\n{res.output}"
        assert "Traceback" not in res.output, res.output
        ran += 1
    return ran, skipped


def _prepare(tmp_path, monkeypatch, data_dir) -> None:
    import dipdeploy.loading

    monkeypatch.setattr(dipdeploy.loading, "load_model", _with_chat_template(dipdeploy.loading.load_model))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DIPDEPLOY_DATA", str(data_dir))


def test_every_readme_command_runs(tmp_path, monkeypatch, data_dir, capsys):
    text = README.read_text()
    lines = readme_commands(text)
    assert len(lines) >= 10  # the parser found the blocks
    assert lines[:2] == ["make demo", "make test"], "the README's quick start begins with make demo, make test"
    _prepare(tmp_path, monkeypatch, data_dir)
    ran, skipped = _run_lines(lines, "README")
    blocks = python_blocks(text)
    assert blocks, "the README's Python example is a ```python block"
    for code in blocks:  # the Python example, on what the commands above wrote (the bundle it opens)
        exec(compile(code, "README.md (python block)", "exec"), {"__name__": "__readme__"})
    with capsys.disabled():
        print(f"\nREADME commands: {ran} run, {len(skipped)} skipped, {len(blocks)} python block(s) run:\n  "
              + "\n  ".join(skipped))
    assert len(skipped) <= 4, skipped


@pytest.mark.parametrize("page", DOC_PAGES)
def test_every_docs_command_runs(page, tmp_path, monkeypatch, data_dir, capsys):
    lines = readme_commands((ROOT / page).read_text())
    assert lines, f"{page}: a ```bash block with no command"
    _prepare(tmp_path, monkeypatch, data_dir)
    setup_ran, _ = _run_lines(SETUP.get(page, []), f"{page} (SETUP)")
    ran, skipped = _run_lines(lines, page)
    with capsys.disabled():
        print(f"\n{page} commands: {ran} run ({setup_ran} set-up lines first), {len(skipped)} skipped"
              + "".join(f"\n  {s}" for s in skipped))


def test_readme_and_runtime_design_stay_short():
    """Issue #58: a README read in five minutes, a design note of abstractions, paths, invariants and a
    review checklist; the manual is docs/, the history docs/decisions/ and benchmarks/results/."""
    for path in (README, ROOT / "dipdeploy/runtime/DESIGN.md"):
        assert len(path.read_text().splitlines()) <= 200, f"{path.relative_to(ROOT)} is over 200 lines"


def test_setup_names_pages_that_exist():
    assert set(SETUP) <= set(DOC_PAGES), sorted(set(SETUP) - set(DOC_PAGES))


_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(text: str) -> list[str]:
    """The targets of a page's markdown links that are paths in this repository (not URLs, not anchors),
    without their ``#anchor``; links inside code blocks and inline code do not count."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    out = []
    for m in _LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def test_relative_links_resolve():
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [f"{p.relative_to(ROOT)}: {t}" for p in pages for t in relative_links(p.read_text())
              if not (p.parent / t).exists()]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_link_parser():
    text = "[a](docs/x.md#s) [b](https://x.org) [c](#here) ![p](img.png) `[d](no.md)`\n```\n[e](no.md)\n```\n"
    assert relative_links(text) == ["docs/x.md", "img.png"]


# What docs/ may quote that looks like a measured figure (tests/test_docstrings.py's pattern): definitions,
# option values, sizes that follow from a model's shape, device profiles and the papers' and peers' own
# claims, by page and exact text. A measurement belongs in benchmarks/results/ (the page cites the file);
# the README's headline table is the one exception, and it names its file, machine and date.
DOC_FIGURES_ALLOWED = {
    "docs/arm.md": {"measured here"},  # "their speed on real cores is not measured here"
    "docs/benchmarks.md": {"+1 %", "+3 %"},  # iso_accuracy.py's definition
    "docs/bundle.md": {"5 GB"},  # Hugging Face's shard size
    "docs/decisions/0001-native-cache-step.md": {"0.9×"},  # a goal's section title
    "docs/decisions/0006-reads.md": {"128 KiB"},  # the request cut (dipdeploy.flash.MAX_REQUEST)
    "docs/install.md": {"1.6 GB"},  # the size of the wheels make real-models installs
    "docs/method.md": {  # device profiles, the paper's and the peers' claims, definitions, shapes
        "+1 %", "+3 %", "+40 %", "0.29 tokens/s", "0.8 GB", "1 GB/s", "1.6 KB", "1.8×", "12 GB", "128 KiB",
        "15 % lower", "16 GB", "2.1 GB/s", "25–75 %", "34.1 GB/s", "4 GB", "4.2 GB/s", "40–50 %", "46 % less",
        "60 GB/s", "64 KiB", "7 GB/s", "7.3 GB", "76.8 GB/s", "8 GB", "87 ms", "89.6 GB/s", "9 MB",
        "measured on this"},
    "docs/onnxruntime.md": {"150 MB", "64 KiB"},  # a package's size, the Windows alignment
    "docs/quickstart.md": {"1 GB/s", "1GB/s"},  # the demo's emulated Flash
    "docs/runtime.md": {"0.1 MB", "120MB", "128 KiB", "1GB/s"},  # option values, rounding, the request cut
    "docs/simulator.md": {"4GB"},  # an option value
}


def doc_figures() -> dict[str, set[str]]:
    from test_docstrings import MEASUREMENT

    found = {}
    for p in sorted((ROOT / "docs").rglob("*.md")):
        text = re.sub(r"\s+", " ", p.read_text())
        hits = {m.group(0) for m in MEASUREMENT.finditer(text)}
        if hits:
            found[p.relative_to(ROOT).as_posix()] = hits
    return found


def test_docs_quote_no_measurement():
    found = doc_figures()
    bad = {page: sorted(hits - DOC_FIGURES_ALLOWED.get(page, set())) for page, hits in found.items()}
    bad = {page: hits for page, hits in bad.items() if hits}
    assert not bad, ("docs pages state rules and cite benchmarks/results/; move these figures to a results file "
                     f"(or, for a definition, add it to DOC_FIGURES_ALLOWED): {bad}")
    stale = {page: sorted(allowed - found.get(page, set())) for page, allowed in DOC_FIGURES_ALLOWED.items()}
    stale = {page: hits for page, hits in stale.items() if hits}
    assert not stale, f"no longer in the page, drop from DOC_FIGURES_ALLOWED: {stale}"
