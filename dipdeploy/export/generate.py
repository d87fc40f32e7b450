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

from dipdeploy.export.manifest import read_manifest


@dataclass
class Generation:
    prompt: str
    text: str
    tokens: list[int]
    tokens_per_s: float
    native: bool


def generate(bundle: str | Path, prompt: str, max_new_tokens: int = 32, *, native: bool = False,
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
    outs = [o.name for o in sess.get_outputs()]
    shape = (1, dec["decoder"]["num_key_value_heads"], 0, dec["decoder"]["head_size"])
    past = {i.name: np.zeros(shape, np.float32) for i in sess.get_inputs() if i.name.startswith("past_key_values")}
    ids = np.asarray([tok.encode(prompt, add_special_tokens=False).ids], dtype=np.int64)
    start, new, t0 = 0, [], time.perf_counter()
    for _ in range(max_new_tokens):
        s = ids.shape[1]
        res = dict(zip(outs, sess.run(None, {
            "input_ids": ids, "attention_mask": np.ones((1, start + s), np.int64),
            "position_ids": np.arange(start, start + s, dtype=np.int64)[None], **past})))
        past = {k: res[k.replace("past_key_values", "present")] for k in past}
        start += s
        nxt = int(res["logits"][0, -1].argmax())
        new.append(nxt)
        if nxt == dec.get("eos_token_id"):
            break
        ids = np.array([[nxt]], dtype=np.int64)
    seconds = time.perf_counter() - t0
    return Generation(prompt, tok.decode(new), new, len(new) / seconds, native)
