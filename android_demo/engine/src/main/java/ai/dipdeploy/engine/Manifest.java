package ai.dipdeploy.engine;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * {@code manifest.json} of a dipdeploy bundle: the Java mirror of {@code dipdeploy/bundle/manifest.py}.
 *
 * <p>The reader accepts exactly what the Python reader accepts: {@code format == "dipdeploy-bundle"},
 * {@code version == VERSION} (compared like Python's {@code !=}: 3 and 3.0 are equal, true equals 1 only), no field outside
 * the Python dataclass, and every required field present. Errors name the fix
 * ({@code dipdeploy export}).
 */
public final class Manifest {
    public static final String FORMAT = "dipdeploy-bundle";
    public static final int VERSION = 3; // as dipdeploy/bundle/manifest.py's BUNDLE_VERSION
    public static final String FILE = "manifest.json";
    public static final String REGENERATE = "regenerate the bundle with `dipdeploy export`";

    /** Fields of the Python dataclass; the first nine have no default there. */
    static final List<String> REQUIRED = java.util.Arrays.asList("source", "method", "plan", "quant", "ops", "onnxruntime",
            "graphs", "tensors", "files");
    static final List<String> OPTIONAL = java.util.Arrays.asList("dipca", "sizes", "validation", "export_config", "alignment",
            "row_order", "format", "version");

    /** One tensor of the table: bytes [offset, offset+length) of {@code file}. */
    public static final class Tensor {
        public final String name, file, dtype, layout;
        /** The tensor whose bytes these are, read with another shape (a tied lm_head's view of the int4 embedding), or null. */
        public final String viewOf;
        public final long offset, length;
        public final long[] shape;

        Tensor(String name, Map<String, Object> t) {
            String w = "tensors." + name;
            this.name = name;
            this.file = Json.str(t.get("file"), w + ".file");
            this.offset = Json.lng(t.get("offset"), w + ".offset");
            this.length = Json.lng(t.get("length"), w + ".length");
            this.dtype = Json.str(t.get("dtype"), w + ".dtype");
            this.shape = Json.longs(t.get("shape"), w + ".shape");
            Object lay = t.get("layout");
            this.layout = lay == null ? null : Json.str(lay, w + ".layout");
            Object view = t.get("view_of");
            this.viewOf = view == null ? null : Json.str(view, w + ".view_of");
        }

        public int itemSize() {
            return DType.size(dtype);
        }

        /** Bytes of one row (product of shape[1:] × item size); the whole tensor for a 0-d/1-d table row. */
        public long rowBytes() {
            long n = itemSize();
            for (int k = 1; k < shape.length; k++) n *= shape[k];
            return n;
        }
    }

    /** Per-layer K of the sparsity plan. */
    public static final class LayerPlan {
        public final int kIn, kGlu;

        LayerPlan(int kIn, int kGlu) {
            this.kIn = kIn;
            this.kGlu = kGlu;
        }
    }

    public final Map<String, Object> raw;
    public final String method;
    public final int alignment;
    public final Map<String, Tensor> tensors = new LinkedHashMap<>();
    public final Map<String, Object> config;
    public final List<LayerPlan> layers = new ArrayList<>();

    private Manifest(Map<String, Object> raw) {
        this.raw = raw;
        this.method = Json.str(raw.get("method"), "method");
        Object al = raw.get("alignment");
        this.alignment = al == null ? 4096 : Math.toIntExact(Json.lng(al, "alignment"));
        if (alignment < 1)
            throw new IllegalArgumentException("manifest alignment " + alignment + " is not positive; " + REGENERATE);
        Object rowOrder = raw.get("row_order");  // docs/method.md "Flash layout": this engine reads file rows as logical rows
        if (rowOrder != null && !"natural".equals(Json.obj(rowOrder, "row_order").get("order")))
            throw new IllegalArgumentException("the bundle's MLP rows are in a calibrated row order, which this engine "
                    + "does not map; export it with `dipdeploy export --row-order natural`");
        for (Map.Entry<String, Object> e : Json.obj(raw.get("tensors"), "tensors").entrySet())
            tensors.put(e.getKey(), new Tensor(e.getKey(), Json.obj(e.getValue(), "tensors." + e.getKey())));
        Map<String, Object> src = Json.obj(raw.get("source"), "source");
        this.config = Json.obj(src.get("config"), "source.config");
        Object plan = raw.get("plan");
        if (plan != null) {
            for (Object l : Json.arr(Json.obj(plan, "plan").get("layers"), "plan.layers")) {
                Map<String, Object> m = Json.obj(l, "plan.layers[]");
                layers.add(new LayerPlan(Math.toIntExact(Json.lng(m.get("k_in"), "k_in")),
                        Math.toIntExact(Json.lng(m.get("k_glu"), "k_glu"))));
            }
        }
    }

    /** Parses and checks the manifest text like {@code Manifest.from_json}. */
    public static Manifest fromJson(String text) {
        Map<String, Object> raw = Json.obj(Json.parse(text), "manifest.json");
        Object fmt = raw.get("format");
        if (!FORMAT.equals(fmt))
            throw new IllegalArgumentException("not a dipdeploy bundle manifest (format " + pyRepr(fmt) + "); "
                    + REGENERATE);
        Object ver = raw.get("version");
        if (!pyEqualsInt(ver, VERSION))
            throw new IllegalArgumentException("bundle version " + pyRepr(ver) + " is not supported (this engine "
                    + "reads " + VERSION + "); " + REGENERATE);
        Set<String> unknown = new TreeSet<>(raw.keySet());
        unknown.removeAll(REQUIRED);
        unknown.removeAll(OPTIONAL);
        if (!unknown.isEmpty())
            throw new IllegalArgumentException("manifest has unknown fields " + unknown + "; " + REGENERATE);
        for (String k : REQUIRED)
            if (!raw.containsKey(k))
                throw new IllegalArgumentException("manifest lacks the field '" + k + "'; " + REGENERATE);
        return new Manifest(raw);
    }

    /** The cap on a manifest's size, checked before it is parsed (Python's {@code MANIFEST_MAX}). */
    static final long MANIFEST_MAX = 16L << 20;

    public static Manifest read(Path bundle) throws IOException {
        try (BundleDir folder = held(bundle)) {
            return read(folder);
        }
    }

    /** The bundle folder, or one line naming the folder to give when it is missing. */
    static BundleDir held(Path bundle) throws IOException {
        if (!Files.isDirectory(bundle))
            throw new IOException("bundle " + bundle + " not found: give the folder `dipdeploy export` wrote "
                    + "(its manifest.json beside the graphs)");
        return new BundleDir(bundle);
    }

    /** The manifest of the held folder (Python's {@code _parse}): checked like any bundle file, then read. */
    static Manifest read(BundleDir folder) throws IOException {
        Path p = folder.path.resolve(FILE);
        byte[] raw;
        try {
            raw = folder.readBytes(FILE, MANIFEST_MAX, false);
        } catch (BundleDir.Problem ex) {
            if (ex.problem.equals(FILE + ": missing"))
                throw new IOException(p + " not found: " + folder.path + " is not a dipdeploy bundle; " + REGENERATE);
            if (ex.problem.startsWith(FILE + ": over "))
                throw new IllegalArgumentException(p + " is over the " + (MANIFEST_MAX >> 20) + " MiB cap on a manifest "
                        + "(export writes a few hundred kB at most); " + REGENERATE);
            String why = ex.problem.startsWith(FILE + ": ") ? ex.problem.substring(FILE.length() + 2) : ex.problem;
            throw new IllegalArgumentException(p + ": " + why + "; " + REGENERATE);
        }
        Manifest m = fromJson(utf8(raw, p.toString()));
        folder.files = Json.obj(m.raw.get("files"), "files");
        return m;
    }

    /** Strict UTF-8 (Python's {@code bytes.decode}): a manifest that is not text is refused, not repaired. */
    static String utf8(byte[] raw, String what) {
        try {
            return StandardCharsets.UTF_8.newDecoder().onMalformedInput(java.nio.charset.CodingErrorAction.REPORT)
                    .onUnmappableCharacter(java.nio.charset.CodingErrorAction.REPORT)
                    .decode(java.nio.ByteBuffer.wrap(raw)).toString();
        } catch (java.nio.charset.CharacterCodingException ex) {
            throw new IllegalArgumentException(what + " is not UTF-8 text; " + REGENERATE);
        }
    }

    /** Python's {@code value != 1} is false for 1, 1.0 and True. */
    static boolean pyEqualsInt(Object v, long want) {
        if (v instanceof Long) return (Long) v == want;
        if (v instanceof Double) return (Double) v == (double) want;
        if (v instanceof Boolean) return ((Boolean) v ? 1 : 0) == want;
        return false;
    }

    /** Python's {@code repr} of a JSON value, as the Python reader's messages print it. */
    static String pyRepr(Object v) {
        if (v == null) return "None";
        if (v instanceof String) return pyStr((String) v);
        if (v instanceof Boolean) return (Boolean) v ? "True" : "False";
        if (v instanceof Double) return pyFloat((Double) v);
        StringBuilder b = new StringBuilder();
        if (v instanceof Map) {
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet())
                b.append(b.length() == 0 ? "" : ", ").append(pyRepr(e.getKey())).append(": ").append(pyRepr(e.getValue()));
            return "{" + b + "}";
        }
        if (v instanceof List) {
            for (Object x : (List<?>) v) b.append(b.length() == 0 ? "" : ", ").append(pyRepr(x));
            return "[" + b + "]";
        }
        return String.valueOf(v);
    }

    /** {@code repr(str)}: single quotes unless the text holds one and no double quote; control characters escaped. */
    static String pyStr(String s) {
        char q = s.indexOf('\'') >= 0 && s.indexOf('"') < 0 ? '"' : '\'';
        StringBuilder b = new StringBuilder().append(q);
        for (int k = 0; k < s.length(); k++) {
            char c = s.charAt(k);
            if (c == q || c == '\\') b.append('\\').append(c);
            else if (c == '\n') b.append("\\n");
            else if (c == '\r') b.append("\\r");
            else if (c == '\t') b.append("\\t");
            else if (c < 0x20 || (c >= 0x7f && c < 0xa0)) b.append(String.format("\\x%02x", (int) c));
            else b.append(c);
        }
        return b.append(q).toString();
    }

    private static String pyFloat(double d) {
        if (Double.isNaN(d)) return "nan";
        if (Double.isInfinite(d)) return d > 0 ? "inf" : "-inf";
        if (d == Math.rint(d) && Math.abs(d) < 1e16) return String.format(java.util.Locale.ROOT, "%.1f", d);
        if (Math.abs(d) >= 1e-4 && Math.abs(d) < 1e16) return new java.math.BigDecimal(Double.toString(d)).toPlainString();
        String[] me = String.format("%s", Double.toString(d)).split("E");
        int exp = Integer.parseInt(me[1]);
        String m = me[0].endsWith(".0") ? me[0].substring(0, me[0].length() - 2) : me[0];
        return m + "e" + (exp < 0 ? "-" : "+") + String.format("%02d", Math.abs(exp));
    }

    // ---- convenience views ----

    public int configInt(String key) {
        return Math.toIntExact(Json.lng(config.get(key), "source.config." + key));
    }

    public int configIntOr(String key, int fallback) {
        Object v = config.get(key);
        return v == null ? fallback : Math.toIntExact(Json.lng(v, "source.config." + key));
    }

    public int hiddenSize() { return configInt("hidden_size"); }
    public int intermediateSize() { return configInt("intermediate_size"); }
    public int numLayers() { return configInt("num_hidden_layers"); }
    public int vocabSize() { return configInt("vocab_size"); }

    public int numKvHeads() {
        Object v = config.get("num_key_value_heads");
        return v == null ? configInt("num_attention_heads") : Math.toIntExact(Json.lng(v, "num_key_value_heads"));
    }

    public int headDim() {
        Object v = config.get("head_dim");
        return v == null ? hiddenSize() / configInt("num_attention_heads") : Math.toIntExact(Json.lng(v, "head_dim"));
    }

    /** End-of-sequence ids (an int or a list in HF configs). */
    public long[] eosTokenIds() {
        Object v = config.get("eos_token_id");
        if (v == null) return new long[0];
        if (v instanceof List) return Json.longs(v, "eos_token_id");
        return new long[] {Json.lng(v, "eos_token_id")};
    }

    public Map<String, Object> section(String key) {
        Object v = raw.get(key);
        return v == null ? null : Json.obj(v, key);
    }

    /** DIP-CA settings the host applies: γ, policy, cache_frac, fixed_top_n, gamma_warmup (null for dip/dense). */
    public Map<String, Object> dipca() { return section("dipca"); }

    public String nativeLibrary() {
        Map<String, Object> ops = section("ops");
        Object v = ops == null ? null : ops.get("native_library");
        return v == null ? null : Json.str(v, "ops.native_library");
    }

    public List<String> layerGraphs() {
        Object v = Json.obj(raw.get("graphs"), "graphs").get("layers");
        List<String> out = new ArrayList<>();
        if (v != null) for (Object o : Json.arr(v, "graphs.layers")) out.add(Json.str(o, "graphs.layers[]"));
        return out;
    }

    /**
     * The arrays of one MLP group ({@code "up_gate"} or {@code "down"}) of layer {@code i}, in manifest order:
     * tensors named {@code model.layers.{i}.mlp.{group}.<array>}.
     */
    public List<Tensor> groupArrays(int layer, String group) {
        String prefix = "model.layers." + layer + ".mlp." + group + ".";
        List<Tensor> out = new ArrayList<>();
        for (Tensor t : tensors.values())
            if (t.name.startsWith(prefix) && t.name.indexOf('.', prefix.length()) < 0) out.add(t);
        if (out.isEmpty())
            throw new IllegalArgumentException("bundle has no tensors " + prefix + "*; " + REGENERATE);
        return out;
    }

    /** Problems found (empty = intact), the same strings as {@code manifest.verify} in Python (every checksum). */
    public List<String> verify(Path bundle) throws IOException {
        return verify(bundle, "all");
    }

    /** {@link BundleCheck}: structure always; {@code checksums} "none", "small" (not the tensor data files) or "all". */
    public List<String> verify(Path bundle, String checksums) throws IOException {
        try (BundleDir folder = held(bundle)) {
            return verify(folder, checksums);
        }
    }

    /** {@link #verify(Path, String)} with every file read through {@code folder}. */
    List<String> verify(BundleDir folder, String checksums) throws IOException {
        folder.files = Json.obj(raw.get("files"), "files");
        return BundleCheck.problems(this, folder, checksums);
    }

    /**
     * The manifest of {@code bundle} after the structure checks (Python's {@code read_manifest}): what the engine
     * opens a bundle with, so no file is opened on the manifest's word before its paths and ranges are checked.
     * Problems raise one line naming the first of them and the fix.
     */
    public static Manifest open(Path bundle, String checksums) throws IOException {
        try (BundleDir folder = held(bundle)) {
            return open(folder, checksums);
        }
    }

    /** {@link #open(Path, String)} on a held folder, which the caller goes on reading the bundle through. */
    static Manifest open(BundleDir folder, String checksums) throws IOException {
        Manifest m = read(folder);
        List<String> problems = m.verify(folder, checksums);
        if (!problems.isEmpty()) {
            String more = problems.size() > 5 ? " (and " + (problems.size() - 5) + " more)" : "";
            throw new IllegalArgumentException("bundle " + folder.path + " is damaged: "
                    + String.join("; ", problems.subList(0, Math.min(5, problems.size()))) + more
                    + "; files truncated or altered since export; " + REGENERATE);
        }
        return m;
    }

    /** The sha256 of the file at {@code p} (what a test writes into a manifest it builds). */
    static String sha256(Path p) throws IOException {
        MessageDigest md = BundleDir.digest();
        byte[] buf = new byte[1 << 20];
        try (InputStream in = Files.newInputStream(p, java.nio.file.LinkOption.NOFOLLOW_LINKS)) {
            int n;
            while ((n = in.read(buf)) > 0) md.update(buf, 0, n);
        }
        return hex(md.digest());
    }

    static String hex(byte[] digest) {
        StringBuilder b = new StringBuilder();
        for (byte x : digest) b.append(String.format("%02x", x & 0xff));
        return b.toString();
    }

    /** Item sizes of the dtypes a bundle uses (numpy names). */
    public static final class DType {
        private DType() {}

        public static int size(String dtype) {
            switch (dtype) {
                case "float32": case "int32": case "uint32": return 4;
                case "float16": case "bfloat16": case "int16": case "uint16": return 2;
                case "uint8": case "int8": case "bool": return 1;
                case "float64": case "int64": case "uint64": return 8;
                default: throw new IllegalArgumentException("dtype " + dtype + " unknown; " + REGENERATE);
            }
        }
    }

    @Override
    public String toString() {
        return "Manifest(" + method + ", " + numLayers() + " layers, " + tensors.size() + " tensors, set "
                + new LinkedHashSet<>(Arrays.asList(raw.keySet().toArray())) + ")";
    }
}
