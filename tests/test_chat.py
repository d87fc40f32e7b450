"""The chat loop without a terminal, on a tiny bundle with a chat template: blank lines ignored, Ctrl-C
during an answer keeps the partial answer, a full context drops the oldest turns and keeps the system
prompt, an answer cut at the token limit is marked; Belady is refused, never replaced."""

from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.runtime import Engine, Sampler
from dipdeploy.runtime.chat import Chat, Interrupt, repl


def _lines(*lines):
    """An ``input`` that answers these lines, then Ctrl-D (EOFError)."""
    it = iter(lines)

    def read(_prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return read


def _chat(bundle, context=256, system=None):
    return Chat(Engine(bundle, native=False, context=context), Sampler(), system)


def _run(chat, read, n=6, write=None, interrupt=None):
    out, notes = [], []
    repl(chat, read, write or out.append, notes.append, n, interrupt or Interrupt())
    return "".join(out), notes


def test_blank_lines_are_ignored_and_ctrl_d_quits(chat_bundle):
    chat = _chat(chat_bundle)
    _out, notes = _run(chat, _lines("   ", "", "\t", "hello"))
    assert [m["role"] for m in chat.turns] == ["user", "assistant"] and chat.turns[0]["content"] == "hello"
    assert any("tok/s" in n for n in notes)


def test_ctrl_c_at_the_prompt_quits(chat_bundle):
    chat = _chat(chat_bundle)

    def read(_prompt):
        raise KeyboardInterrupt

    _run(chat, read)
    assert chat.turns == []


def test_an_answer_cut_at_the_token_limit_is_marked(chat_bundle):
    chat = _chat(chat_bundle)
    _out, notes = _run(chat, _lines("hello"), n=3)
    assert not set(chat.engine.sequence) & chat.engine.eos_ids()  # (greedy tiny-llama does not say EOS here)
    assert any("stopped at 3 tokens" in n and "-n" in n for n in notes)


def test_ctrl_c_during_an_answer_keeps_the_partial_answer_and_continues(chat_bundle):
    chat, interrupt = _chat(chat_bundle), Interrupt()
    shown = []

    def write(piece):
        shown.append(piece)
        if len(shown) == 2:  # Ctrl-C after the second piece of the first answer
            interrupt.requested = True

    _run(chat, _lines("first question", "second question"), n=12, write=write, interrupt=interrupt)
    assert [m["content"] for m in chat.turns if m["role"] == "user"] == ["first question", "second question"]
    partial = chat.turns[1]["content"]
    assert partial == "".join(shown[:2])  # what was on the screen is what the conversation keeps
    # the second turn continued from the conversation that holds the partial answer
    ids = chat.engine.encode(chat.template.render(chat.history[:3], add_generation_prompt=True))
    assert chat.engine.sequence[: len(ids)] == ids


def test_a_full_context_drops_the_oldest_turns_and_keeps_the_system_prompt(chat_bundle):
    chat = _chat(chat_bundle, context=160, system="sys prompt")
    questions = [f"question number {i} here" for i in range(6)]
    _out, notes = _run(chat, _lines(*questions), n=8)
    assert any("context of 160 tokens full" in n and "dropped" in n for n in notes)
    users = [m["content"] for m in chat.turns if m["role"] == "user"]
    assert users[-1] == questions[-1] and users[0] != questions[0]  # all answered, the oldest dropped
    system_ids = chat.engine.encode(chat.template.render(chat.system, add_generation_prompt=False))
    assert chat.engine.sequence[: len(system_ids)] == system_ids
    assert len(chat.engine.sequence) <= 160


def test_a_message_longer_than_the_context_is_refused_and_the_chat_goes_on(chat_bundle):
    chat = _chat(chat_bundle, context=64)
    _out, notes = _run(chat, _lines("x" * 100, "hi"), n=4)
    assert any("exceed the context of 64" in n for n in notes)
    assert [m["content"] for m in chat.turns if m["role"] == "user"] == ["hi"]


def test_belady_is_refused_in_chat_in_one_line(chat_bundle):
    res = CliRunner().invoke(app, ["chat", str(chat_bundle), "--policy", "belady", "--no-native"], input="hi\n")
    assert res.exit_code == 2 and "belady" in res.output and "recorded" in res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_run_belady_on_a_cache_aware_bundle_is_refused_not_replaced(chat_bundle):
    res = CliRunner().invoke(app, ["run", str(chat_bundle), "-p", "hi", "-n", "2", "--policy", "belady",
                                   "--no-native"])
    assert res.exit_code == 2 and "γ = 1" in res.output and len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["run", str(chat_bundle), "-p", "hi", "-n", "2", "--policy", "belady",
                                   "--gamma", "1", "--no-native"])
    assert res.exit_code == 0 and "belady" in res.output


