"""The one-node ONNX models the kernels suite times, with random weights, and the bound sessions that run them.

Weights are random: a kernel's time does not depend on the values (its correctness is
tests/test_ops_harness.py's), so the formats are built from valid random codes without quantising a real
matrix. The sparse kernel gets its weights as bound graph inputs (zero copy, as the host runtime binds a
slab); the dense MatMul and MatMulNBits hold theirs as constant initializers, as a dense export does.
``stack`` runs L copies of a model with distinct weights side by side in one graph, so the weights of a
run exceed the last-level cache and come from DRAM, as a decode step over a whole model reads them.
"""

from __future__ import annotations

import copy
import time

import numpy as np

#: BQ4's block and MatMulNBits' (int4, symmetric): the two read the same bytes per weight
BLOCK = 32


def random_weights(fmt: str, rows: int, cols: int, rng: np.random.Generator):
    """Random ``OpWeights`` in ``fmt`` (fp32, fp16, bq4, vq3): valid codes, positive scales."""
    from dipdeploy.ops.formats import OpWeights, weight_format
    from dipdeploy.quant.block import BlockQuantTensor
    from dipdeploy.quant.config import Block4QuantConfig, VQ3QuantConfig
    from dipdeploy.quant.vq import VQTensor, group_shape

    record = weight_format(fmt)
    if record.config is None:  # unquantised: the matrix in the format's dtype
        w = rng.standard_normal((rows, cols), dtype=np.float32)
        return OpWeights.from_matrix(w.astype(record.dtypes[0]))
    if record.config is Block4QuantConfig:
        q = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
        s = (rng.random((rows, cols // BLOCK), dtype=np.float32) * 0.01 + 1e-3).astype(np.float16)
        return OpWeights.from_packed(BlockQuantTensor(Block4QuantConfig(block_size=BLOCK), rows, cols, q, s))
    cfg = VQ3QuantConfig()
    gr, gc = group_shape(rows, cols, cfg)
    ngr, ngc = -(-rows // gr), -(-cols // gc)
    codes = rng.integers(0, 256, (rows, -(-6 * (cols // 2) // 8)), dtype=np.uint8)
    books = rng.integers(-128, 128, (ngr, ngc, 64, 2), dtype=np.int8)
    return OpWeights.from_packed(VQTensor(cfg, rows, cols, gr, gc, codes, books, np.full((ngr, ngc), 1e-3, np.float16)))


def dense_model(w: np.ndarray):
    """ONNX MatMul X [1, R] × W [R, O], W a constant."""
    from onnx import TensorProto, helper, numpy_helper

    rows, cols = w.shape
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "dense",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, rows])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, cols])],
                              initializer=[numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def matmulnbits_model(rows: int, cols: int, level: int, rng: np.random.Generator):
    """com.microsoft MatMulNBits (K = rows, N = cols), int4 block 32, random codes: (model, weight bytes)."""
    from onnx import TensorProto, helper, numpy_helper

    nblk = rows // BLOCK
    b = rng.integers(0, 256, (cols, nblk, BLOCK // 2), dtype=np.uint8)
    scales = (rng.random(cols * nblk, dtype=np.float32) * 0.01 + 1e-3).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["X", "B", "scales"], ["Y"], domain="com.microsoft", K=rows, N=cols,
                            bits=4, block_size=BLOCK, accuracy_level=level)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, rows])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, cols])],
                              initializer=[numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                   helper.make_opsetid("com.microsoft", 1)])
    return model, b.nbytes + scales.nbytes


def stack(models: list, shared: set[str]):
    """One model running ``models`` side by side (one per "layer"): every name not in ``shared`` gets the
    suffix ``.l`` of its layer."""
    from onnx import helper

    first = models[0]
    graph = helper.make_graph([], "layers", [], [])
    seen = set()
    for layer, m in enumerate(models):
        def rn(n: str) -> str:
            return n if (not n or n in shared) else f"{n}.{layer}"

        for node in m.graph.node:
            c = copy.deepcopy(node)
            c.name = f"{node.name}.{layer}"
            c.input[:] = [rn(i) for i in node.input]
            c.output[:] = [rn(o) for o in node.output]
            graph.node.append(c)
        for t in m.graph.initializer:
            c = copy.deepcopy(t)
            c.name = rn(t.name)
            graph.initializer.append(c)
        for vi in m.graph.input:
            if rn(vi.name) not in seen:
                seen.add(rn(vi.name))
                c = copy.deepcopy(vi)
                c.name = rn(vi.name)
                graph.input.append(c)
        for vi in m.graph.output:
            c = copy.deepcopy(vi)
            c.name = rn(vi.name)
            graph.output.append(c)
    out = helper.make_model(graph, opset_imports=list(first.opset_import), ir_version=first.ir_version)
    out.functions.extend(first.functions)
    return out


def session(model_bytes: bytes, threads: int, native: bool):
    """A session without spinning: the cases run round-robin, and a multi-thread session's pool spinning
    after its run would take the core from the next case."""
    import onnxruntime as ort

    from dipdeploy.ops.native import session_options

    so = session_options(threads, native)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


class Bound:
    """A session with every input and output bound once (zero copy), warmed by one run (allocations,
    first touch), ready for timed calls."""

    def __init__(self, sess, feeds: dict) -> None:
        import onnxruntime as ort

        self.sess, self.io = sess, sess.io_binding()
        self.values = [ort.OrtValue.ortvalue_from_numpy(a) for a in feeds.values()]
        for name, value in zip(feeds, self.values):
            self.io.bind_ortvalue_input(name, value)
        for o in sess.get_outputs():
            self.io.bind_output(o.name)
        sess.run_with_iobinding(self.io)

    def call_us(self) -> tuple[float, float]:
        """(wall µs, CPU µs of this thread) of one call. With one intra-op thread ORT computes on the
        calling thread, so the CPU time is the call's cost without the time other jobs held the core."""
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        self.sess.run_with_iobinding(self.io)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        return (t1 - t0) / 1e3, (c1 - c0) / 1e3
