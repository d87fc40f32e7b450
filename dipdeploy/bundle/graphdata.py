"""The external data an ONNX graph names, read from its protobuf bytes without the ``onnx`` package.

onnxruntime opens every file an initializer's ``external_data`` ``location`` names, relative to the
graph's folder, before dipdeploy sees a byte of it: a graph edited to name an unlisted file, a path
outside the bundle or a link would make it read whatever lies there. ``verify`` therefore reads each
graph's locations first and holds them to the manifest's ``files``. The runtime must run on a board
without ``onnx`` (tests/test_lean_import.py), so this is a small walk over the protobuf wire format that
descends only into the messages that can hold a tensor (onnx.proto's field numbers below) and skips
every other field by its length. Torch-free, no imports beyond the standard library.
"""

from __future__ import annotations

from collections.abc import Iterator

# onnx.proto field numbers of the messages a tensor can sit in.
MODEL_GRAPH, MODEL_TRAINING, MODEL_FUNCTIONS = 7, 20, 25
TRAINING_GRAPHS = (1, 2)  # TrainingInfoProto.initialization, .algorithm
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_SPARSE = 1, 5, 15
NODE_ATTRIBUTE = 5
FUNCTION_NODE, FUNCTION_ATTRIBUTE = 7, 11
ATTR_TENSORS, ATTR_GRAPHS, ATTR_SPARSE = (5, 10), (6, 11), (22, 23)
SPARSE_TENSORS = (1, 2)  # SparseTensorProto.values, .indices
TENSOR_DIMS, TENSOR_TYPE, TENSOR_NAME, TENSOR_EXTERNAL, TENSOR_LOCATION = 1, 2, 8, 13, 14
GRAPH_INPUT = 11  # GraphProto.input: ValueInfoProto
VALUE_NAME, VALUE_TYPE = 1, 2  # ValueInfoProto.name, .type
TYPE_TENSOR, TENSOR_TYPE_SHAPE = 1, 2  # TypeProto.tensor_type, TypeProto.Tensor.shape
SHAPE_DIM, DIM_VALUE, DIM_PARAM = 1, 1, 2  # TensorShapeProto.dim, Dimension.dim_value, .dim_param
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# Subgraphs (If, Loop, Scan bodies) nest; export writes none, and a deeper graph is refused, not recursed into.
MAX_DEPTH = 32


class GraphDataError(ValueError):
    """The bytes are not an ONNX model this walk can read (truncated, another wire type, too deep)."""


