"""The joined decoder: a bundle's per-layer graphs spliced into one graph, the host's cache step as ops.

Below a budget that holds every MLP row the per-layer graphs need the host between them (the cache step
after each TopKColumnMask); joined into one graph, that step becomes two nodes of the op library per
layer group (custom_ops/src/cache/, the same native step with the same rules), so one session per
token runs the whole decoder (docs/decisions/0003-joined-graph-written-by-export.md):

* ``CacheStep(indices, handle) -> slots`` after each TopKColumnMask: looks the selection up in the group's
  cache, updates it, assigns slab slots and copies the misses from the mapped MLP file into the slab;
* ``CacheSettle(X, handle) -> X`` on the tensor that follows the group's SparseGatherMatMul (the GLU for
  up|gate, the MLP output for down): the slot rule's deferred moves, then X passed on.

Export writes the graph in up to three forms (``bundle.names.JOINED``), because a host that cannot build
graphs (Android, onnxruntime-genai, a runtime without the ``onnx`` package) must find the one it runs:

* ``step``: one CacheStep per group (``--io mmap``, or ``--io direct`` without overlap);
* ``overlap``: each CacheStep split in two (``CacheBegin``/``CacheEnd``, ``_Joiner.split_step``): the
  misses' reads start on the reader's threads while a SparseGatherMatMul multiplies the resident rows, then
  a second one multiplies the rows just read, and the two products are added;
* ``prefetch``: ``overlap`` plus a ``CachePrefetch`` before each pre-norm layer's attention that predicts
  the layer's up|gate selection from its input and starts the reads of the predicted misses, which
  CacheBegin then takes (dipdeploy/runtime/DESIGN.md, "Paths"); written only when a layer has the
  pre-norm form.

The graph's data edges order the side effects: a group's TopKColumnMask reads its residency (bound to the
native state, so no copy) before its CacheStep, which feeds the SparseGatherMatMul, whose output feeds the
CacheSettle, whose output every later node depends on, the next group's CacheStep included; so no two
groups' steps are pending at once and the runtime's shared staging window stays valid. ORT's sequential
executor runs the graph. The semantics are the per-layer path's token-by-token ones, decision for
decision; only ORT's fusion across the joined graphs can change floating-point rounding. The joined graph
holds no weights: its initializers are the per-layer graphs' external tensors, by the same names.
Inputs: ``hidden`` (the embedded tokens, [1, N, d]), ``attention_mask``, ``position_ids``, the past K/V,
and per layer ``layer.{i}.cache_in``/``cache_glu`` (residency), ``layer.{i}.up_gate.*``/``down.*``
(slabs) and ``layer.{i}.up_gate.handle``/``down.handle`` (the native groups, int64 [1]); outputs
``logits`` (the last position only, unless ``logits_from`` says from which) and the presents.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from dipdeploy.bundle.manifest import REGENERATE, BundleError
from dipdeploy.bundle.names import JOINED, JOINED_LOGITS_FROM as LOGITS_FROM, MLP_GROUPS, joined_input
from dipdeploy.export.graph import check_model
from dipdeploy.ops.nodes import set_gamma
from dipdeploy.ops.schemas import CACHE_OPS, DOMAIN, SGMM_OP

STEP_OP, SETTLE_OP, BEGIN_OP, END_OP, PREFETCH_OP = CACHE_OPS
_NORMS = ("SkipSimplifiedLayerNormalization", "SkipLayerNormalization")  # x = norm(attention + residual) · w


def check_past_readers(graph, layers: int, where: str) -> None:
    """Refuse a standard-attention graph where a past K/V is read by anything but its Concat or a Shape:
    the runtime writes layer i's present into the buffer that held layer i − 1's past
    (``runtime.kv.KvCache.bind_session``), which would otherwise overwrite a past still to be read."""
    past = {f"past_key_values.{i}.{w}" for i in range(layers) for w in ("key", "value")}
    for node in graph.node:
        for name in set(node.input) & past:
            if node.op_type not in ("Concat", "Shape"):
                raise BundleError(f"{where}: {name} is read by a {node.op_type} node ({node.name}), so the KV "
                                  f"cache cannot be written in place; {REGENERATE}")


def _renamed(proto, name: str):
    """A copy of an ONNX message (tensor, value info, node) under another name."""
    out = type(proto)()
    out.CopyFrom(proto)
    out.name = name
    return out


class _Joiner:
    """Copies subgraphs into one graph, renaming every internal value with a prefix."""

    def __init__(self):
        self.onnx = onnx
        self.nodes, self.inputs, self.outputs = [], {}, []
        self.initializers: dict[str, object] = {}
        self.opsets: dict[str, int] = {}
        self.ir_version = 0

    def add(self, model, prefix: str, inputs: dict[str, str], outputs: dict[str, str],
            gamma: float | None = None) -> None:
        """Add ``model``'s nodes. ``inputs`` maps its graph inputs: to a value of the joined graph, or,
        written ``@name``, to the joined graph input ``name``; an unmapped input becomes a joined graph
        input of its own name. ``outputs`` renames its outputs. Initializers named ``model.*`` (the
        bundle's tensors, unique per graph or shared like the RoPE tables) keep their names; every other
        value gets ``prefix``. ``gamma``: DIP-CA's γ for its TopKColumnMask nodes (None: as exported)."""
        g = model.graph
        self.ir_version = max(self.ir_version, model.ir_version)
        for op in model.opset_import:
            self.opsets[op.domain] = max(self.opsets.get(op.domain, 0), op.version)
        names = dict(inputs)
        for init in g.initializer:
            names[init.name] = init.name if init.name.startswith("model.") else prefix + init.name
        names.update(outputs)
        rename = lambda n: n if n == "" else names.get(n, prefix + n)  # noqa: E731
        for init in g.initializer:
            new = rename(init.name)
            if new not in self.initializers:
                self.initializers[new] = _renamed(init, new)
        for vi in g.input:
            if vi.name in inputs and not inputs[vi.name].startswith("@"):
                continue  # wired to a value of the joined graph
            new = inputs.get(vi.name, vi.name).lstrip("@")
            names[vi.name] = new
            if new not in self.inputs:
                self.inputs[new] = _renamed(vi, new)
        for node in g.node:
            n = _renamed(node, prefix + node.name)
            n.input[:] = [rename(x) for x in node.input]
            n.output[:] = [rename(x) for x in node.output]
            self.nodes.append(n)
        if gamma is not None:
            set_gamma(self.nodes[-len(g.node):], gamma)

    def output(self, model, name: str, new: str) -> None:
        for vo in model.graph.output:
            if vo.name == name:
                self.outputs.append(_renamed(vo, new))
                return
        raise BundleError(f"graph output {name} is missing; {REGENERATE}")

    def step(self, indices: str, handle: str, slots: str, name: str) -> None:
        self.nodes.append(self.onnx.helper.make_node(STEP_OP, [indices, handle], [slots], name=name, domain=DOMAIN))

    def split_step(self, indices: str, handle: str, slots: str, name: str) -> None:
        """The step in two halves around the group's SparseGatherMatMul (the one node that reads ``slots``):
        CacheBegin starts the misses' reads and feeds a product over the resident rows; CacheEnd on that
        product waits for the reads and feeds a product over the rows just read; their sum is the
        original output. The misses are read while the resident rows are multiplied."""
        h = self.onnx.helper
        readers = [i for i, n in enumerate(self.nodes) if slots in n.input]
        if len(readers) != 1 or self.nodes[readers[0]].op_type != SGMM_OP or self.nodes[readers[0]].input[1] != indices:
            raise BundleError(f"{name}: the slots must feed one {SGMM_OP} over {indices}; {REGENERATE}")
        at, sgmm = readers[0], self.nodes[readers[0]]
        y, x, weights = sgmm.output[0], sgmm.input[0], list(sgmm.input[3:])
        parts = []
        for part, idx, slot in (("hit", name + ".hit_indices", name + ".hit_slots"),
                                ("miss", name + ".miss_indices", name + ".miss_slots")):
            node = _renamed(sgmm, f"{sgmm.name}.{part}")
            node.input[:] = [x, idx, slot, *weights]
            node.output[:] = [f"{y}.{part}"]
            parts.append(node)
        begin = h.make_node(BEGIN_OP, [indices, handle], [name + ".hit_indices", name + ".hit_slots"],
                            name=name + ".begin", domain=DOMAIN)
        end = h.make_node(END_OP, [f"{y}.hit", handle], [f"{y}.hit.ready", name + ".miss_indices", name + ".miss_slots"],
                          name=name + ".end", domain=DOMAIN)
        add = h.make_node("Add", [f"{y}.hit.ready", f"{y}.miss"], [y], name=name + ".sum")
        self.nodes[at:at + 1] = [begin, parts[0], end, parts[1], add]

    def prefetch(self, indices: str, handle: str, first: int, name: str) -> bool:
        """Insert a CachePrefetch for the group whose TopKColumnMask writes ``indices``, if its layer (the
        nodes from ``first`` on) has the pre-norm form x = norm(attention + h) · w: the op predicts the
        selection from h · w with the TopKColumnMask's own attributes and inputs and reads the predicted
        misses, and the attention reads its input through the op, so that the reads start before it runs
        (custom_ops/src/ort/). Returns whether it did."""
        nodes = self.nodes[first:]
        made = {o: n for n in nodes for o in n.output if o}
        topk = next((n for n in nodes if indices in n.output), None)
        if topk is None or len(topk.input) < 3 or topk.input[1] or not topk.input[2]:
            return False  # none, K as an input rather than the attribute, or no residency: nothing to predict with
        x = topk.input[0]
        while x in made and made[x].op_type in ("Reshape", "Squeeze", "Identity"):
            x = made[x].input[0]
        post = made.get(x)
        if post is None or post.op_type not in _NORMS or post.output[0] != x or len(post.input) < 3:
            return False

        def residual(v: str) -> bool:  # a layer input, or the running sum an input norm passes on
            return v not in made or (made[v].op_type in _NORMS and len(made[v].output) > 3 and made[v].output[3] == v)

        h = next((v for v in post.input[:2] if residual(v)), None)
        if h is None or all(residual(v) for v in post.input[:2]):
            return False
        gate = made[h].output[0] if h in made else h  # what the attention starts from
        ready = gate + ".prefetched"
        for n in nodes:
            n.input[:] = [ready if v == gate else v for v in n.input]
        at = self.nodes.index(made[h]) + 1 if h in made else first
        node = self.onnx.helper.make_node(PREFETCH_OP, [gate, handle, h, post.input[2], topk.input[2], *topk.input[3:4]],
                                          [ready], name=name, domain=DOMAIN)
        node.attribute.extend(a for a in topk.attribute if a.name in ("k", "gamma", "fixed_top_n", "score"))
        self.nodes.insert(at, node)
        return True

    def settle(self, produced: str, handle: str, name: str) -> None:
        """Insert a CacheSettle on ``produced``: its producer now writes ``produced.raw`` and every reader
        of ``produced`` reads the settled copy."""
        raw = produced + ".raw"
        at = next(i for i, n in enumerate(self.nodes) if produced in n.output)
        producer = self.nodes[at]
        producer.output[:] = [raw if x == produced else x for x in producer.output]
        node = self.onnx.helper.make_node(SETTLE_OP, [raw, handle], [produced], name=name, domain=DOMAIN)
        self.nodes.insert(at + 1, node)  # the nodes stay in topological order

    def last(self, value: str) -> str:
        """``value`` [1, N, d] cut to its positions from ``LOGITS_FROM`` on (by default the last one only,
        [1, 1, d]): a batched prefill needs the logits after its last token only (else it would cost
        N · vocab logits), a speculative verification those after every token (``LOGITS_FROM`` bound to 0,
        ``dipdeploy.runtime.speculate``). ``LOGITS_FROM`` is a graph input ([-1]: the last position), not an
        initializer a host may override, which onnxruntime would warn of at every session it opens."""
        h, T = self.onnx.helper, self.onnx.TensorProto
        for name, v in (("last/ends", 2**63 - 1), ("last/axes", 1)):
            self.initializers.setdefault(name, h.make_tensor(name, T.INT64, [1], [v]))
        self.inputs.setdefault(LOGITS_FROM, h.make_tensor_value_info(LOGITS_FROM, T.INT64, [1]))
        out = value + ".last"
        self.nodes.append(h.make_node("Slice", [value, LOGITS_FROM, "last/ends", "last/axes"], [out],
                                      name=out + "/slice"))
        return out

    def model(self):
        h = self.onnx.helper
        graph = h.make_graph(self.nodes, "dipdeploy_fused_decoder", list(self.inputs.values()), self.outputs,
                             list(self.initializers.values()))
        opsets = [h.make_opsetid(d, v) for d, v in sorted(self.opsets.items())]
        return h.make_model(graph, opset_imports=opsets, ir_version=self.ir_version)


def fuse_graphs(bundle: Path, layers: int, gamma: float | None = None, overlap: bool = False,
                prefetch: bool = False):
    """The decoder of ``bundle`` as one ONNX model (module docstring): positions, every layer's attention,
    MLP up and down graphs with a CacheStep/CacheSettle pair per group, the head on the last position.
    ``overlap``: each CacheStep split into CacheBegin/CacheEnd around two products (``_Joiner.split_step``),
    for a reader that reads in the background (``--io direct``); with it, ``prefetch`` adds a CachePrefetch
    before each pre-norm layer's attention (``_Joiner.prefetch``).
    Inputs: ``hidden`` (the embedded tokens, [1, N, d]), ``attention_mask``, ``position_ids``, the past K/V, and per layer
    ``layer.{i}.cache_in``/``cache_glu`` (residency), ``layer.{i}.up_gate.*``/``down.*`` (slabs) and
    ``layer.{i}.up_gate.handle``/``down.handle``; outputs ``logits`` and the presents. ``gamma`` (None: the
    bundle's) rewrites every TopKColumnMask, as the per-layer sessions do."""
    load = lambda name: onnx.load(str(bundle / name), load_external_data=False)  # noqa: E731
    j = _Joiner()
    pos = load("positions.onnx")
    shared = {o.name: o.name for o in pos.graph.output}
    j.add(pos, "positions/", {}, shared)
    hidden, mlp_out = "@hidden", None
    for i in range(layers):
        attn, up, down = load(f"layer.{i}.attn.onnx"), load(f"layer.{i}.mlp_up.onnx"), load(f"layer.{i}.mlp_down.onnx")
        p = f"l{i}."
        handles = {g: joined_input(i, f"{g}.handle") for g in MLP_GROUPS}
        wired = {**shared, "hidden": hidden, "cache_in": "@" + joined_input(i, "cache_in")}
        if mlp_out is not None:
            wired["mlp_out"] = mlp_out
        present = {o.name: o.name for o in attn.graph.output if o.name.startswith("present.")}
        first = len(j.nodes)
        j.add(attn, p + "attn/", wired, {"hidden_attn": p + "hidden_attn", "x": p + "x",
                                         "in_indices": p + "in_indices", **present}, gamma)
        if overlap and prefetch:
            j.prefetch(p + "in_indices", handles["up_gate"], first, p + "up_gate.prefetch")
        for name in present:
            j.output(attn, name, name)
        for g in MLP_GROUPS:
            j.inputs.setdefault(handles[g], onnx.helper.make_tensor_value_info(handles[g], onnx.TensorProto.INT64, [1]))
        if not overlap:
            j.step(p + "in_indices", handles["up_gate"], p + "in_slots", p + "up_gate.step")
        slab_up = {vi.name: "@" + joined_input(i, vi.name) for vi in up.graph.input if vi.name.startswith("up_gate.")}
        j.add(up, p + "up/", {"x": p + "x", "in_indices": p + "in_indices", "in_slots": p + "in_slots",
                              "cache_glu": "@" + joined_input(i, "cache_glu"), **slab_up},
              {"glu": p + "glu", "glu_indices": p + "glu_indices"}, gamma)
        if overlap:
            j.split_step(p + "in_indices", handles["up_gate"], p + "in_slots", p + "up_gate.step")
        j.settle(p + "glu", handles["up_gate"], p + "up_gate.settle")
        if not overlap:
            j.step(p + "glu_indices", handles["down"], p + "glu_slots", p + "down.step")
        slab_down = {vi.name: "@" + joined_input(i, vi.name) for vi in down.graph.input if vi.name.startswith("down.")}
        j.add(down, p + "down/", {"glu": p + "glu", "glu_indices": p + "glu_indices", "glu_slots": p + "glu_slots",
                                  "hidden_attn": p + "hidden_attn", **slab_down}, {"mlp_out": p + "mlp_out"})
        if overlap:
            j.split_step(p + "glu_indices", handles["down"], p + "glu_slots", p + "down.step")
        j.settle(p + "mlp_out", handles["down"], p + "down.settle")
        hidden, mlp_out = p + "hidden_attn", p + "mlp_out"
    head = load("head.onnx")
    j.add(head, "head/", {"hidden": j.last(hidden), "mlp_out": j.last(mlp_out)}, {"logits": "logits"})
    j.output(head, "logits", "logits")
    return j.model()


def write_joined(folder: Path, layers: int, standard_attention: bool) -> list[str]:
    """Write the joined decoder's forms (module docstring) beside the per-layer graphs in ``folder``, each
    checked (``check_model``; with standard attention, ``check_past_readers``); their file names, in
    ``JOINED``'s order. ``prefetch`` only where some layer got a CachePrefetch."""
    written = []
    for form, (overlap, prefetch) in (("step", (False, False)), ("overlap", (True, False)),
                                      ("prefetch", (True, True))):
        model = fuse_graphs(folder, layers, None, overlap, prefetch)
        if form == "prefetch" and not any(n.op_type == PREFETCH_OP for n in model.graph.node):
            continue
        if standard_attention:
            check_past_readers(model.graph, layers, f"{folder} (joined decoder, {form})")
        path = folder / JOINED[form]
        onnx.save_model(model, str(path))
        check_model(path)
        written.append(path.name)
    return written
