"""``dipdeploy.bundle.graphdata`` finds every external tensor onnxruntime would open, wherever the
graph puts it (initializers, node attributes, subgraphs), and refuses bytes it cannot read."""

import onnx
import pytest
from onnx import TensorProto, helper

from dipdeploy.bundle.graphdata import MAX_DEPTH, GraphDataError, external_data


def _external(name: str, location: str, offset: int = 0, length: int = 16) -> TensorProto:
    t = helper.make_tensor(name, TensorProto.FLOAT, [4], [0.0] * 4)
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = key, value
    return t


def _model() -> onnx.ModelProto:
    then = helper.make_graph([helper.make_node("Identity", ["w_then"], ["y"])], "then", [],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                             [_external("w_then", "../then.bin")])
    other = helper.make_graph([helper.make_node("Constant", [], ["y"], value=_external("c_else", "/abs.bin"))],
                              "else", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    node = helper.make_node("If", ["cond"], ["out"], then_branch=then, else_branch=other)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4])],
                              [_external("w", "dense.bin", 4096, 16),
                               helper.make_tensor("inline", TensorProto.FLOAT, [1], [1.0])])
    sparse = helper.make_sparse_tensor(_external("sv", "sparse.bin"), helper.make_tensor("si", TensorProto.INT64,
                                                                                        [1], [0]), [4])
    graph.sparse_initializer.append(sparse)
    return helper.make_model(graph)


def test_every_external_tensor_is_found():
    found = external_data(_model().SerializeToString())
    got = {(e["name"], e["location"], e["offset"], e["length"]) for e in found}
    assert got == {("w", "dense.bin", "4096", "16"), ("w_then", "../then.bin", "0", "16"),
                   ("c_else", "/abs.bin", "0", "16"), ("sv", "sparse.bin", "0", "16")}


def test_each_external_tensor_keeps_its_type_and_shape():
    """What a session needs to view the tensor's bytes in place (``sessions.mapped_weights``)."""
    t = _external("q", "dense.bin")
    t.data_type = TensorProto.UINT8
    del t.dims[:]
    t.dims.extend([3, 1, 5])
    graph = helper.make_graph([], "g", [], [], [t])
    (found,) = external_data(helper.make_model(graph).SerializeToString())
    assert (found["dims"], found["data_type"]) == ([3, 1, 5], TensorProto.UINT8)


def test_a_graph_without_external_data_has_none():
    assert external_data(b"") == []
    graph = helper.make_graph([], "g", [], [], [helper.make_tensor("x", TensorProto.FLOAT, [1], [1.0])])
    assert external_data(helper.make_model(graph).SerializeToString()) == []


@pytest.mark.parametrize("data", [_model().SerializeToString()[:-3], b"\x3a\xff", b"\x0b\x00", b"\xff" * 12],
                         ids=["truncated", "length past the end", "group wire type", "overlong varint"])
def test_unreadable_bytes_are_refused(data):
    with pytest.raises(GraphDataError):
        external_data(data)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field: its tag, its length as a varint, its bytes."""
    size, n = b"", len(payload)
    while True:
        size += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return bytes([number << 3 | 2]) + size + payload


def test_subgraphs_nested_too_deep_are_refused():
    """Written on the wire by hand: protobuf itself will not build a message this deep."""
    graph = b""
    for _ in range(MAX_DEPTH + 2):  # graph.node[0].attribute[0].g = the graph below
        graph = _field(1, _field(5, _field(6, graph)))
    with pytest.raises(GraphDataError, match="nested deeper"):
        external_data(_field(7, graph))