def _varint(data: memoryview, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise GraphDataError("a truncated or overlong varint")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def _fields(data: memoryview) -> Iterator[tuple[int, int, memoryview | int]]:
    """(field number, wire type, payload) of one message: a memoryview for length-delimited fields, the
    value of a varint, 0 for fixed-width fields (their bytes are skipped)."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            yield number, wire, value
        elif wire == 2:
            size, i = _varint(data, i)
            if i + size > len(data):
                raise GraphDataError(f"field {number} runs past the end of its message")
            yield number, wire, data[i:i + size]
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
            if i > len(data):
                raise GraphDataError(f"field {number} runs past the end of its message")
            yield number, wire, 0
        else:
            raise GraphDataError(f"wire type {wire} (field {number}) is not one onnx uses")


def _text(data: memoryview) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def _packed(data: memoryview) -> list[int]:
    """The varints of a packed repeated field."""
    out, i = [], 0
    while i < len(data):
        value, i = _varint(data, i)
        out.append(value - (1 << 64) if value >= 1 << 63 else value)  # int64: a negative dim reads as huge
    return out


def _tensor(data: memoryview) -> dict | None:
    """{name, location, offset, length, dims, data_type} of a tensor stored outside its graph
    (``location`` None when the tensor says EXTERNAL but names no file), else None."""
    name, entries, external, dims, data_type = "", {}, False, [], 0
    for number, wire, value in _fields(data):
        if number == TENSOR_DIMS:
            dims += _packed(value) if wire == 2 else [value - (1 << 64) if value >= 1 << 63 else value]
        elif number == TENSOR_TYPE and wire == 0:
            data_type = value
        elif number == TENSOR_NAME and wire == 2:
            name = _text(value)
        elif number == TENSOR_LOCATION and wire == 0:
            external = value == EXTERNAL
        elif number == TENSOR_EXTERNAL and wire == 2:
            key = val = None
            for n, w, v in _fields(value):
                if w == 2 and n == 1:
                    key = _text(v)
                elif w == 2 and n == 2:
                    val = _text(v)
            if key is not None:
                entries[key] = val
    if not (external or entries):
        return None
    return {"name": name, "location": entries.get("location"), "offset": entries.get("offset", "0"),
            "length": entries.get("length"), "dims": dims, "data_type": data_type}


def _graph(data: memoryview, depth: int) -> Iterator[dict]:
    if depth > MAX_DEPTH:
        raise GraphDataError(f"subgraphs nested deeper than {MAX_DEPTH}")
    for number, wire, value in _fields(data):
        if wire != 2:
            continue
        if number == GRAPH_INITIALIZER:
            yield from _maybe(_tensor(value))
        elif number == GRAPH_SPARSE:
            yield from _sparse(value)
        elif number == GRAPH_NODE:
            yield from _node(value, NODE_ATTRIBUTE, depth)


def _maybe(entry: dict | None) -> Iterator[dict]:
    if entry is not None:
        yield entry


def _sparse(data: memoryview) -> Iterator[dict]:
    for number, wire, value in _fields(data):
        if wire == 2 and number in SPARSE_TENSORS:
            yield from _maybe(_tensor(value))


def _node(data: memoryview, attribute_field: int, depth: int) -> Iterator[dict]:
    for number, wire, value in _fields(data):
        if wire == 2 and number == attribute_field:
            yield from _attribute(value, depth)


def _attribute(data: memoryview, depth: int) -> Iterator[dict]:
    for number, wire, value in _fields(data):
        if wire != 2:
            continue
        if number in ATTR_TENSORS:
            yield from _maybe(_tensor(value))
        elif number in ATTR_GRAPHS:
            yield from _graph(value, depth + 1)
        elif number in ATTR_SPARSE:
            yield from _sparse(value)


def _function(data: memoryview, depth: int) -> Iterator[dict]:
    for number, wire, value in _fields(data):
        if wire == 2 and number == FUNCTION_NODE:
            yield from _node(value, NODE_ATTRIBUTE, depth)
        elif wire == 2 and number == FUNCTION_ATTRIBUTE:
            yield from _attribute(value, depth)


def external_data(model: bytes) -> list[dict]:
    """Every tensor of a serialized ModelProto (its graph, subgraphs, node attributes, functions and
    training graphs) that onnxruntime would read from another file: {name, location, offset, length,
    dims, data_type}, location, offset and length as the graph writes them (strings; ``location`` None
    if missing), ``data_type`` onnx.proto's number (0 where the graph gives none). Raises
    :class:`GraphDataError` for bytes that are not a readable ModelProto."""
    found: list[dict] = []
    for number, wire, value in _fields(memoryview(model)):
        if wire != 2:
            continue
        if number == MODEL_GRAPH:
            found += _graph(value, 0)
        elif number == MODEL_TRAINING:
            for n, w, v in _fields(value):
                if w == 2 and n in TRAINING_GRAPHS:
                    found += _graph(v, 1)
        elif number == MODEL_FUNCTIONS:
            found += _function(value, 0)
    return found


def _dims(type_proto: memoryview) -> list[int | str] | None:
    """A tensor type's dims (an int, or the symbolic name), None when it declares no shape."""
    for number, wire, value in _fields(type_proto):
        if number == TYPE_TENSOR and wire == 2:
            for n, w, shape in _fields(value):
                if n == TENSOR_TYPE_SHAPE and w == 2:
                    dims: list[int | str] = []
                    for d, dw, dim in _fields(shape):
                        if d == SHAPE_DIM and dw == 2:
                            found: int | str = ""
                            for k, kw, v in _fields(dim):
                                found = v if (k, kw) == (DIM_VALUE, 0) else _text(v) if (k, kw) == (DIM_PARAM, 2) else found
                            dims.append(found)
                    return dims
    return None


def graph_inputs(model: bytes) -> dict[str, list[int | str] | None]:
    """The main graph's inputs of a serialized ModelProto: name → dims (an int where the graph fixes the
    size, the symbolic name or "" where it does not; None without a declared shape). What onnxruntime
    will require of every array fed, so ``verify`` can hold it to the manifest before a run meets it.
    Raises :class:`GraphDataError` for bytes that are not a readable ModelProto."""
    out: dict[str, list[int | str] | None] = {}
    for number, wire, graph in _fields(memoryview(model)):
        if number != MODEL_GRAPH or wire != 2:
            continue
        for n, w, value in _fields(graph):
            if n != GRAPH_INPUT or w != 2:
                continue
            name, dims = "", None
            for k, kw, v in _fields(value):
                if (k, kw) == (VALUE_NAME, 2):
                    name = _text(v)
                elif (k, kw) == (VALUE_TYPE, 2):
                    dims = _dims(v)
            out[name] = dims
    return out
