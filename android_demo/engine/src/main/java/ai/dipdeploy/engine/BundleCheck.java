package ai.dipdeploy.engine;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The structure checks of {@code dipdeploy.bundle.manifest.verify}, with its problem strings: a bundle is a
 * sandbox, so no path the manifest names may leave the bundle folder or be a symbolic link, no tensor may lie
 * outside its file or disagree with its dtype and shape, and the plan must have the model's layer count and
 * the per-layer graphs that go with it. Run before any file the manifest names is opened.
 */
final class BundleCheck {
    private BundleCheck() {}

    /** Files the readers open by fixed names (Python's {@code READ_BY_NAME}). */
    static final List<String> READ_BY_NAME = Arrays.asList("genai_config.json", "tokenizer.json");
    /** Item sizes of the dtypes a tensor may have (Python's {@code DTYPES}, in its order). */
    static final Map<String, Integer> DTYPES = new LinkedHashMap<>();

    static {
        String[] names = {"float64", "float32", "float16", "int64", "uint64", "int32", "uint32", "int16", "uint16",
                "int8", "uint8", "bool"};
        int[] sizes = {8, 4, 2, 8, 8, 4, 4, 2, 2, 1, 1, 1};
        for (int k = 0; k < names.length; k++) DTYPES.put(names[k], sizes[k]);
    }

    /** How much {@code problems} hashes: nothing, every file except the tensor data files, everything. */
    static final List<String> CHECKSUMS = Arrays.asList("none", "small", "all");

    /** onnxruntime-genai loads a library from this key of {@code genai_config.json} (Python's {@code GENAI_LIBRARY_KEY}). */
    static final String GENAI_LIBRARY_KEY = "custom_ops_library";
    static final String GENAI_CONFIG = "genai_config.json";
    static final long GENAI_CONFIG_MAX = 1L << 20;
    /** Every listed file so named is a graph ONNX Runtime may open: its external data is checked. */
    static final String GRAPH_SUFFIX = ".onnx";
    /** What a graph's external data may name: the weight files export writes. */
    static final String DATA_SUFFIX = ".bin";
    /** The one listed file a bundle may lack is a shared library: the engine never loads the bundle's copy. */
    static final List<String> LIBRARY_SUFFIXES = Arrays.asList(".so", ".dylib", ".dll");

    /** Python's {@code _verify}, in its order; every file read through {@code bundle}. */
    static List<String> problems(Manifest m, BundleDir bundle, String checksums) throws IOException {
        if (!CHECKSUMS.contains(checksums))
            throw new IllegalArgumentException("checksums=" + checksums + ": choose one of " + CHECKSUMS);
        Map<String, Object> files = Json.obj(m.raw.get("files"), "files");
        Set<String> data = new HashSet<>();
        for (Manifest.Tensor t : m.tensors.values()) data.add(t.file);
        Object lib = Json.obj(m.raw.get("ops"), "ops").get("native_library");
        List<String> out = new ArrayList<>(), graphs = new ArrayList<>();
        for (Map.Entry<String, Object> e : files.entrySet()) {
            String name = e.getKey();
            boolean hash = checksums.equals("all") || (checksums.equals("small") && !data.contains(name));
            boolean optional = name.equals(lib) && LIBRARY_SUFFIXES.stream().anyMatch(name::endsWith);
            String p = fileProblem(bundle, name, e.getValue(), hash, optional);
            if (p != null) out.add(p);
            else if (name.endsWith(GRAPH_SUFFIX)) graphs.add(name);
        }
        boolean genaiBad = false;
        for (String p : out) genaiBad |= p.startsWith(GENAI_CONFIG + ":");
        if (files.containsKey(GENAI_CONFIG) && !genaiBad) out.addAll(genaiProblems(bundle, lib));
        out.addAll(pathProblems(m, files));
        for (String g : graphs) {
            try {
                out.addAll(graphDataProblems(g, bundle.readBytes(g, false), files)); // the files check hashed it
            } catch (BundleDir.Problem ex) {
                out.add(ex.problem);
            }
        }
        for (Manifest.Tensor t : m.tensors.values()) out.addAll(tensorProblems(m, files, t));
        out.addAll(overlapProblems(m));
        out.addAll(planProblems(m));
        out.addAll(shapeProblems(m));
        out.addAll(sizesProblems(m, files));
        return out;
    }

