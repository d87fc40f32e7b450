"""Golden cases for the Android engine's tokenizer: encode/decode by the `tokenizers` library of SmolLM2's
tokenizer.json, the tiny models' byte tokenizer and the SentencePiece-style BPE files of sp_tokenizers.py
(Gemma, Llama 2, Metaspace; built here), on strings chosen for what each family treats specially.

Written by make_golden.py into tokenizer.json; the tokenizer files lie beside it in <out>.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


STRINGS = [
    "Hello world", "Hello, world!", "  leading spaces", "trailing spaces   ", "tabs\tand\nnewlines\n\n\nend",
    "digits 1234567 and 3.14159, 2026-11-29", "unicode: café, naïve, Zürich, 日本語のテキスト, Ελληνικά, русский",
    "emoji 🤗👍🏽 and 🇫🇷 flags", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "don't I'll we've they're she'd it's", "x = f(a, b)**2; // comment", "A\r\nB\r\n", "\u00a0nbsp\u2003em space",
    "", " ", "\n", "a" * 40, "The capital of France is", "mixed<|endoftext|>special", "ﬁ ligature and Å",
]
# what SentencePiece-style files treat specially: runs of spaces (▁), the metaspace itself, byte fallback of
# CJK/emoji/control characters, literal byte-token text, Gemma's turn markers, a normalized added token
SP_STRINGS = [
    "  two leading", "two trailing  ", "   ", "a  b   c", " \n ", "\n\nparagraph\n", "日本語", "한국어 텍스트",
    "🤗", "a🤗b 👍🏽!", "\x00\x01\x7f", "▁already▁metaspace", "<0x41> is not a byte here", "café 0.5 → γ",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", "<bos>The capital<eos>",
    "I love New York", "New York", "NewYork and New  York", "x<start_of_turn> y", "1234567890",
    # Phi-3's markers strip the whitespace after them (rstrip); <mask> before it (lstrip); "hello" is single_word
    "<|user|>\nHi there<|end|>\n<|assistant|>  ok", "<|end|> \u3000\u00a0x", "a  <mask> b", "<mask>", " \t<mask>",
    "say hello there", "sayhello", "hello", "hello_x hello-x hello2 (hello)", "<|end|><mask>",
]


def smollm2_tokenizer() -> Path:
    from dipdeploy.loading import resolve

    where, _ = resolve("smollm2-135m")  # the cached fp32 copy of the embedded GGUF (built once if missing)
    path = Path(where) / "tokenizer.json"
    if not path.is_file():
        raise SystemExit(f"{path} missing: run `dipdeploy models` / load smollm2-135m once")
    return path


def tokenizer_golden(out: Path) -> dict:
    from tokenizers import Tokenizer

    from dipdeploy.loading import resolve

    from sp_tokenizers import write_variants

    files = {"smollm2": smollm2_tokenizer(), "tiny": Path(resolve("tiny-llama")[0]) / "tokenizer.json"}
    for name, src in files.items():
        shutil.copyfile(src, out / f"{name}.tokenizer.json")
    sp = write_variants(ROOT, out)
    res = {}
    for name in [*files, *sp]:
        dst = out / f"{name}.tokenizer.json"
        tok = Tokenizer.from_file(str(dst))
        cases = []
        for s in STRINGS + (SP_STRINGS if name in sp else []):
            ids = tok.encode(s).ids
            cases.append({"text": s, "ids": ids, "decode": tok.decode(ids),
                          "decode_special": tok.decode(ids, skip_special_tokens=False),
                          "single": [tok.decode([i], skip_special_tokens=False) for i in ids],
                          "prefixes": [tok.decode(ids[:n]) for n in range(len(ids) + 1)] if len(ids) < 30 else None})
        odd = [[0xC3], [0xE6, 0x97], [0xF0, 0x9F, 0xA4], [0xFF, 0x41], [0xED, 0xA0, 0x80], [0xC3, 0x28, 0xA9],
               [0xE6, 0x97, 0xA5, 0xE6], [0xC3, 0xA9], [0x41, "x", 0xE6, "y", 0xE6, 0x97, 0xA5]]
        byte_token = (lambda b: f"<0x{b:02X}>") if name in sp else _byte_char
        byte_cases = []
        for seq in odd:  # byte tokens (the alphabet's, or <0xNN>), with plain tokens between → decode
            ids = [tok.token_to_id(x if isinstance(x, str) else byte_token(x)) for x in seq]
            if None not in ids:
                byte_cases.append({"ids": ids, "decode": tok.decode(ids)})
        if name in sp:  # unk ids, alone and beside others, and the turn markers kept by skip_special_tokens=False
            unk, a = tok.token_to_id("<unk>"), tok.token_to_id("a")
            for ids in ([unk], [unk, a, unk], [tok.token_to_id("<start_of_turn>"), a]):
                byte_cases.append({"ids": ids, "decode": tok.decode(ids)})
        res[name] = {"file": str(dst), "vocab_size": tok.get_vocab_size(), "cases": cases, "bytes": byte_cases}
    return res


def _byte_char(b: int) -> str:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for x in range(256):
        if x not in bs:
            bs.append(x)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))[b]
