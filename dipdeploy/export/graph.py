"""A small ONNX graph under construction: stable node names, output names, constants, model assembly.

Nodes are named by their place in the model, ``/model/layers.{i}/mlp/down_proj/<Op>``, and a node's
outputs are ``<node>/output_<k>`` (docs/design.md §9). Weights are external TensorProtos from a
:class:`~dipdeploy.export.weights.WeightStore`; small constants (shapes, axes) live in the graph.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import FunctionProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from dipdeploy.ops.schemas import DOMAIN, IR_VERSION, ONNX_OPSET, OPSET_VERSION

MS_DOMAIN = "com.microsoft"


class Graph:
    """Collects nodes, inputs, outputs and initializers of one graph."""

    def __init__(self, name: str, accuracy_level: int = 0):
        self.name = name
        self.accuracy_level = accuracy_level
        self.variants: list = []  # TopKVariant / SgmmVariant of the custom-op nodes, for the fallbacks
        self.nodes: list[NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.initializers: dict[str, TensorProto] = {}
        self._consts: dict[tuple, str] = {}
        self.uses_ms = False

    def op(self, name: str, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "",
           unused: tuple[int, ...] = (), **attrs):
        """Add node ``name`` (``/…/<Op>``); return its output name, or the list of them. Optional outputs
        listed in ``unused`` are left unnamed (""), so the kernel need not produce them."""
        outs = ["" if k in unused else f"{name}/output_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain or None, **attrs))
        self.uses_ms |= domain == MS_DOMAIN
        return outs[0] if n_out == 1 else outs

    def add_custom(self, built) -> str:
        """Add a (node, variant) pair from ``dipdeploy.ops.nodes``; the variant picks its fallback."""
        node, variant = built
        self.nodes.append(node)
        self.variants.append(variant)
        return node.output[0]

    def fallbacks(self) -> list[FunctionProto]:
        from dipdeploy.ops.fallback import SgmmVariant, TopKVariant, fallback_functions

        return fallback_functions([v for v in self.variants if isinstance(v, TopKVariant)],
                                  [v for v in self.variants if isinstance(v, SgmmVariant)])

    def const(self, value, dtype=np.int64) -> str:
        """A small constant initializer, shared by value (shapes, axes, scalars)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = f"/const/{arr.dtype.name}_{len(self._consts)}"
            self.initializers[name] = numpy_helper.from_array(arr, name)
            self._consts[key] = name
        return self._consts[key]

    def weight(self, proto: TensorProto) -> str:
        self.initializers[proto.name] = proto
        return proto.name

    def input(self, name: str, elem: int, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, source: str, name: str, elem: int, shape: list) -> None:
        """Expose ``source`` as graph output ``name``: the producing node's output is renamed (no
        Identity node per output, which costs a kernel call per token for every KV tensor)."""
        if source != name:
            producer = next((n for n in reversed(self.nodes) if source in n.output), None)
            if producer is None:
                self.nodes.append(helper.make_node("Identity", [source], [name], name=f"{name}/Identity"))
            else:
                for node in self.nodes:
                    node.output[:] = [name if o == source else o for o in node.output]
                    node.input[:] = [name if i == source else i for i in node.input]
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    def model(self, doc: str = "") -> ModelProto:
        """The ModelProto, with the fallback functions of every custom-op variant used attached."""
        functions = self.fallbacks()
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs,
                                  initializer=list(self.initializers.values()))
        opsets = [helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
        if self.uses_ms:
            opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
        model = helper.make_model(graph, opset_imports=opsets, functions=functions, ir_version=IR_VERSION,
                                  producer_name="dipdeploy.export", doc_string=doc)
        return model


def check_model(path) -> None:
    """onnx.checker (with external data beside ``path``) and strict shape inference."""
    onnx.checker.check_model(str(path))
    model = onnx.load(str(path), load_external_data=False)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