    /**
     * Python's {@code graph_data_problems}: every tensor the graph {@code data} stores outside itself must name
     * a plain {@code .bin} file listed in {@code files}, and lie inside it. The engine calls this on the very
     * bytes it hands ONNX Runtime.
     */
    static List<String> graphDataProblems(String name, byte[] data, Map<String, Object> files) {
        List<String> out = new ArrayList<>();
        List<GraphData.Entry> entries;
        try {
            entries = GraphData.externalData(data);
        } catch (GraphData.Error ex) {
            out.add(name + ": not a readable ONNX graph (" + ex.getMessage() + ")");
            return out;
        }
        for (GraphData.Entry e : entries) {
            String where = name + ": initializer " + Manifest.pyStr(e.name) + " stores its data in "
                    + Manifest.pyRepr(e.location);
            if (e.location == null) {
                out.add(name + ": initializer " + Manifest.pyStr(e.name) + " is external but names no file");
                continue;
            }
            String bad = nameProblem(e.location);
            if (bad != null) out.add(where + ", " + bad);
            else if (!files.containsKey(e.location) || !e.location.endsWith(DATA_SUFFIX))
                out.add(where + ", not one of the bundle's data files");
            else {
                Object rec = files.get(e.location);
                Object size = rec instanceof Map ? ((Map<?, ?>) rec).get("size") : null;
                java.math.BigInteger offset = pyInt(e.offset), length = e.length == null
                        ? java.math.BigInteger.ZERO : pyInt(e.length);
                if (offset == null || length == null) {
                    out.add(where + " at offset " + Manifest.pyRepr(e.offset) + ", length " + Manifest.pyRepr(e.length)
                            + ": not byte counts");
                    continue;
                }
                java.math.BigInteger end = offset.add(length);
                if (offset.signum() < 0 || length.signum() < 0
                        || (isCount(size) && end.compareTo(java.math.BigInteger.valueOf((Long) size)) > 0))
                    out.add(where + ", bytes [" + offset + ", " + end + ") outside its " + Manifest.pyRepr(size) + " bytes");
            }
        }
        return out;
    }

    /** Python's {@code int(text)} of a decimal string (surrounding blanks, a sign, '_' between digits), or null. */
    static java.math.BigInteger pyInt(String text) {
        if (text == null) return null;
        String t = text.strip();
        if (!t.matches("[+-]?[0-9]+(_[0-9]+)*")) return null;
        return new java.math.BigInteger(t.replace("_", "").replace("+", ""));
    }

    /**
     * Python's {@code _genai_problems}: onnxruntime-genai loads whatever library {@code custom_ops_library} names
     * (anywhere in {@code genai_config.json}) when it opens the bundle: every such entry must be exactly the
     * manifest's {@code ops.native_library}, the plain file name whose bytes the files check covers.
     */
    static List<String> genaiProblems(BundleDir bundle, Object lib) throws IOException {
        List<String> out = new ArrayList<>();
        Object rec = bundle.files.get(GENAI_CONFIG);
        Object size = rec instanceof Map ? ((Map<?, ?>) rec).get("size") : null;
        if (size instanceof Long && (Long) size > GENAI_CONFIG_MAX) {
            out.add(GENAI_CONFIG + ": larger than " + GENAI_CONFIG_MAX + " bytes");
            return out;
        }
        List<Object> named = new ArrayList<>();
        try {
            walk(Json.parse(Manifest.utf8(bundle.readBytes(GENAI_CONFIG, false), GENAI_CONFIG)), named);
        } catch (BundleDir.Problem ex) {
            out.add(ex.problem);
            return out;
        } catch (IllegalArgumentException ex) {
            boolean text = String.valueOf(ex.getMessage()).startsWith("JSON");
            out.add(GENAI_CONFIG + ": not readable JSON (" + (text ? "JSONDecodeError" : "UnicodeDecodeError") + ")");
            return out;
        } catch (StackOverflowError ex) {
            out.add(GENAI_CONFIG + ": not readable JSON (RecursionError)");
            return out;
        }
        for (Object v : named) {
            if (lib == null)
                out.add(GENAI_CONFIG + ": " + GENAI_LIBRARY_KEY + " " + Manifest.pyRepr(v) + " names a library but the "
                        + "manifest lists none (ops.native_library); onnxruntime-genai would load it");
            else if (!lib.equals(v))
                out.add(GENAI_CONFIG + ": " + GENAI_LIBRARY_KEY + " " + Manifest.pyRepr(v) + " is not the bundle's "
                        + "ops.native_library " + Manifest.pyRepr(lib) + "; onnxruntime-genai would load it");
        }
        return out;
    }

