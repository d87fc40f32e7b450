"""Greedy generation from a bundle's ``model.onnx`` with plain ONNX Runtime (torch-free).

What ``make demo`` and ``dipdeploy inspect --prompt`` use to show that a bundle runs on its own:
``tokenizers`` for text, numpy for the KV cache, ORT with or without the native op library. The
host runtime with DRAM caches and per-layer graphs is a separate stage (``dipdeploy run``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dipdeploy import defaults
from dipdeploy.bundle.manifest import read_manifest


class KVDecoder:
    """``model.onnx`` with its KV cache fed back between calls (onnxruntime-genai's I/O names): the
    one loop that greedy generation, export validation and the ARM check all drive."""

    def __init__(self, session, num_kv_heads: int, head_size: int):
        self.session = session
        self.outputs = [o.name for o in session.get_outputs()]
        inputs = session.get_inputs()
        self.positions = any(i.name == "position_ids" for i in inputs)  # genai's own graphs may lack it
        shape = (1, num_kv_heads, 0, head_size)
        self.past = {i.name: np.zeros(shape, np.float16 if "float16" in i.type else np.float32)
                     for i in inputs if i.name.startswith("past_key_values")}
        self.length = 0
        self.last: dict = {}
        self._fed = 0

    def feed(self, ids) -> np.ndarray:
        """Run ``ids`` ([S] or [1, S]) after what the cache holds; returns their logits [S, V]."""
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        s = ids.shape[1]
        feed = {"input_ids": ids, "attention_mask": np.ones((1, self.length + s), np.int64), **self.past}
        if self.positions:
            feed["position_ids"] = np.arange(self.length, self.length + s, dtype=np.int64)[None]
        res = dict(zip(self.outputs, self.session.run(None, feed)))
        self.last = res  # every output of the call (see selections)
        self._fed = s
        self.past = {k: res[k.replace("past_key_values", "present")] for k in self.past}
        self.length += s
        return res["logits"][0]

    def selections(self, outputs: dict) -> list[dict]:
        """Per position fed in the last call, ``{key: that position's row}`` of the graph outputs that
        ``outputs`` maps key → name (the TopKColumnMask results exposed by
        ``dipdeploy.ops.nodes.with_selection_outputs``)."""
        rows = {key: np.asarray(self.last[name]).reshape(self._fed, -1) for key, name in outputs.items()}
        return [{key: r[p] for key, r in rows.items()} for p in range(self._fed)]


@dataclass
class Generation:
    prompt: str
    text: str
    tokens: list[int]
    tokens_per_s: float
    native: bool


def generate(bundle: str | Path, prompt: str, max_new_tokens: int = defaults.MAX_NEW_TOKENS, *, native: bool = False,
             threads: int = 1) -> Generation:
    """Greedy decode ``max_new_tokens`` after ``prompt``; stops at the EOS token of genai_config.json."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from dipdeploy.ops.native import session_options

    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    dec = json.loads((bundle / "genai_config.json").read_text())["model"]
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    so = session_options(threads=threads, native=native)
    sess = ort.InferenceSession(str(bundle / manifest.graphs["model"]), so, providers=["CPUExecutionProvider"])
    kv = KVDecoder(sess, dec["decoder"]["num_key_value_heads"], dec["decoder"]["head_size"])
    ids = tok.encode(prompt).ids  # with the tokenizer's special tokens, as `dipdeploy run` and HF do
    new, t0 = [], time.perf_counter()
    logits = kv.feed(ids) if max_new_tokens > 0 else None
    for n in range(max_new_tokens):
        nxt = int(logits[-1].argmax())
        new.append(nxt)
        if nxt == dec.get("eos_token_id") or n == max_new_tokens - 1:
            break
        logits = kv.feed([nxt])
    seconds = time.perf_counter() - t0
    return Generation(prompt, tok.decode(new), new, len(new) / seconds, native)
