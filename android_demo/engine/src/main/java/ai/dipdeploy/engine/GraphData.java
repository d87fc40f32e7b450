package ai.dipdeploy.engine;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The external data an ONNX graph names, read from its protobuf bytes: the Java mirror of
 * {@code dipdeploy/bundle/graphdata.py}, with its error strings. ONNX Runtime opens every file an
 * initializer's {@code external_data} {@code location} names, relative to the graph's folder, before the
 * engine sees a byte of it, so each graph's locations are held to the manifest's {@code files} first. A
 * small walk over the protobuf wire format that descends only into the messages that can hold a tensor
 * (onnx.proto's field numbers below, the same as Python's) and skips every other field by its length.
 */
final class GraphData {
    private GraphData() {}

    // onnx.proto field numbers of the messages a tensor can sit in (graphdata.py's constants).
    static final int MODEL_GRAPH = 7, MODEL_TRAINING = 20, MODEL_FUNCTIONS = 25;
    static final int[] TRAINING_GRAPHS = {1, 2}; // TrainingInfoProto.initialization, .algorithm
    static final int GRAPH_NODE = 1, GRAPH_INITIALIZER = 5, GRAPH_SPARSE = 15;
    static final int NODE_ATTRIBUTE = 5;
    static final int FUNCTION_NODE = 7, FUNCTION_ATTRIBUTE = 11;
    static final int[] ATTR_TENSORS = {5, 10}, ATTR_GRAPHS = {6, 11}, ATTR_SPARSE = {22, 23};
    static final int[] SPARSE_TENSORS = {1, 2}; // SparseTensorProto.values, .indices
    static final int TENSOR_NAME = 8, TENSOR_EXTERNAL = 13, TENSOR_LOCATION = 14;
    static final long EXTERNAL = 1; // TensorProto.DataLocation.EXTERNAL
    /** Subgraphs nest; export writes none, and a deeper graph is refused, not recursed into. */
    static final int MAX_DEPTH = 32;

    /** The bytes are not an ONNX model this walk can read (truncated, another wire type, too deep). */
    static final class Error extends Exception {
        private static final long serialVersionUID = 1L;

        Error(String message) {
            super(message);
        }
    }

    /** One tensor stored outside its graph, its fields as the graph writes them ({@code location} null if missing). */
    static final class Entry {
        final String name, location, offset, length;

        Entry(String name, String location, String offset, String length) {
            this.name = name;
            this.location = location;
            this.offset = offset;
            this.length = length;
        }
    }

    /** One field of a message: its number, wire type, a varint's value or a length-delimited payload's span. */
    private static final class Field {
        int number, wire, from, to;
        long value;
    }

    /** A message's bytes {@code [from, to)} of {@code data}, walked field by field. */
    private static final class Reader {
        final byte[] data;
        int i;
        final int end;

        Reader(byte[] data, int from, int to) {
            this.data = data;
            this.i = from;
            this.end = to;
        }

        long varint() throws Error {
            long value = 0;
            int shift = 0;
            while (true) {
                if (i >= end || shift > 63) throw new Error("a truncated or overlong varint");
                int b = data[i++] & 0xff;
                if (shift < 64) value |= (long) (b & 0x7f) << shift;
                if (b < 0x80) return value;
                shift += 7;
            }
        }

        /** The next field, or null at the end of the message. */
        Field next() throws Error {
            if (i >= end) return null;
            long key = varint();
            Field f = new Field();
            f.number = (int) (key >>> 3);
            f.wire = (int) (key & 7);
            if (f.wire == 0) f.value = varint();
            else if (f.wire == 2) {
                long size = varint();
                if (size < 0 || size > end - i)
                    throw new Error("field " + Long.toUnsignedString(key >>> 3) + " runs past the end of its message");
                f.from = i;
                f.to = i + (int) size;
                i = f.to;
            } else if (f.wire == 1 || f.wire == 5) {
                i += f.wire == 1 ? 8 : 4;
                if (i > end)
                    throw new Error("field " + Long.toUnsignedString(key >>> 3) + " runs past the end of its message");
            } else
                throw new Error("wire type " + f.wire + " (field " + Long.toUnsignedString(key >>> 3)
                        + ") is not one onnx uses");
            return f;
        }
    }

    private static boolean in(int[] set, int n) {
        for (int v : set) if (v == n) return true;
        return false;
    }

