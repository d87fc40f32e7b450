"""Whether a bundle whose files are intact can run: its parts must describe one model.

A bundle passes the file checks of ``manifest.verify`` (paths, ranges, sizes, sha256) whatever numbers its
manifest and ``genai_config.json`` hold, and the sha256 of an edited file can be recomputed into the
manifest; a plan K smaller than the graph's, KV heads the attention graph does not take, a weight tensor
of another shape or a RoPE table shorter than the positions the bundle claims then fail deep inside
onnxruntime at the first token, or at the position past the table, after minutes of work. So ``verify``
holds them to one another here, from what is cheap to read: the manifest, ``genai_config.json`` and each
graph's declared inputs (``graphdata.graph_inputs``, no ``onnx`` package). The graphs are the truth (they
are what onnxruntime runs): every fixed size a graph input declares must be what the manifest says feeds
it. Torch-free, standard library only.
"""

from __future__ import annotations

import re

from dipdeploy.bundle.graphdata import GraphDataError, graph_inputs
from dipdeploy.bundle.names import ATTENTION_LAYOUTS, EMBEDDING, GENAI_CONFIG, MLP_GROUPS

#: genai_config.json's decoder keys and the config.json keys that must give the same number
DECODER_KEYS = {"hidden_size": "hidden_size", "num_hidden_layers": "num_hidden_layers",
                "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads",
                "head_size": "head_dim"}
_LAYER_GRAPH = re.compile(r"layer\.(\d+)\.(attn|mlp_up|mlp_down)\.onnx")
_ROPE = re.compile(re.escape("model.rope") + r"(\.[\w-]+)?\.(cos|sin)")
_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)")
_JOINED = re.compile(r"layer\.(\d+)\.(.+)")


def _int(v) -> int | None:
    return v if type(v) is int else None


def runnable_problems(manifest, genai, graphs: dict[str, bytes]) -> list[str]:
    """Problems that would stop a run of an intact bundle, one phrase each (empty: it can run).
    ``genai``: ``genai_config.json`` as ``verify`` parsed it (None where absent or unreadable: the file
    checks report that); ``graphs``: the bytes of each listed graph the file checks passed."""
    cfg = manifest.source.get("config") if isinstance(manifest.source.get("config"), dict) else {}
    plan = manifest.plan if isinstance(manifest.plan, dict) else {}
    layers = plan.get("layers") if isinstance(plan.get("layers"), list) else []
    model = genai.get("model") if isinstance(genai, dict) else None
    decoder = model.get("decoder") if isinstance(model, dict) else None
    decoder = decoder if isinstance(decoder, dict) else {}
    genai = model if isinstance(model, dict) else {}
    problems = []
    for key, cfg_key in DECODER_KEYS.items():
        a, b = _int(decoder.get(key)), _int(cfg.get(cfg_key))
        if a is not None and b is not None and a != b:
            problems.append(f"{GENAI_CONFIG}: decoder.{key} {a} but source.config.{cfg_key} {b}")
    n = _int(decoder.get("num_hidden_layers"))
    if layers and n is not None and n != len(layers):
        problems.append(f"{GENAI_CONFIG}: decoder.num_hidden_layers {n} but the plan has {len(layers)} layers")
    attention = (manifest.export_config or {}).get("attention", "standard")
    if attention not in ATTENTION_LAYOUTS:
        problems.append(f"export_config.attention {attention!r} is not one of {', '.join(ATTENTION_LAYOUTS)}")
    problems += _table_problems(manifest, cfg, genai)
    dims = {"hidden": _int(plan.get("hidden_size")) or _int(cfg.get("hidden_size")),
            "F": _int(plan.get("intermediate_size")) or _int(cfg.get("intermediate_size")),
            "kv_heads": _int(decoder.get("num_key_value_heads")), "head_size": _int(decoder.get("head_size"))}
    for name, data in graphs.items():
        try:
            inputs = graph_inputs(data)
        except GraphDataError:
            continue  # the graph-data check reports it
        problems += _input_problems(name, inputs, manifest, layers, dims)
    return problems


