"""Generation options (HF semantics), UTF-8-safe streaming with stop strings, chat templates as transformers
renders them, and the run/chat options refused up front."""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer
from typer.testing import CliRunner

from conftest import TINY_CHAT_TEMPLATE
from dipdeploy.cli import app
from dipdeploy.runtime import Engine, Sampler
from dipdeploy.runtime.stream import REPLACEMENT, TextStream
from dipdeploy.runtime.template import ChatTemplate, messages


# -- sampler ----------------------------------------------------------------------------------------
def test_top_k_keeps_exactly_the_k_most_likely_ties_to_the_lower_id():
    logits = np.array([0.5, 3.0, 1.0, 3.0, 2.0, -1.0], np.float32)
    p = Sampler(temperature=1.0, top_k=3).probabilities(logits)
    assert set(np.flatnonzero(p)) == {1, 3, 4}
    assert p.sum() == pytest.approx(1.0)
    p2 = Sampler(temperature=1.0, top_k=1).probabilities(logits)
    assert list(np.flatnonzero(p2)) == [1]  # 1 and 3 tie: the lower id
    draws = {Sampler(temperature=2.0, top_k=2, seed=s)(logits) for s in range(40)}
    assert draws == {1, 3}


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert set(np.flatnonzero(Sampler(temperature=1.0, top_p=0.75).probabilities(logits))) == {0, 1}
    assert set(np.flatnonzero(Sampler(temperature=1.0, top_p=0.85).probabilities(logits))) == {0, 1, 2}


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = np.array([2.0, -2.0, 1.0, 3.0])
    z = Sampler(repetition_penalty=2.0).penalise(logits, [0, 1, 1])
    np.testing.assert_allclose(z, [1.0, -4.0, 1.0, 3.0])
    assert Sampler()(logits, [3]) == 3  # penalty 1: off
    assert Sampler(repetition_penalty=10.0)(logits, [3]) == 0  # 3 → 0.3: greedy moves to the next one


def test_sampling_repeats_with_the_seed():
    logits = np.random.default_rng(0).normal(size=50)
    a = Sampler(temperature=1.0, seed=3)
    first = [a(logits) for _ in range(20)]
    a.reset()
    assert [a(logits) for _ in range(20)] == first
    assert len(set(first)) > 1


@pytest.mark.parametrize("kwargs, name", [({"temperature": -1}, "--temperature"), ({"top_k": -2}, "--top-k"),
                                          ({"top_p": 0.0}, "--top-p"), ({"top_p": 1.5}, "--top-p"),
                                          ({"repetition_penalty": 0.0}, "--repetition-penalty"),
                                          ({"temperature": float("nan")}, "--temperature"),
                                          ({"stop": ("",)}, "--stop")])
