"""SentencePiece-style BPE tokenizer.json files for the Android tokenizer's golden vectors, built locally.

Gemma, Llama 2, Mistral and Phi-3 ship this family (android_demo/README.md, "The tokenizer"); none of their
files can be downloaded here, so one small BPE is trained with the `tokenizers` library on the repository's
own README and docs (text that is always present) and written with the component sets those models use:

  sp-gemma      normalizer Replace(" " → "▁"), no pre-tokenizer, decoder Replace/ByteFallback/Fuse, <bos> first
  sp-llama2     normalizer Prepend("▁") + Replace, decoder Replace/ByteFallback/Fuse/Strip(1 leading space)
  sp-metaspace  pre_tokenizer Metaspace(prepend_scheme "first", split false) — the current Llama/Mistral files
  sp-legacy     pre_tokenizer and decoder Metaspace in the older add_prefix_space form (prepend always, split)
  sp-unk        sp-gemma without byte_fallback: unknown characters become one fused <unk>
  sp-phi3       sp-llama2 plus Phi-3's chat markers (<|user|>, <|assistant|>, <|end|>: rstrip), and an lstrip
                and a single_word token, which change where added tokens match

The vocab is laid out as Gemma's: <pad> <eos> <bos> <unk>, the 256 byte tokens <0x00>…<0xFF> (model vocab,
not added tokens), then the trained pieces; 800 pieces, so CJK and emoji fall back to bytes. Added tokens: the
four specials and <start_of_turn>/<end_of_turn> (special, matched in the raw text) and "New York" (not
special, normalized, so matched in the normalized text).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
TURN = ["<start_of_turn>", "<end_of_turn>"]
NORMALIZED_TOKEN = "New York"
VOCAB_SIZE = 800

_REPLACE = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
_DECODE = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]
_STRIP = {"type": "Strip", "content": " ", "start": 1, "stop": 0}
_LEGACY_METASPACE = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}

# (content, special, flags)
_PHI3 = [("<|user|>", True, {"rstrip": True}), ("<|assistant|>", True, {"rstrip": True}),
         ("<|end|>", True, {"rstrip": True}), ("<mask>", True, {"lstrip": True}), ("hello", False, {"single_word": True})]

# name → (normalizer, pre_tokenizer, decoder, bos first, byte_fallback, extra added tokens)
VARIANTS = {
    "sp-gemma": (_REPLACE, None, {"type": "Sequence", "decoders": _DECODE}, True, True, []),
    "sp-llama2": ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, _REPLACE]}, None,
                  {"type": "Sequence", "decoders": _DECODE + [_STRIP]}, True, True, []),
    "sp-metaspace": (None, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
                     {"type": "Sequence", "decoders": _DECODE + [_STRIP]}, False, True, []),
    "sp-legacy": (None, _LEGACY_METASPACE, _LEGACY_METASPACE, False, True, []),
    "sp-unk": (_REPLACE, None, {"type": "Sequence", "decoders": _DECODE}, True, False, []),
    "sp-phi3": ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, _REPLACE]}, None,
                {"type": "Sequence", "decoders": _DECODE + [_STRIP]}, True, True, _PHI3),
}


def corpus(root: Path) -> list[str]:
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [line for f in files if f.is_file() for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]


def trained_base(root: Path) -> dict:
    """One BPE trained as SentencePiece pieces ("▁word"), with Gemma's vocab layout; components filled in later."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.train_from_iterator(corpus(root), trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS,
                                                              show_progress=False))
    j = json.loads(tok.to_str())
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    j["model"]["vocab"] = vocab

    j["added_tokens"] = ([_added(t, vocab[t], True, False) for t in SPECIALS]
                         + [_added(t, len(vocab) + k, True, False) for k, t in enumerate(TURN)]
                         + [_added(NORMALIZED_TOKEN, len(vocab) + len(TURN), False, True)])
    return j


def _added(content: str, idx: int, special: bool, normalized: bool, **flags) -> dict:
    return {"id": idx, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": special, **flags}


def write_variants(root: Path, out: Path) -> dict[str, Path]:
    """Writes ``<name>.tokenizer.json`` for every variant into ``out``; returns name → path."""
    base = trained_base(root)
    paths = {}
    for name, (norm, pre, dec, bos, fallback, extra) in VARIANTS.items():
        j = copy.deepcopy(base)
        for content, special, flags in extra:  # new ids after the vocab and the added tokens so far
            idx = len(j["model"]["vocab"]) + len(j["added_tokens"]) - len(SPECIALS)
            j["added_tokens"].append(_added(content, idx, special, False, **flags))
        j["normalizer"], j["pre_tokenizer"], j["decoder"] = norm, pre, dec
        j["model"]["byte_fallback"] = fallback
        j["post_processor"] = ({"type": "TemplateProcessing",
                                "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                           {"Sequence": {"id": "A", "type_id": 0}}],
                                "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                         {"Sequence": {"id": "A", "type_id": 0}},
                                         {"Sequence": {"id": "B", "type_id": 1}}],
                                "special_tokens": {"<bos>": {"id": "<bos>", "ids": [j["model"]["vocab"]["<bos>"]],
                                                            "tokens": ["<bos>"]}}} if bos else None)
        path = out / f"{name}.tokenizer.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)
        paths[name] = path
    return paths