    private static void walk(Object node, List<Object> named) {
        if (node instanceof Map) {
            for (Map.Entry<?, ?> e : ((Map<?, ?>) node).entrySet())
                if (GENAI_LIBRARY_KEY.equals(e.getKey())) named.add(e.getValue());
                else walk(e.getValue(), named);
        } else if (node instanceof List) for (Object x : (List<?>) node) walk(x, named);
    }

    /** {@code sizes} must be byte counts; {@code bytes_<f>} that of {@code <f>.bin}. */
    private static List<String> sizesProblems(Manifest m, Map<String, Object> files) {
        List<String> out = new ArrayList<>();
        Object sizesObj = m.raw.get("sizes");
        if (sizesObj == null) return out;
        for (Map.Entry<String, Object> e : Json.obj(sizesObj, "sizes").entrySet()) {
            String key = e.getKey(), stem = key.startsWith("bytes_") ? key.substring(6) : key;
            Object v = e.getValue(), rec = files.get(stem + ".bin");
            Object size = rec instanceof Map ? ((Map<?, ?>) rec).get("size") : null;
            if (!isCount(v)) out.add("sizes." + key + ": " + Manifest.pyRepr(v) + " is not a byte count");
            else if (isCount(size) && !v.equals(size))
                out.add("sizes." + key + ": " + v + " != the size of " + stem + ".bin, " + size);
        }
        return out;
    }

    static String nameProblem(Object name) {
        if (!(name instanceof String)) return Manifest.pyRepr(name) + " is not a plain file name inside the bundle "
                + "(no directories, '..' or absolute paths)";
        String s = (String) name;
        if (s.isEmpty() || s.equals(".") || s.equals("..") || s.indexOf('/') >= 0 || s.indexOf('\\') >= 0
                || s.indexOf('\0') >= 0)
            return Manifest.pyRepr(s) + " is not a plain file name inside the bundle (no directories, '..' or "
                    + "absolute paths)";
        return null;
    }

    private static boolean isCount(Object v) {
        return v instanceof Long && (Long) v >= 0;
    }

    /** Python's {@code _file_problem}: the open-time checks ({@link BundleDir#open}), the record, the sha256. */
    private static String fileProblem(BundleDir bundle, String name, Object rec, boolean hash, boolean optional)
            throws IOException {
        try (java.nio.channels.SeekableByteChannel ch = bundle.open(name)) {
            if (!(rec instanceof Map) || !isCount(((Map<?, ?>) rec).get("size"))
                    || !(((Map<?, ?>) rec).get("sha256") instanceof String))
                return name + ": no size and sha256 in the manifest";
            if (hash && !sha256(ch).equals(((Map<?, ?>) rec).get("sha256"))) return name + ": sha256 mismatch";
        } catch (BundleDir.Problem ex) {
            return optional && ex.problem.equals(name + ": missing") ? null : ex.problem;
        }
        return null;
    }

    private static String sha256(java.nio.channels.SeekableByteChannel ch) throws IOException {
        java.security.MessageDigest md = BundleDir.digest();
        java.nio.ByteBuffer buf = java.nio.ByteBuffer.allocate(1 << 20);
        while (ch.read(buf) > 0) {
            buf.flip();
            md.update(buf);
            buf.clear();
        }
        return Manifest.hex(md.digest());
    }

