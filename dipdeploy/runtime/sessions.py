"""ORT sessions over a bundle's per-layer graphs, and the IOBinding helper the decode loop uses.

``open_session`` can override the DIP-CA γ of a graph's ``TopKColumnMask`` nodes: the attribute is
baked at export, but γ is a run-time choice (a DIP bundle becomes DIP-CA with γ < 1), so the graph
is loaded without its weights, the attribute rewritten, and the session built from bytes with the
bundle folder as the external-data root. Torch-free (floor 4).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dipdeploy.ops.schemas import DOMAIN, TOPK_OP


def open_session(path: Path, options, gamma: float | None = None):
    """An ORT CPU session for ``path``; with ``gamma`` every TopKColumnMask gets that γ."""
    import onnxruntime as ort

    providers = ["CPUExecutionProvider"]
    if gamma is None:
        return ort.InferenceSession(str(path), options, providers=providers)
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == TOPK_OP and node.domain == DOMAIN:
            attrs = [a for a in node.attribute if a.name != "gamma"]
            del node.attribute[:]
            node.attribute.extend(attrs + [onnx.helper.make_attribute("gamma", float(gamma))])
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
    return ort.InferenceSession(model.SerializeToString(), options, providers=providers)


class Bound:
    """A session with one reusable IOBinding: inputs bound by name (numpy zero-copy, or OrtValues),
    outputs left to ORT's CPU allocator and returned as OrtValues (no copy between sessions).

    Outputs are re-bound before every run: a bound output keeps its buffer, and ORT writes the next
    run into it when the shape matches (and refuses a growing KV cache), which would overwrite an
    OrtValue another session still reads."""

    def __init__(self, session):
        self.session = session
        self.io = session.io_binding()
        self.inputs = [i.name for i in session.get_inputs()]
        self.outputs = [o.name for o in session.get_outputs()]

    def bind(self, name: str, value) -> None:
        if isinstance(value, np.ndarray):
            self.io.bind_cpu_input(name, value)
        else:
            self.io.bind_ortvalue_input(name, value)

    def run(self, **feeds) -> dict:
        for name, value in feeds.items():
            self.bind(name, value)
        self.io.clear_binding_outputs()
        for name in self.outputs:
            self.io.bind_output(name, "cpu")
        self.session.run_with_iobinding(self.io)
        return dict(zip(self.outputs, self.io.get_outputs()))