def test_run_chat_formats_the_prompt_with_the_template(chat_bundle, tmp_path):
    js = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["run", str(chat_bundle), "-p", "hi", "-n", "3", "--chat", "--system", "S",
                                   "--no-native", "--json", str(js)])
    assert res.exit_code == 0, res.output
    import json

    row = json.loads(js.read_text())
    eng = Engine(chat_bundle, native=False)
    assert row["prompt_tokens"] == len(eng.encode("<|system|>S</s>\n<|user|>hi</s>\n<|assistant|>"))


def test_chat_cli_streams_answers_on_a_piped_stdin(chat_bundle):
    res = CliRunner().invoke(app, ["chat", str(chat_bundle), "-n", "3", "--no-native", "--system", "S"],
                             input="  \nhello\n")
    assert res.exit_code == 0, res.output
    assert "tok/s" in res.output and "Traceback" not in res.output


def test_exit_ends_the_chat_before_the_lines_after_it(chat_bundle):
    chat = _chat(chat_bundle)
    _out, notes = _run(chat, _lines("hello", "/exit", "never read"))
    assert [m["content"] for m in chat.turns if m["role"] == "user"] == ["hello"]


def test_clear_starts_a_new_conversation_and_keeps_the_system_prompt(chat_bundle):
    chat = _chat(chat_bundle, system="sys prompt")
    _out, notes = _run(chat, _lines("first", "/clear", "second"))
    assert [m["content"] for m in chat.turns if m["role"] == "user"] == ["second"]
    assert any("new conversation" in n for n in notes) and chat.history[0]["content"] == "sys prompt"
    ids = chat.engine.encode(chat.template.render(chat.history[:2], add_generation_prompt=True))
    assert chat.engine.sequence[: len(ids)] == ids  # the answer to "second" read "first" nowhere


def test_help_and_set_change_the_sampling_and_refusals_are_one_line(chat_bundle):
    chat = _chat(chat_bundle)
    _out, notes = _run(chat, _lines("/help", "/set temp 0.7", "/set top_p 0.9", "/set seed 5", "/set top-k 3",
                                    "/set repeat_penalty 1.2", "/set temp hot", "/set top_p 2", "/set volume 3",
                                    "/frobnicate", "/set"))
    assert "/clear" in notes[0] and "/set" in notes[0] and "/exit" in notes[0]
    s = chat.sampler
    assert (s.temperature, s.top_p, s.seed, s.top_k, s.repetition_penalty) == (0.7, 0.9, 5, 3, 1.2)
    refusals = notes[6:10]
    assert "/set temp hot: not a number" in refusals[0] and "stays temp 0.7" in refusals[0]
    assert "--top-p must lie in (0, 1]" in refusals[1]
    assert "NAME one of temp" in refusals[2] and "unknown command /frobnicate" in refusals[3]
    assert all("\n" not in n for n in notes) and notes[-1].startswith("temp 0.7, top_k 3")
    assert chat.turns == []  # no command reached the model


def test_set_seed_repeats_a_sampled_answer(chat_bundle):
    answers = []
    for _ in range(2):
        chat = _chat(chat_bundle)
        _run(chat, _lines("/set temp 1.5", "/set seed 11", "hello"), n=6)
        answers.append(chat.turns[-1]["content"])
    assert answers[0] == answers[1]


def test_a_double_slash_sends_a_message_that_begins_with_a_slash(chat_bundle):
    chat = _chat(chat_bundle)
    _run(chat, _lines("//usr/bin is a folder"))
    assert chat.turns[0]["content"] == "/usr/bin is a folder"


def test_chat_cli_takes_commands_on_a_piped_stdin(chat_bundle):
    res = CliRunner().invoke(app, ["chat", str(chat_bundle), "-n", "3", "--no-native"],
                             input="/help\n/set temp 0.5\n/exit\nnot read\n")
    assert res.exit_code == 0, res.output
    assert "/clear" in res.output and "temp 0.5" in res.output and "tok/s" not in res.output


def test_line_editing_keeps_a_capped_history_in_the_cache_folder(tmp_path, monkeypatch):
    readline = __import__("pytest").importorskip("readline")
    from dipdeploy.cli import chat as chat_cli

    monkeypatch.setenv("DIPDEPLOY_CACHE", str(tmp_path))
    with chat_cli.line_editing(True):
        readline.add_history("a remembered line")
    assert "a remembered line" in chat_cli.history_file().read_text()
    assert readline.get_history_length() == chat_cli.HISTORY_LINES
    with chat_cli.line_editing(True):  # the next session reads it back
        assert readline.get_history_item(readline.get_current_history_length()) == "a remembered line"
    (tmp_path / "off").mkdir()
    monkeypatch.setenv("DIPDEPLOY_CACHE", str(tmp_path / "off"))
    with chat_cli.line_editing(False):  # not a terminal: no history written
        pass
    assert list((tmp_path / "off").iterdir()) == []