def test_invalid_options_are_refused(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Sampler(**kwargs)


@pytest.mark.parametrize("args, name", [(["--top-k", "-1"], "--top-k"), (["--top-p", "0"], "--top-p"),
                                        (["--repetition-penalty", "-1"], "--repetition-penalty"),
                                        (["--stop", ""], "--stop"), (["-n", "0"], "--max-new-tokens"),
                                        (["--system", "be brief"], "--chat")])
def test_cli_refuses_bad_generation_options_in_one_line(tmp_path, args, name):
    """Checked before the bundle is opened: a missing bundle would be a different error."""
    res = CliRunner().invoke(app, ["run", str(tmp_path / "nowhere"), "-p", "hi", *args])
    assert res.exit_code == 2, res.output
    assert name in res.output and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


# -- streaming ----------------------------------------------------------------------------------------
def _stream_all(tokenizer, ids, stop=()):
    s = TextStream(tokenizer, tuple(stop))
    pieces = [s.push(t) for t in ids]
    pieces.append(s.finish())
    return s, [p for p in pieces if p]


TEXT = "naïve café — 🙂 🦊 狐狸 Ω ok"


def _utf8_safe(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    alone = [tokenizer.decode([t]) for t in ids]
    assert any(REPLACEMENT in a for a in alone), "the tokenizer must split a character for this test to mean anything"
    s, pieces = _stream_all(tokenizer, ids)
    assert "".join(pieces) == TEXT == s.text
    assert not any(REPLACEMENT in p for p in pieces)


def test_streaming_never_prints_a_broken_character_byte_tokens(chat_bundle):
    """tiny-llama's tokenizer has one token per byte: every non-ASCII character spans tokens."""
    _utf8_safe(Tokenizer.from_file(str(chat_bundle / "tokenizer.json")))


@pytest.mark.slow
def test_streaming_never_prints_a_broken_character_smollm2_bpe():
    from dipdeploy.loading import resolve

    where, _ = resolve("smollm2-135m")
    _utf8_safe(Tokenizer.from_file(str(where / "tokenizer.json")))


def test_streamed_text_is_the_decoded_text_also_for_invalid_utf8(chat_bundle):
    """Random byte tokens (broken and stray UTF-8 sequences included) stream to what one decode gives."""
    tok = Tokenizer.from_file(str(chat_bundle / "tokenizer.json"))
    rng = np.random.default_rng(0)
    for _ in range(50):
        ids = rng.integers(1, tok.get_vocab_size(), size=int(rng.integers(1, 30))).tolist()
        s, pieces = _stream_all(tok, ids)
        assert "".join(pieces) == s.text == tok.decode(ids)


def test_stop_strings_cut_the_text_and_are_never_printed(chat_bundle):
    tok = Tokenizer.from_file(str(chat_bundle / "tokenizer.json"))
    ids = tok.encode("The answer: 42.\nUser: more", add_special_tokens=False).ids
    s, pieces = _stream_all(tok, ids, stop=("\nUser:", "never"))
    assert "".join(pieces) == s.text == "The answer: 42." and s.stopped == "\nUser:"
    # a stop string's beginning that does not complete is printed in the end
    s, pieces = _stream_all(tok, tok.encode("ends with nev", add_special_tokens=False).ids, stop=("never",))
    assert "".join(pieces) == "ends with nev" and s.stopped is None
    assert not any(p.endswith("ne") for p in pieces[:-1])  # held back while it could still become "never"


def test_engine_stops_at_a_stop_string(chat_bundle):
    eng = Engine(chat_bundle, native=False)
    free = eng.generate("hello there", 24, stop_at_eos=False)
    assert free.finish == "length"
    cut = next(i for i, c in enumerate(free.text) if i >= 2 and c.isalnum())
    stop = free.text[cut]
    streamed = []
    g = eng.generate("hello there", 24, sampler=Sampler(stop=(stop,)), stop_at_eos=False, on_text=streamed.append)
    assert g.finish == "stop" and g.text == free.text[: free.text.index(stop)]
    assert "".join(streamed) == g.text and stop not in g.text
    assert len(g.tokens) < len(free.tokens)


# -- chat templates ----------------------------------------------------------------------------------
CONVERSATIONS = [messages("What is the capital of France?"),
                 messages("Hi", system="Be brief."),
                 [*messages("Hi", system="Be brief."), {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "Tell me a joke 🙂"}]]


def _transformers_renders(template: str, conversation, **special):
    from transformers import PreTrainedTokenizerFast
    from dipdeploy.loading import resolve

    where, _ = resolve("tiny-llama")
    tok = PreTrainedTokenizerFast.from_pretrained(where)
    tok.chat_template = template
    return tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_template_renders_as_transformers_apply_chat_template(chat_bundle, conversation):
    manifest = json.loads((chat_bundle / "manifest.json").read_text())
    t = ChatTemplate.from_bundle(chat_bundle, manifest["files"])
    assert t.source == TINY_CHAT_TEMPLATE
    assert t.render(conversation) == _transformers_renders(TINY_CHAT_TEMPLATE, conversation)


@pytest.mark.slow
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_smollm2_template_renders_as_transformers(conversation):
    from dipdeploy.loading import resolve

    where, _ = resolve("smollm2-135m")
    files = {p.name: {} for p in where.iterdir()}
    t = ChatTemplate.from_bundle(where, files)
    out = t.render(conversation)
    assert out == _transformers_renders(t.source, conversation)
    assert out.endswith("<|im_start|>assistant\n") and "<|im_start|>user\n" in out


def test_a_bundle_without_a_template_is_refused_for_chat(tmp_path):
    with pytest.raises(ValueError, match="no chat template"):
        ChatTemplate.from_bundle(tmp_path, {})