    private static List<String> pathProblems(Manifest m, Map<String, Object> files) {
        Map<String, Object> graphs = Json.obj(m.raw.get("graphs"), "graphs");
        List<String> out = new ArrayList<>();
        if (!graphs.containsKey("model")) {
            out.add("graphs.model: missing");
            return out;
        }
        List<String[]> named = new ArrayList<>();
        List<Object> values = new ArrayList<>();
        for (Map.Entry<String, Object> e : graphs.entrySet())
            if (!(e.getValue() instanceof List)) {
                named.add(new String[] {"graphs." + e.getKey()});
                values.add(e.getValue());
            }
        for (Map.Entry<String, Object> e : graphs.entrySet())
            if (e.getValue() instanceof List) {
                List<?> l = (List<?>) e.getValue();
                for (int i = 0; i < l.size(); i++) {
                    named.add(new String[] {"graphs." + e.getKey() + "[" + i + "]"});
                    values.add(l.get(i));
                }
            }
        Map<String, Object> ops = Json.obj(m.raw.get("ops"), "ops");
        if (ops.get("native_library") != null) {
            named.add(new String[] {"ops.native_library"});
            values.add(ops.get("native_library"));
        }
        for (String n : READ_BY_NAME) {
            named.add(new String[] {n});
            values.add(n);
        }
        for (int k = 0; k < named.size(); k++) {
            String where = named.get(k)[0], bad = nameProblem(values.get(k));
            if (bad != null) out.add(where + ": " + bad);
            else if (!files.containsKey(values.get(k)))
                out.add(where + ": " + values.get(k) + " is not one of the bundle's files");
        }
        return out;
    }

    private static List<String> tensorProblems(Manifest m, Map<String, Object> files, Manifest.Tensor t) {
        List<String> out = new ArrayList<>();
        String bad = nameProblem(t.file);
        if (bad != null) {
            out.add("tensor " + t.name + ": file " + bad);
            return out;
        }
        boolean counts = t.offset >= 0 && t.length >= 0;
        for (long s : t.shape) counts &= s >= 0;
        if (!counts) {
            out.add("tensor " + t.name + ": offset, length and shape must be non-negative integers");
            return out;
        }
        if (!DTYPES.containsKey(t.dtype)) {
            out.add("tensor " + t.name + ": dtype " + Manifest.pyRepr(t.dtype) + " is not one of "
                    + String.join(", ", DTYPES.keySet()));
            return out;
        }
        Object rec = files.get(t.file);
        Object size = rec instanceof Map ? ((Map<?, ?>) rec).get("size") : null;
        if (rec == null) out.add("tensor " + t.name + ": file " + t.file + " not in the manifest");
        else if (isCount(size) && (t.offset + t.length > (Long) size || t.offset + t.length < 0))
            out.add("tensor " + t.name + ": bytes [" + t.offset + ", " + (t.offset + t.length) + ") beyond " + size);
        if (t.offset % m.alignment != 0)
            out.add("tensor " + t.name + ": offset " + t.offset + " not aligned to " + m.alignment);
        long want = DTYPES.get(t.dtype);
        for (long s : t.shape) want = Math.multiplyExact(want, s);
        if (t.length != want)
            out.add("tensor " + t.name + ": length " + t.length + " != " + want + " (shape "
                    + Arrays.toString(t.shape) + " of " + t.dtype + ")");
        return out;
    }

    /**
     * Python's {@code _overlap_problems}: export writes every tensor once, so two sharing bytes mean an edit; a
     * declared view ({@code view_of}) must cover exactly the bytes of the tensor it names.
     */
    private static List<String> overlapProblems(Manifest m) {
        List<Manifest.Tensor> spans = new ArrayList<>();
        List<String> out = new ArrayList<>();
        for (Manifest.Tensor t : m.tensors.values()) {
            if (t.file == null || t.offset < 0 || t.length < 0) continue;
            if (t.viewOf != null) {
                Manifest.Tensor src = m.tensors.get(t.viewOf);
                if (src == null || src.viewOf != null || !src.file.equals(t.file) || src.offset != t.offset
                        || src.length != t.length || !src.dtype.equals(t.dtype))
                    out.add("tensor " + t.name + ": view_of '" + t.viewOf + "' is not a tensor with the same file, "
                            + "offset, length and dtype");
            } else if (t.length > 0) spans.add(t);
        }
        spans.sort((a, b) -> {
            int c = a.file.compareTo(b.file);
            if (c != 0) return c;
            if (a.offset != b.offset) return Long.compare(a.offset, b.offset);
            long ea = a.offset + a.length, eb = b.offset + b.length;
            if (ea != eb) return Long.compare(ea, eb);
            return a.name.compareTo(b.name);
        });
        for (int k = 1; k < spans.size(); k++) {
            Manifest.Tensor a = spans.get(k - 1), b = spans.get(k);
            if (a.file.equals(b.file) && b.offset < a.offset + a.length)
                out.add("tensor " + b.name + ": bytes [" + b.offset + ", " + (b.offset + b.length) + ") of " + b.file
                        + " overlap tensor " + a.name);
        }
        return out;
    }

