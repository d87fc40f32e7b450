"""The whole decoder in one session at any budget: the row caches stepped inside the graph.

Below a budget that holds every MLP row the per-layer path runs 3 graphs per layer with the host's cache
step between them (DESIGN.md counts the session runs); its cost outside ORT's kernels is what
``benchmarks/results/host.md`` measures (DESIGN.md, "The cache inside the graph"). Here the bundle's own
per-layer graphs are joined, at load time, into one decoder graph, and the host step becomes two nodes of
the op library per layer group (custom_ops/src/dd_cache.cc, the same native step with the same rules):

* ``CacheStep(indices, handle) -> slots`` after each TopKColumnMask: looks the selection up in the group's
  cache, updates it, assigns slab slots and copies the misses from the mapped MLP file into the slab;
* ``CacheSettle(X, handle) -> X`` on the tensor that follows the group's SparseGatherMatMul (the GLU for
  up|gate, the MLP output for down): the slot rule's deferred moves, then X passed on.

With ``--io direct`` each CacheStep is split in two (``CacheBegin``/``CacheEnd``, ``_Joiner.split_step``):
the misses' reads start on the reader's threads while a SparseGatherMatMul multiplies the resident rows,
then a second one multiplies the rows just read, and the two products are added: the reads overlap that
compute. With ``prefetch`` a ``CachePrefetch`` before each pre-norm layer's attention also predicts the
layer's up|gate selection from its input and starts the reads of the predicted misses, which CacheBegin
then takes (DESIGN.md, "Reads overlapped with compute").

The graph's data edges order the side effects: a group's TopKColumnMask reads its residency (bound to the
native state, so no copy) before its CacheStep, which feeds the SparseGatherMatMul, whose output feeds the
CacheSettle, whose output every later node depends on, the next group's CacheStep included; so no two
groups' steps are pending at once and the shared staging window (``staging.py``) stays valid. ORT's
sequential executor runs the graph (the engine never enables the parallel one).

Semantics are the per-layer path's token-by-token ones, decision for decision: the same native step on
the same selections; only ORT's fusion across the joined graphs can change floating-point rounding. The
misses are copied from the mapped file (``--io mmap``) or read by the step itself with the Flash store's
reader and the same block-aligned requests (``--io direct``: ``dd_cache_direct``, ``dipdeploy.flash.plan_reads``
in C++); the bundle's natural row order only. A batched prefill runs the same graph on a chunk of the
prompt (``FusedModel.run_chunk``) with the per-layer path's semantics: plain DIP inside the chunk, the
caches warmed from its selections afterwards (README, "The host runtime"). What this mode does not have,
as with ``whole.py``: per-layer selections for traces or recorders. ``handle`` inputs are
the native groups' addresses as int64; the op checks each against the groups alive in the process.

Torch-free (floor 5). Joining the graphs needs the ``onnx`` package, which plain ``run`` does not; it runs
in a child process (``joined_model``), so the engine's process does not hold the package (its RSS:
benchmarks/results/notes.md) for a graph it only needs once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from dipdeploy.bundle.manifest import REGENERATE, BundleError
from dipdeploy.ops.schemas import DOMAIN, SGMM_OP
from dipdeploy.runtime.sessions import Bound, Buffer, set_gamma

#: the ops the joined graph adds (custom_ops/src/dd_ops.cc)
STEP_OP, SETTLE_OP = "CacheStep", "CacheSettle"
BEGIN_OP, END_OP = "CacheBegin", "CacheEnd"  # the step in two halves, the reads overlapping the resident rows' product
PREFETCH_OP = "CachePrefetch"  # a layer's up|gate misses predicted from its input and read during its attention
_NORMS = ("SkipSimplifiedLayerNormalization", "SkipLayerNormalization")  # x = norm(attention + residual) · w
GROUPS = ("up_gate", "down")


def group_input(layer: int, name: str) -> str:
    """The joined graph's name for a per-layer graph's input ``name`` of layer ``layer`` (a slab array
    ``up_gate.qweight``, a residency ``cache_in``, a ``handle``)."""
    return f"layer.{layer}.{name}"


def why_not(cfg, manifest, layers: int) -> str | None:
    """Why the cache cannot run inside the graph for this engine configuration (None: it can)."""
    if cfg.io not in ("mmap", "direct"):
        return (f"--io {cfg.io}: the cache step in the graph copies the misses from the mapped file (--io mmap) or "
                f"reads them with the op library's reader (--io direct)")
    if cfg.policy == "belady":
        return "policy 'belady' needs the recorded future, which only the per-layer path records"
    if (manifest.row_order or {}).get("order", "natural") != "natural":
        return "the bundle's rows are in a calibrated order, which only the Flash store reads"
    if cfg.native is False or cfg.native_cache is False:
        return "the cache step in the graph is the op library's: it needs the native kernels and cache step"
    names = manifest.graphs.get("layers", [])
    missing = [n for i in range(layers) for n in (f"layer.{i}.attn.onnx", f"layer.{i}.mlp_up.onnx",
                                                  f"layer.{i}.mlp_down.onnx") if n not in names]
    if missing or "positions.onnx" not in names or "head.onnx" not in names:
        return f"the bundle lacks per-layer graphs ({(missing or ['positions.onnx/head.onnx'])[0]}); {REGENERATE}"
    return None


def _renamed(proto, name: str):
    """A copy of an ONNX message (tensor, value info, node) under another name."""
    out = type(proto)()
    out.CopyFrom(proto)
    out.name = name
    return out


class _Joiner:
    """Copies subgraphs into one graph, renaming every internal value with a prefix."""

    def __init__(self):
        import onnx

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
        (custom_ops/src/dd_ops.cc). Returns whether it did."""
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
        """``value`` [1, N, d] cut to its last position [1, 1, d]: the head needs the logits after the last
        token only (a batched prefill's chunk would otherwise cost N · vocab logits)."""
        h, T = self.onnx.helper, self.onnx.TensorProto
        for name, v in (("starts", -1), ("ends", 2**63 - 1), ("axes", 1)):
            self.initializers.setdefault(f"last/{name}", h.make_tensor(f"last/{name}", T.INT64, [1], [v]))
        out = value + ".last"
        self.nodes.append(h.make_node("Slice", [value, "last/starts", "last/ends", "last/axes"], [out],
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
    import onnx

    load = lambda name: onnx.load(str(bundle / name), load_external_data=False)  # noqa: E731
    j = _Joiner()
    pos = load("positions.onnx")
    shared = {o.name: o.name for o in pos.graph.output}
    j.add(pos, "positions/", {}, shared)
    hidden, mlp_out = "@hidden", None
    for i in range(layers):
        attn, up, down = load(f"layer.{i}.attn.onnx"), load(f"layer.{i}.mlp_up.onnx"), load(f"layer.{i}.mlp_down.onnx")
        p = f"l{i}."
        handles = {g: group_input(i, f"{g}.handle") for g in GROUPS}
        wired = {**shared, "hidden": hidden, "cache_in": "@" + group_input(i, "cache_in")}
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
        for g in GROUPS:
            j.inputs.setdefault(handles[g], onnx.helper.make_tensor_value_info(handles[g], onnx.TensorProto.INT64, [1]))
        if not overlap:
            j.step(p + "in_indices", handles["up_gate"], p + "in_slots", p + "up_gate.step")
        slab_up = {vi.name: "@" + group_input(i, vi.name) for vi in up.graph.input if vi.name.startswith("up_gate.")}
        j.add(up, p + "up/", {"x": p + "x", "in_indices": p + "in_indices", "in_slots": p + "in_slots",
                              "cache_glu": "@" + group_input(i, "cache_glu"), **slab_up},
              {"glu": p + "glu", "glu_indices": p + "glu_indices"}, gamma)
        if overlap:
            j.split_step(p + "in_indices", handles["up_gate"], p + "in_slots", p + "up_gate.step")
        j.settle(p + "glu", handles["up_gate"], p + "up_gate.settle")
        if not overlap:
            j.step(p + "glu_indices", handles["down"], p + "glu_slots", p + "down.step")
        slab_down = {vi.name: "@" + group_input(i, vi.name) for vi in down.graph.input if vi.name.startswith("down.")}
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


def _joined_bytes(path: Path, layers: int, gamma: float | None, accuracy_level: int | None,
                  standard_attention: bool, overlap: bool, prefetch: bool = False) -> bytes:
    """The serialized joined model (what ``joined_model`` runs in its child)."""
    model = fuse_graphs(path, layers, gamma, overlap, prefetch)
    if accuracy_level is not None:
        from dipdeploy.ops.nodes import with_accuracy_level

        model = with_accuracy_level(model, accuracy_level)
    if standard_attention:
        from dipdeploy.runtime.whole import check_past_readers

        check_past_readers(model.graph, layers, f"{path} (joined per-layer graphs)")
    return model.SerializeToString()


def joined_model(path: Path, layers: int, gamma: float | None, accuracy_level: int | None,
                 standard_attention: bool, overlap: bool = False, prefetch: bool = False) -> bytes:
    """``_joined_bytes`` in a child process (module docstring); its one-line error becomes a BundleError."""
    args = [str(path), str(layers), "" if gamma is None else repr(float(gamma)),
            "" if accuracy_level is None else str(accuracy_level), str(int(standard_attention)), str(int(overlap)),
            str(int(prefetch))]
    import dipdeploy

    root = str(Path(dipdeploy.__file__).resolve().parents[1])  # the child imports this dipdeploy, wherever it lies
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-m", "dipdeploy.runtime.fused", *args], capture_output=True, env=env)
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise BundleError(lines[-1] if lines else f"joining the graphs of {path} failed")
    return done.stdout


class FusedModel:
    """The joined decoder in one ORT session bound to preallocated buffers and to the groups' slabs and
    native state (``bind_groups`` after every cache reset: a reset makes new native groups).

    A batched prefill (``chunk`` > 1 tokens per run) runs the same session through a second binding: the
    slab inputs bound to the engine's full-height prefill buffers, every residency input to all-resident
    (the prompt selects by plain DIP, as the per-layer path's batched prefill does), while the groups are
    in ``NativeCache.prefill`` mode, in which the same CacheStep/CacheSettle nodes fill those buffers
    with a chunk's rows and warm the caches from its selections."""

    def __init__(self, path: Path, options, kv, context: int, d: int, vocab: int, layers: int,
                 gamma: float | None, accuracy_level: int | None, chunk: int = 1, overlap: bool = False,
                 prefetch: bool = False):
        import onnxruntime as ort

        model = joined_model(path, layers, gamma, accuracy_level, kv.attention == "standard", overlap, prefetch)
        self.overlap = overlap  # CacheBegin/CacheEnd: the misses read while the resident rows are multiplied
        # whether any layer got a CachePrefetch (only pre-norm layers do): its op type in the serialized graph
        self.reads_ahead = overlap and prefetch and PREFETCH_OP.encode() in model
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path))
        # ORT's memory patterns are planned per set of input shapes, and the attention mask grows by one
        # position per token: with them the arena kept more memory, at the same speed without them
        # (benchmarks/results/notes.md)
        options.enable_mem_pattern = False
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.bound = Bound(self.session)
        self.kv, self.context, self.layers, self.chunk = kv, context, layers, chunk
        self.hidden = np.zeros((1, 1, d), np.float32)
        self.positions = Buffer(np.zeros(chunk, np.int64))
        self.mask = Buffer(np.ones(context, np.int64))
        self.logits = np.zeros((1, 1, vocab), np.float32)
        self.bound.input("hidden", self.hidden)
        self.bound.output("logits", self.logits)
        self.handles = np.zeros(2 * layers, np.int64)  # bound: the graph reads each group's handle here
        self.prefill_bound = self.chunk_hidden = None
        if chunk > 1:
            self.prefill_bound = Bound(self.session)
            self.chunk_hidden = Buffer(np.zeros(chunk * d, np.float32))
            self.prefill_bound.output("logits", self.logits)

    def slab_inputs(self, layer: int, group: str) -> list:
        """The session's slab inputs of one group with the per-layer graph's names (``up_gate.qweight``…),
        as ``slab.group_arrays`` takes them."""
        prefix = group_input(layer, group + ".")
        return [_Arg(a.name[len(group_input(layer, "")):], a.shape) for a in self.session.get_inputs()
                if a.name.startswith(prefix) and not a.name.endswith(".handle")]

    def bind_groups(self, slabs, full=None) -> None:
        """Bind every group's slab arrays, residency and native handle (``GroupSlab.native_state``); with a
        prefill binding, also its full-height buffers (``full(slab)``: the slab arrays' names → buffers)
        and all-resident residency."""
        b, p = self.bound, self.prefill_bound
        everything = {}
        for i, pair in enumerate(slabs):
            for g, (group, slab) in enumerate(zip(GROUPS, pair)):
                nat = slab.native_state()
                residency = group_input(i, ("cache_in", "cache_glu")[g])
                handle = self.handles[2 * i + g: 2 * i + g + 1]
                self.handles[2 * i + g] = nat.handle
                for name, value in slab.feeds.items():
                    b.input(group_input(i, name), value)
                b.input(residency, nat.state.resident.view(bool))
                b.input(group_input(i, f"{group}.handle"), handle)
                if p is None:
                    continue
                for name, value in {**slab.arrays.shared, **full(slab)}.items():
                    p.input(group_input(i, name), value)
                p.input(residency, everything.setdefault(slab.rows, np.ones(slab.rows, bool)))
                p.input(group_input(i, f"{group}.handle"), handle)

    def run(self, pos: int) -> np.ndarray:
        """One token (``hidden`` already holds its embedding) at position ``pos``; the logits [V] (a view of
        the bound buffer). The KV cache advances by one."""
        if pos + 1 > self.context:
            raise ValueError(f"context of {self.context} tokens is full; raise --context")
        b = self.bound
        self.positions.array[0] = pos
        b.input_at("position_ids", self.positions, (1, 1))
        b.input_at("attention_mask", self.mask, (1, pos + 1))
        self.kv.bind_session(b, 1)
        b.run()
        self.kv.commit_session()
        self.kv.advance(1)
        return self.logits[0, -1]

    def run_chunk(self, pos: int, n: int) -> np.ndarray:
        """``n`` ≤ ``chunk`` tokens (``chunk_hidden`` holds their embeddings) at positions ``pos``…, through
        the prefill binding, the groups in prefill mode; the logits [V] after the last one."""
        if pos + n > self.context:
            raise ValueError(f"context of {self.context} tokens is full; raise --context")
        if self.prefill_bound is None or not 1 <= n <= self.chunk:
            raise ValueError(f"a chunk holds 1 to {self.chunk if self.prefill_bound else 0} tokens, got {n}")
        b = self.prefill_bound
        self.positions.array[:n] = np.arange(pos, pos + n)
        b.input_at("hidden", self.chunk_hidden, (1, n, self.hidden.shape[-1]))
        b.input_at("position_ids", self.positions, (1, n))
        b.input_at("attention_mask", self.mask, (1, pos + n))
        self.kv.bind_session(b, n)
        b.run()
        self.kv.commit_session()
        self.kv.advance(n)
        return self.logits[0, -1]


class _Arg:
    """A graph input as ``slab.group_arrays`` reads it (ORT's ``NodeArg``: name and shape)."""

    def __init__(self, name: str, shape):
        self.name, self.shape = name, shape


if __name__ == "__main__":  # joined_model's child: BUNDLE LAYERS GAMMA LEVEL STANDARD OVERLAP PREFETCH → the bytes
    bundle, n, g, level, standard, overlap, prefetch = sys.argv[1:8]
    try:
        out = _joined_bytes(Path(bundle), int(n), float(g) if g else None, int(level) if level else None,
                            standard == "1", overlap == "1", prefetch == "1")
    except (BundleError, OSError) as err:
        sys.exit(f"{err}")
    sys.stdout.buffer.write(out)