def _table_problems(manifest, cfg: dict, genai: dict) -> list[str]:
    """Every RoPE table holds a row for each position the bundle claims (the fewer of the config's
    ``max_position_embeddings`` and genai's ``context_length``, as the runtime reads them); the int4
    embedding's codes and scales have a row per token each."""
    claimed = [v for v in (_int(cfg.get("max_position_embeddings")), _int(genai.get("context_length"))) if v]
    problems = []
    for name, t in manifest.tensors.items():
        shape = t.get("shape") if isinstance(t, dict) else None
        if claimed and _ROPE.fullmatch(name) and isinstance(shape, list) and shape and _int(shape[0]) is not None \
                and shape[0] < min(claimed):
            problems.append(f"tensor {name}: {shape[0]} RoPE positions but the bundle claims {min(claimed)} "
                            f"(source.config.max_position_embeddings, {GENAI_CONFIG} context_length)")
    rows = [(t.get("shape") or [None])[0] if isinstance(t, dict) and isinstance(t.get("shape"), list) else None
            for t in (manifest.tensors.get(f"{EMBEDDING}.{p}") for p in ("qweight", "scales"))]
    if all(_int(r) is not None for r in rows) and rows[0] != rows[1]:
        problems.append(f"tensor {EMBEDDING}.qweight has {rows[0]} rows but {EMBEDDING}.scales {rows[1]}")
    return problems


def _expected(name: str, layer: int | None, part: str | None, manifest, layers: list, dims: dict) -> tuple[dict, str]:
    """(position → size, what says so) that graph input ``name`` must have; ``layer``/``part``: of a
    per-layer graph, or None for a graph that names each layer's inputs ``layer.{i}.…``."""
    joined = _JOINED.fullmatch(name) if layer is None else None
    if joined:
        layer, name = int(joined.group(1)), joined.group(2)
    past = _PAST.fullmatch(name)
    if past:
        return {1: dims["kv_heads"], 3: dims["head_size"]}, f"{GENAI_CONFIG} decoder num_key_value_heads, head_size"
    if name in ("hidden", "hidden_attn", "x"):
        return {-1: dims["hidden"]}, "the hidden size"
    if name == "cache_in":
        return {0: dims["hidden"]}, "the hidden size"
    if name in ("cache_glu", "glu"):
        return {-1: dims["F"]}, "the intermediate size"
    lp = layers[layer] if layer is not None and 0 <= layer < len(layers) and isinstance(layers[layer], dict) else {}
    for key, inputs in (("k_in", ("in_indices", "in_slots")), ("k_glu", ("glu_indices", "glu_slots"))):
        if name in inputs and layer is not None:
            return {1: _int(lp.get(key))}, f"plan.layers[{layer}].{key}"
    group, _, leaf = name.partition(".")
    if group in MLP_GROUPS and leaf and layer is not None:
        t = manifest.tensors.get(f"model.layers.{layer}.mlp.{group}.{leaf}")
        shape = t.get("shape") if isinstance(t, dict) else None
        if isinstance(shape, list) and all(_int(s) is not None for s in shape):
            return {"rank": len(shape), **{j: s for j, s in enumerate(shape) if j > 0}}, \
                f"tensor model.layers.{layer}.mlp.{group}.{leaf} of shape {shape}"
    return {}, ""


def _input_problems(graph: str, inputs: dict, manifest, layers: list, dims: dict) -> list[str]:
    m = _LAYER_GRAPH.fullmatch(graph)
    layer, part = (int(m.group(1)), m.group(2)) if m else (None, None)
    problems = []
    for name, have in inputs.items():
        if have is None:
            continue
        want, why = _expected(name, layer, part, manifest, layers, dims)
        rank = want.pop("rank", None)
        if rank is not None and rank != len(have):
            problems.append(f"{graph}: input {name} has {len(have)} dims but {why}")
            continue
        for pos, size in want.items():
            if size is None or not -len(have) <= pos < len(have):
                continue
            fixed = have[pos]
            if type(fixed) is int and fixed > 0 and fixed != size:
                problems.append(f"{graph}: input {name} takes {fixed} at dim {pos % len(have)} but {why} gives {size}")
    return problems