    /** Python's {@code layer_graph_names}: 3 graphs per layer, then embed and head. */
    static List<String> layerGraphNames(int layers) {
        List<String> out = new ArrayList<>();
        for (int i = 0; i < layers; i++) {
            out.add(GraphNames.attnFile(i));
            out.add(GraphNames.mlpUpFile(i));
            out.add(GraphNames.mlpDownFile(i));
        }
        out.addAll(GraphNames.EDGE_GRAPHS);
        return out;
    }

    /** The token table's tensors (Python's {@code EMBEDDING}): {@code .weight} fp32, or {@code .qweight} int4. */
    static final String EMBEDDING = "model.embed_tokens";

    /**
     * Python's {@code _shape_problems}: the plan and the embedding table must have the config's widths, and the
     * table a row for every token of the config's vocabulary, else the bundle runs with the wrong widths or
     * embeds the ids past the table as zero rows.
     */
    private static List<String> shapeProblems(Manifest m) {
        List<String> out = new ArrayList<>();
        Object planObj = m.raw.get("plan");
        Map<?, ?> plan = planObj instanceof Map ? (Map<?, ?>) planObj : new LinkedHashMap<>();
        Map<String, Object> cfg = m.config;
        for (String key : Arrays.asList("hidden_size", "intermediate_size")) {
            Object p = plan.get(key), c = cfg.get(key);
            if (p instanceof Long && c instanceof Long && !p.equals(c))
                out.add("plan." + key + " is " + p + " but source.config." + key + " is " + c);
        }
        Map<?, ?> tensors = (Map<?, ?>) m.raw.get("tensors");
        Object table = tensors.get(EMBEDDING + ".weight");
        if (!(table instanceof Map) || ((Map<?, ?>) table).isEmpty()) table = tensors.get(EMBEDDING + ".qweight");
        Object shape = table instanceof Map ? ((Map<?, ?>) table).get("shape") : null;
        if (!(shape instanceof List) || ((List<?>) shape).size() != 2 || !(((List<?>) shape).get(0) instanceof Long)
                || !(((List<?>) shape).get(1) instanceof Long))
            return out;
        long rows = (Long) ((List<?>) shape).get(0), width = (Long) ((List<?>) shape).get(1);
        Object vocab = cfg.get("vocab_size"), hidden = cfg.get("hidden_size");
        if (vocab instanceof Long && (Long) vocab > rows)
            out.add("source.config.vocab_size " + vocab + " exceeds the embedding table's " + rows + " rows");
        if (tensors.containsKey(EMBEDDING + ".weight") && hidden instanceof Long && width != (Long) hidden)
            out.add("the embedding table's width " + width + " is not source.config.hidden_size " + hidden);
        return out;
    }

    private static List<String> planProblems(Manifest m) {
        List<String> out = new ArrayList<>();
        Object planObj = m.raw.get("plan");
        if (planObj == null) return out;
        Map<String, Object> plan = Json.obj(planObj, "plan");
        int n = m.layers.size();
        Object want = m.config.get("num_hidden_layers");
        if (!(want instanceof Long) || (Long) want != n)
            out.add("plan.layers: " + n + " layers but source.config.num_hidden_layers is " + Manifest.pyRepr(want));
        String[][] keys = {{"k_in", "hidden_size"}, {"k_glu", "intermediate_size"}};
        for (String[] kw : keys) {
            Object top = plan.get(kw[1]);
            boolean ok = true;
            for (Manifest.LayerPlan lp : m.layers) {
                long k = kw[0].equals("k_in") ? lp.kIn : lp.kGlu;
                ok &= top instanceof Long && k > 0 && k <= (Long) top;
            }
            if (!ok)
                out.add("plan.layers: every " + kw[0] + " must be an integer in [1, plan." + kw[1] + " = "
                        + Manifest.pyRepr(top) + "]");
        }
        Object listed = Json.obj(m.raw.get("graphs"), "graphs").get("layers");
        if (listed != null && !layerGraphNames(n).equals(listed)) {
            Object count = listed instanceof List ? (Object) (long) ((List<?>) listed).size() : listed;
            out.add("graphs.layers: " + count + " graphs do not match the plan's " + n + " layers "
                    + "(3 per layer + embed + positions + head = " + (3 * n + GraphNames.EDGE_GRAPHS.size()) + ")");
        }
        return out;
    }
}
