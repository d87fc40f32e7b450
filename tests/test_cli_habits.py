"""`run` as llama.cpp and onnxruntime-genai users drive it: the text alone on stdout (stats, prompt and
notes on stderr), `--quiet`, the aliases they type, `-f` prompt files, a random seed that is shown and
repeats the answer, a model given where a bundle is expected, and `--help` readable at 80 columns."""

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.cli import run as run_module
from dipdeploy.terminal import shown

runner = CliRunner()
RUN = ["-n", "3", "--no-native"]


def _run(bundle, *args, **kwargs):
    return runner.invoke(app, ["run", str(bundle), *args, *RUN], **kwargs)


def _one_line_refusal(res, *words):
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output, res.output
    for w in words:
        assert w in res.output, res.output


def test_stdout_holds_the_generated_text_alone(chat_bundle, tmp_path):
    js = tmp_path / "r.json"
    res = _run(chat_bundle, "-p", "Hello there", "--json", str(js))
    assert res.exit_code == 0, res.output
    row = json.loads(js.read_text())
    assert res.stdout == shown(row["text"], lines=True, markup=False) + "\n"  # no prompt, table or "wrote"
    assert f"dipdeploy run {chat_bundle.name}" in res.stderr and "Hello there" in res.stderr
    assert f"wrote {js}" in res.stderr


def test_quiet_prints_the_text_and_nothing_else(chat_bundle):
    res = _run(chat_bundle, "-p", "Hello there", "-q")
    assert res.exit_code == 0, res.output
    assert res.stderr == "" and res.stdout.strip()


def test_a_sampled_run_draws_its_seed_shows_it_and_the_seed_repeats_it(chat_bundle, tmp_path):
    first, again = tmp_path / "a.json", tmp_path / "b.json"
    res = _run(chat_bundle, "-p", "Hi", "--temp", "1.5", "--json", str(first))
    assert res.exit_code == 0, res.output
    seed = json.loads(first.read_text())["seed"]
    assert isinstance(seed, int) and re.search(rf"seed\s+{seed}\b", res.stderr)
    res = _run(chat_bundle, "-p", "Hi", "--temp", "1.5", "-s", str(seed), "--json", str(again))
    assert res.exit_code == 0, res.output
    assert json.loads(again.read_text())["tokens"] == json.loads(first.read_text())["tokens"]
    greedy = [_run(chat_bundle, "-p", "Hi", "-q").stdout for _ in range(2)]
    assert greedy[0] == greedy[1]  # greedy needs no seed
    _one_line_refusal(_run(chat_bundle, "-p", "Hi", "-s", "-1"), "--seed must be >= 0")


@pytest.mark.parametrize("command", ["run", "chat"])
def test_the_aliases_users_type(command):
    params = {p.name: p.opts for p in typer.main.get_command(app).commands[command].params}
    for name, alias in [("temperature", "--temp"), ("repetition_penalty", "--repeat-penalty"), ("context", "-c"),
                        ("threads", "-t"), ("seed", "-s")]:
        assert alias in params[name], (command, name)
    assert {"-f", "--file"} <= set(params["file"])  # run: the prompt; chat: the system prompt
    if command == "run":
        assert {"-q", "--quiet"} <= set(params["quiet"])


def test_the_aliases_set_the_same_options(chat_bundle, tmp_path):
    js = tmp_path / "r.json"
    res = _run(chat_bundle, "-p", "Hi", "--temp", "0.7", "--repeat-penalty", "1.2", "-c", "64", "-t", "1",
               "-s", "7", "--json", str(js))
    assert res.exit_code == 0, res.output
    assert json.loads(js.read_text())["seed"] == 7