    private static String text(byte[] data, Field f) {
        return new String(data, f.from, f.to - f.from, StandardCharsets.UTF_8); // malformed bytes become U+FFFD
    }

    private static void tensor(byte[] data, Field t, List<Entry> out) throws Error {
        String name = "";
        Map<String, String> entries = new LinkedHashMap<>();
        boolean external = false;
        Reader r = new Reader(data, t.from, t.to);
        for (Field f = r.next(); f != null; f = r.next()) {
            if (f.number == TENSOR_NAME && f.wire == 2) name = text(data, f);
            else if (f.number == TENSOR_LOCATION && f.wire == 0) external = f.value == EXTERNAL;
            else if (f.number == TENSOR_EXTERNAL && f.wire == 2) {
                String key = null, val = null;
                Reader e = new Reader(data, f.from, f.to);
                for (Field g = e.next(); g != null; g = e.next()) {
                    if (g.wire == 2 && g.number == 1) key = text(data, g);
                    else if (g.wire == 2 && g.number == 2) val = text(data, g);
                }
                if (key != null) entries.put(key, val);
            }
        }
        if (!(external || !entries.isEmpty())) return;
        out.add(new Entry(name, entries.get("location"), entries.containsKey("offset") ? entries.get("offset") : "0",
                entries.get("length")));
    }

    private static void graph(byte[] data, Field g, int depth, List<Entry> out) throws Error {
        if (depth > MAX_DEPTH) throw new Error("subgraphs nested deeper than " + MAX_DEPTH);
        Reader r = new Reader(data, g.from, g.to);
        for (Field f = r.next(); f != null; f = r.next()) {
            if (f.wire != 2) continue;
            if (f.number == GRAPH_INITIALIZER) tensor(data, f, out);
            else if (f.number == GRAPH_SPARSE) sparse(data, f, out);
            else if (f.number == GRAPH_NODE) node(data, f, depth, out);
        }
    }

    private static void sparse(byte[] data, Field s, List<Entry> out) throws Error {
        Reader r = new Reader(data, s.from, s.to);
        for (Field f = r.next(); f != null; f = r.next())
            if (f.wire == 2 && in(SPARSE_TENSORS, f.number)) tensor(data, f, out);
    }

    private static void node(byte[] data, Field n, int depth, List<Entry> out) throws Error {
        Reader r = new Reader(data, n.from, n.to);
        for (Field f = r.next(); f != null; f = r.next())
            if (f.wire == 2 && f.number == NODE_ATTRIBUTE) attribute(data, f, depth, out);
    }

    private static void attribute(byte[] data, Field a, int depth, List<Entry> out) throws Error {
        Reader r = new Reader(data, a.from, a.to);
        for (Field f = r.next(); f != null; f = r.next()) {
            if (f.wire != 2) continue;
            if (in(ATTR_TENSORS, f.number)) tensor(data, f, out);
            else if (in(ATTR_GRAPHS, f.number)) graph(data, f, depth + 1, out);
            else if (in(ATTR_SPARSE, f.number)) sparse(data, f, out);
        }
    }

    private static void function(byte[] data, Field fn, int depth, List<Entry> out) throws Error {
        Reader r = new Reader(data, fn.from, fn.to);
        for (Field f = r.next(); f != null; f = r.next()) {
            if (f.wire == 2 && f.number == FUNCTION_NODE) node(data, f, depth, out);
            else if (f.wire == 2 && f.number == FUNCTION_ATTRIBUTE) attribute(data, f, depth, out);
        }
    }

    /**
     * Every tensor of a serialized ModelProto (its graph, subgraphs, node attributes, functions and training
     * graphs) that ONNX Runtime would read from another file. Throws {@link Error} for bytes that are not a
     * readable ModelProto.
     */
    static List<Entry> externalData(byte[] model) throws Error {
        List<Entry> found = new ArrayList<>();
        Reader r = new Reader(model, 0, model.length);
        for (Field f = r.next(); f != null; f = r.next()) {
            if (f.wire != 2) continue;
            if (f.number == MODEL_GRAPH) graph(model, f, 0, found);
            else if (f.number == MODEL_TRAINING) {
                Reader t = new Reader(model, f.from, f.to);
                for (Field g = t.next(); g != null; g = t.next())
                    if (g.wire == 2 && in(TRAINING_GRAPHS, g.number)) graph(model, g, 1, found);
            } else if (f.number == MODEL_FUNCTIONS) function(model, f, 0, found);
        }
        return found;
    }
}