def test_a_prompt_file(chat_bundle, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Hello there, é\n", encoding="utf-8")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert _run(chat_bundle, "-f", str(prompt), "--json", str(a)).exit_code == 0
    assert _run(chat_bundle, "-p", "Hello there, é\n", "--json", str(b)).exit_code == 0
    assert json.loads(a.read_text())["text"] == json.loads(b.read_text())["text"]
    assert json.loads(a.read_text())["prompt"] == "Hello there, é\n"
    piped = runner.invoke(app, ["run", str(chat_bundle), "-f", "-", "-q", *RUN], input="Hello there, é\n")
    assert piped.exit_code == 0 and piped.stdout == _run(chat_bundle, "-f", str(prompt), "-q").stdout


def test_prompt_file_refusals(chat_bundle, tmp_path, monkeypatch):
    _one_line_refusal(_run(chat_bundle, "-f", str(tmp_path / "missing.txt")), "does not exist", "--file")
    _one_line_refusal(_run(chat_bundle, "-f", str(tmp_path)), "is a folder")
    _one_line_refusal(_run(chat_bundle), "-p TEXT or -f FILE")
    text = tmp_path / "p.txt"
    text.write_text("hi")
    _one_line_refusal(_run(chat_bundle, "-p", "x", "-f", str(text)), "-p TEXT or -f FILE")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café".encode("latin-1"))
    _one_line_refusal(_run(chat_bundle, "-f", str(latin)), "not UTF-8", "iconv")
    monkeypatch.setattr(run_module, "PROMPT_FILE_LIMIT", 1)
    _one_line_refusal(_run(chat_bundle, "-f", str(text)), "too long for a prompt")


@pytest.mark.parametrize("command", ["run", "chat"])
@pytest.mark.parametrize("kind", ["gguf", "registry", "hf-folder"])
def test_a_model_given_for_a_bundle_is_named_with_the_export_to_run(tmp_path, monkeypatch, command, kind):
    monkeypatch.chdir(tmp_path)
    if kind == "gguf":
        target, what = "model.gguf", "a model file"
        (tmp_path / target).write_bytes(b"GGUF")
    elif kind == "registry":
        target, what = "tiny-llama", "a model of the registry"
    else:
        target, what = "hf", "a Hugging Face model folder"
        (tmp_path / target).mkdir()
        (tmp_path / target / "config.json").write_text("{}")
    args = [command, target] + (["-p", "hi"] if command == "run" else [])
    res = runner.invoke(app, args, input="")
    _one_line_refusal(res, what, "not a bundle", f"dipdeploy export --model {target} --out BUNDLE",
                      f"dipdeploy {command} BUNDLE")


@pytest.mark.parametrize("command", ["run", "chat"])
def test_help_fits_80_columns_in_panels_with_every_option_name_whole(command):
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    for panel in ("Basic:", "Sampling:", "Memory:", "I/O:", "Advanced:"):
        assert panel in lines
    for p in typer.main.get_command(app).commands[command].params:
        for name in p.opts + p.secondary_opts:
            if name.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", res.output), name
    assert not any(line.rstrip().endswith("…") for line in lines)  # rich's mark of a cut cell


def test_chat_reads_its_system_prompt_from_a_file(chat_bundle, tmp_path):
    sysfile = tmp_path / "system.txt"
    sysfile.write_text("Be brief, é.", encoding="utf-8")
    args = ["chat", str(chat_bundle), "-n", "3", "--no-native"]
    by_file = runner.invoke(app, [*args, "-f", str(sysfile)], input="hello\n")
    by_option = runner.invoke(app, [*args, "--system", "Be brief, é."], input="hello\n")
    assert by_file.exit_code == 0, by_file.output
    strip = lambda out: re.sub(r"[\d.]+ tok/s", "", out)  # noqa: E731  (the speed differs run to run)
    assert strip(by_file.stdout) == strip(by_option.stdout)
    _one_line_refusal(runner.invoke(app, [*args, "-f", str(sysfile), "--system", "x"], input=""),
                      "give the system prompt once: --system TEXT or -f FILE")
    _one_line_refusal(runner.invoke(app, [*args, "-f", "-"], input=""), "reads stdin itself")
    _one_line_refusal(runner.invoke(app, [*args, "-f", str(tmp_path / "none.txt")], input=""), "does not exist")


def test_minus_m_names_the_bundle_as_the_positional_does(chat_bundle, tmp_path):
    first = _run(chat_bundle, "-p", "Hello there", "-q")
    by_m = runner.invoke(app, ["run", "-m", str(chat_bundle), "-p", "Hello there", "-q", *RUN])
    by_long = runner.invoke(app, ["run", "--model", str(chat_bundle), "-p", "Hello there", "-q", *RUN])
    both = runner.invoke(app, ["run", str(chat_bundle), "-m", str(chat_bundle), "-p", "Hello there", "-q", *RUN])
    for res in (first, by_m, by_long, both):
        assert res.exit_code == 0, res.output
    assert by_m.stdout == by_long.stdout == both.stdout == first.stdout
    chat = runner.invoke(app, ["chat", "-m", str(chat_bundle), "-n", "3", "--no-native"], input="hello\n")
    assert chat.exit_code == 0 and chat_bundle.name in chat.stdout, chat.output


@pytest.mark.parametrize("command", ["run", "chat"])
def test_minus_m_and_a_different_positional_are_refused_in_one_line(chat_bundle, tmp_path, command):
    other = tmp_path / "other"
    args = [command, str(chat_bundle), "-m", str(other)] + (["-p", "hi"] if command == "run" else [])
    _one_line_refusal(runner.invoke(app, args, input=""), "two bundles given", str(other), "give one")
    args = [command] + (["-p", "hi"] if command == "run" else [])
    _one_line_refusal(runner.invoke(app, args, input=""), "no bundle given", f"dipdeploy {command} -m BUNDLE")


@pytest.mark.parametrize("command", ["eval", "calibrate", "export", "quantize", "trace", "demo", "finetune", "simulate"])
def test_minus_m_is_the_short_form_of_model_where_a_command_takes_one(command):
    params = {p.name: p.opts for p in typer.main.get_command(app).commands[command].params}
    assert {"-m", "--model"} <= set(params["model"]), command
