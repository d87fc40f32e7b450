package ai.dipdeploy.engine;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * The engine opens a bundle as a sandbox, like the Python reader: each hostile manifest edit (a path out of the
 * bundle, an absolute path, a symbolic link, a tensor range outside its file or not matching its shape, a plan
 * with another layer count) is refused by {@link Manifest#open} and by the {@link Engine} constructor before
 * ONNX Runtime or any named file is touched, with one line that names the fix. A small synthetic bundle (one
 * layer) keeps the test independent of the golden vectors; the exported golden bundle is the control.
 */
public class BundleSandboxTest {
    @Rule public TemporaryFolder tmp = new TemporaryFolder();

    private static final int ALIGN = 4096;

    private Path bundle, canary;
    private String tokenizerJson; // the synthetic bundle's tokenizer.json; null: placeholder bytes
    /** Bytes of the synthetic bundle's files by name; any other graph is a ModelProto holding only its name. */
    private final Map<String, byte[]> contents = new LinkedHashMap<>();

    /** One layer, hidden 4, intermediate 8: an up|gate rows tensor in mlp.bin and an embedding in dense.bin. */
    private Map<String, Object> write(Consumer<Map<String, Object>> edit) throws IOException {
        Path root = tmp.newFolder().toPath();
        bundle = Files.createDirectory(root.resolve("bundle"));
        canary = root.resolve("canary.bin");
        Files.write(canary, new byte[2 * ALIGN]);
        Map<String, Object> tensors = new LinkedHashMap<>();
        tensors.put("model.layers.0.mlp.up_gate.rows", tensor("mlp.bin", 0, "float32", 4, 16));
        tensors.put("model.layers.0.mlp.down.rows", tensor("mlp.bin", ALIGN, "float32", 8, 4));
        tensors.put("model.embed_tokens.weight", tensor("dense.bin", 0, "float16", 32, 4));
        Map<String, Object> files = new LinkedHashMap<>();
        List<String> layerGraphs = BundleCheck.layerGraphNames(1);
        List<String> names = new ArrayList<>(layerGraphs);
        names.addAll(Arrays.asList("model.onnx", "genai_config.json", "tokenizer.json"));
        for (String n : names) {
            byte[] b = (n.equals("tokenizer.json") && tokenizerJson != null ? tokenizerJson : n).getBytes(StandardCharsets.UTF_8);
            if (n.endsWith(".onnx")) b = Pb.ld(2, b); // ModelProto.producer_name: a graph with no external data
            if (n.equals("genai_config.json")) b = "{}".getBytes(StandardCharsets.UTF_8);
            files.put(n, file(n, contents.getOrDefault(n, b)));
        }
        files.put("mlp.bin", file("mlp.bin", new byte[2 * ALIGN]));
        files.put("dense.bin", file("dense.bin", new byte[ALIGN]));
        Map<String, Object> raw = new LinkedHashMap<>();
        raw.put("source", map("model", "synthetic", "config", map("num_hidden_layers", 1L, "hidden_size", 4L,
                "intermediate_size", 8L)));
        raw.put("method", "dip");
        raw.put("plan", map("hidden_size", 4L, "intermediate_size", 8L, "layers",
                new ArrayList<>(Arrays.asList(map("k_in", 2L, "k_glu", 4L)))));
        raw.put("quant", null);
        raw.put("ops", map("domain", "ai.dipdeploy", "version", 1L, "native_library", null));
        raw.put("onnxruntime", map("min", "1.29"));
        raw.put("graphs", map("model", "model.onnx", "layers", layerGraphs));
        raw.put("tensors", tensors);
        raw.put("files", files);
        raw.put("alignment", (long) ALIGN);
        raw.put("format", Manifest.FORMAT);
        raw.put("version", (long) Manifest.VERSION);
        edit.accept(raw);
        Files.write(bundle.resolve(Manifest.FILE), toJson(raw).getBytes(StandardCharsets.UTF_8));
        return raw;
    }

    private Map<String, Object> file(String name, byte[] bytes) throws IOException {
        Path p = bundle.resolve(name);
        Files.write(p, bytes);
        return map("size", (long) bytes.length, "sha256", Manifest.sha256(p));
    }

    private static Map<String, Object> tensor(String file, long offset, String dtype, long rows, long cols) {
        long length = rows * cols * BundleCheck.DTYPES.get(dtype);
        return map("file", file, "offset", offset, "length", length, "dtype", dtype,
                "shape", new ArrayList<>(Arrays.asList(rows, cols)));
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> sub(Map<String, Object> raw, String... keys) {
        Map<String, Object> m = raw;
        for (String k : keys) m = (Map<String, Object>) m.get(k);
        return m;
    }

    private static Map<String, Object> map(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int k = 0; k < kv.length; k += 2) m.put((String) kv[k], kv[k + 1]);
        return m;
    }

    private static String toJson(Object o) {
        if (o == null) return "null";
        if (o instanceof String) return "\"" + ((String) o).replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
        if (o instanceof Number || o instanceof Boolean) return String.valueOf(o);
        StringBuilder b = new StringBuilder();
        if (o instanceof Map) {
            for (Map.Entry<?, ?> e : ((Map<?, ?>) o).entrySet())
                b.append(b.length() == 0 ? "" : ",").append(toJson(e.getKey())).append(":").append(toJson(e.getValue()));
            return "{" + b + "}";
        }
        for (Object x : (List<?>) o) b.append(b.length() == 0 ? "" : ",").append(toJson(x));
        return "[" + b + "]";
    }

    private static final String UP = "model.layers.0.mlp.up_gate.rows";

    private void refused(Consumer<Map<String, Object>> edit, String message) throws Exception {
        write(edit);
        openRefused(message);
    }

    /** Both ways of opening the bundle as it is now refuse it with one line naming {@code message} and the fix. */
    private void openRefused(String message) throws Exception {
        for (int way = 0; way < 2; way++) {
            try {
                if (way == 0) Manifest.open(bundle, "small");
                else new Engine(bundle, new Engine.Options());
                fail("accepted: " + message);
            } catch (IllegalArgumentException ex) {
                String msg = ex.getMessage();
                assertTrue(msg, msg.contains(message) && msg.contains("dipdeploy export") && !msg.contains("\n"));
            }
        }
    }

    @Test
    public void theSyntheticBundleIsIntact() throws Exception {
        write(raw -> {});
        assertEquals(new ArrayList<String>(), Manifest.open(bundle, "all").verify(bundle));
    }

    @Test
    public void pathsMustStayInsideTheBundle() throws Exception {
        refused(raw -> sub(raw, "tensors", UP).put("file", "../canary.bin"), "not a plain file name");
        refused(raw -> sub(raw, "tensors", UP).put("file", canary.toString()), "not a plain file name");
        refused(raw -> sub(raw, "graphs").put("model", "/etc/passwd"), "graphs.model");
        refused(raw -> sub(raw, "files").put("../canary.bin", sub(raw, "files").remove("dense.bin")),
                "not a plain file name");
    }

    @Test
    public void symbolicLinksAreRefused() throws Exception {
        write(raw -> {});
        Files.copy(bundle.resolve("mlp.bin"), canary, java.nio.file.StandardCopyOption.REPLACE_EXISTING);
        Files.delete(bundle.resolve("mlp.bin"));
        Files.createSymbolicLink(bundle.resolve("mlp.bin"), canary);
        openRefused("mlp.bin: a symbolic link");
    }

    @Test
    public void rangesMustLieInsideTheFileAndMatchTheShape() throws Exception {
        refused(raw -> sub(raw, "tensors", UP).put("offset", -(long) ALIGN), "non-negative");
        refused(raw -> sub(raw, "tensors", UP).put("offset", 2L * ALIGN), "beyond");
        refused(raw -> sub(raw, "tensors", UP).put("length", 8L), "length 8 != 256");
        refused(raw -> sub(raw, "tensors", UP).put("dtype", "object"), "dtype 'object'");
    }

    /** A tied lm_head reads the int4 embedding's bytes as a declared view: exactly those bytes, or refused. */
    @Test
    public void aViewMustCoverExactlyTheTensorItNames() throws Exception {
        Consumer<Map<String, Object>> view = raw -> {
            Map<String, Object> t = tensor("dense.bin", 0, "float16", 4, 32);
            t.put("view_of", "model.embed_tokens.weight");
            sub(raw, "tensors").put("lm_head.weight", t);
        };
        write(view);
        Manifest.open(bundle, "small");
        refused(view.andThen(raw -> sub(raw, "tensors", "lm_head.weight").put("view_of", UP)), "view_of");
        refused(view.andThen(raw -> sub(raw, "tensors", "lm_head.weight").remove("view_of")), "overlap");
    }

    @Test
    public void thePlanMustMatchTheGraphs() throws Exception {
        refused(raw -> sub(raw, "plan").put("layers", new ArrayList<>()), "num_hidden_layers");
        refused(raw -> sub(raw, "graphs").put("layers", BundleCheck.layerGraphNames(2)), "graphs.layers");
        refused(raw -> sub(raw, "plan").put("hidden_size", 1L), "k_in");
    }

    @Test
    public void smallFilesAreHashedByDefaultDataFilesOnRequest() throws Exception {
        write(raw -> {});
        Files.write(bundle.resolve("mlp.bin"), new byte[2 * ALIGN - 1]);
        Files.write(bundle.resolve("mlp.bin"), new byte[] {1}, java.nio.file.StandardOpenOption.APPEND);
        Manifest.open(bundle, "small");
        assertFalse(Manifest.read(bundle).verify(bundle, "all").isEmpty());
        byte[] g = Files.readAllBytes(bundle.resolve("head.onnx"));
        g[0] ^= 1;
        Files.write(bundle.resolve("head.onnx"), g);
        openRefused("head.onnx: sha256 mismatch");
    }

    /** A WordPiece decoder (a BERT-style file): a tokenizer the engine does not implement. */
    private static final String REFUSED_TOKENIZER = "{\"added_tokens\": [], \"normalizer\": null, \"pre_tokenizer\": null,"
            + " \"post_processor\": null, \"decoder\": {\"type\": \"WordPiece\", \"prefix\": \"##\"}, \"model\":"
            + " {\"type\": \"BPE\", \"dropout\": null, \"vocab\": {\"a\": 0}, \"merges\": []}}";

    @Test
    public void anUnsupportedTokenizerIsRefusedBeforeOnnxRuntime() throws Exception {
        tokenizerJson = REFUSED_TOKENIZER;
        write(raw -> {});
        Manifest.open(bundle, "all"); // the bundle itself is intact
        try {
            new Engine(bundle, new Engine.Options());
            fail("accepted a WordPiece decoder");
        } catch (IllegalArgumentException ex) {
            String msg = ex.getMessage();
            assertTrue(msg, msg.startsWith("tokenizer.json: decoder WordPiece is not supported") && !msg.contains("\n"));
        }
    }

    /** The desktop Cli turns that refusal into one line on stderr and exit status 2 (no stack trace). */
    @Test
    public void theCliRefusesItWithOneLineAndStatus2() throws Exception {
        tokenizerJson = REFUSED_TOKENIZER;
        write(raw -> {});
        Process p = new ProcessBuilder(Paths.get(System.getProperty("java.home"), "bin", "java").toString(), "-cp",
                System.getProperty("java.class.path"), Cli.class.getName(), bundle.toString(), "Hello")
                .redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        String err = new String(p.getErrorStream().readAllBytes(), StandardCharsets.UTF_8).trim();
        assertEquals(err, 2, p.waitFor());
        assertFalse(err, err.contains("\n"));
        assertTrue(err, err.startsWith("error: tokenizer.json: decoder WordPiece is not supported"));
    }

    /** Protobuf wire format, by hand (field numbers: dipdeploy/bundle/graphdata.py). */
    static final class Pb {
        static byte[] cat(byte[]... parts) {
            java.io.ByteArrayOutputStream b = new java.io.ByteArrayOutputStream();
            for (byte[] p : parts) b.writeBytes(p);
            return b.toByteArray();
        }

        static byte[] varint(long v) {
            java.io.ByteArrayOutputStream b = new java.io.ByteArrayOutputStream();
            do {
                int x = (int) (v & 0x7f);
                v >>>= 7;
                b.write(x | (v != 0 ? 0x80 : 0));
            } while (v != 0);
            return b.toByteArray();
        }

        static byte[] ld(int field, byte[] payload) {
            return cat(varint((long) field << 3 | 2), varint(payload.length), payload);
        }

        static byte[] ld(int field, String text) {
            return ld(field, text.getBytes(StandardCharsets.UTF_8));
        }

        /** A ModelProto whose graph has one initializer stored in {@code location} at [offset, offset + length). */
        static byte[] externalModel(String tensor, String location, long offset, long length) {
            byte[] entries = cat(ld(13, cat(ld(1, "location"), ld(2, location))),
                    ld(13, cat(ld(1, "offset"), ld(2, Long.toString(offset)))),
                    ld(13, cat(ld(1, "length"), ld(2, Long.toString(length)))));
            byte[] t = cat(ld(8, tensor), entries, varint(14 << 3), varint(1));
            return ld(7, ld(5, t));
        }
    }

    @Test
    public void graphsMustNameListedDataInsideTheFile() throws Exception {
        contents.put("embed.onnx", Pb.externalModel("w", "dense.bin", 0, ALIGN));
        write(raw -> {});
        Manifest.open(bundle, "all");
        contents.put("embed.onnx", Pb.externalModel("w", "../canary.bin", 0, 16));
        refused(raw -> {}, "embed.onnx: initializer 'w' stores its data in '../canary.bin', '../canary.bin' is not a plain");
        contents.put("embed.onnx", Pb.externalModel("w", "tokenizer.json", 0, 4));
        refused(raw -> {}, "stores its data in 'tokenizer.json', not one of the bundle's data files");
        contents.put("embed.onnx", Pb.externalModel("w", "dense.bin", ALIGN, 1));
        refused(raw -> {}, "bytes [4096, 4097) outside its 4096 bytes");
        contents.put("embed.onnx", Pb.cat(Pb.externalModel("w", "dense.bin", 0, 4), new byte[] {0x0b}));
        refused(raw -> {}, "embed.onnx: not a readable ONNX graph (wire type 3 (field 1) is not one onnx uses)");
    }

    private static final String GENAI = "{\"model\": {\"decoder\": {\"session_options\": {\"custom_ops_library\": %s}}}}";

    @Test
    public void genaiConfigMayNameOnlyTheManifestsLibrary() throws Exception {
        contents.put("genai_config.json", String.format(GENAI, "\"/data/local/tmp/x.so\"").getBytes(StandardCharsets.UTF_8));
        refused(raw -> {}, "genai_config.json: custom_ops_library '/data/local/tmp/x.so' names a library but the "
                + "manifest lists none (ops.native_library); onnxruntime-genai would load it");
        contents.put("genai_config.json", String.format(GENAI, "\"libdipdeploy_ops.so\"").getBytes(StandardCharsets.UTF_8));
        Consumer<Map<String, Object>> lib = raw -> sub(raw, "ops").put("native_library", "libdipdeploy_ops.so");
        refused(lib, "ops.native_library: libdipdeploy_ops.so is not one of the bundle's files");
        contents.put("libdipdeploy_ops.so", new byte[] {0x7f, 'E', 'L', 'F'});
        Consumer<Map<String, Object>> listed = lib.andThen(raw -> {
            try {
                sub(raw, "files").put("libdipdeploy_ops.so", file("libdipdeploy_ops.so", contents.get("libdipdeploy_ops.so")));
            } catch (java.io.IOException ex) {
                throw new java.io.UncheckedIOException(ex);
            }
        });
        write(listed);
        Manifest.open(bundle, "all");
        Files.delete(bundle.resolve("libdipdeploy_ops.so")); // the one listed file a bundle may lack
        Manifest.open(bundle, "all");
        contents.put("genai_config.json", String.format(GENAI, "[\"libdipdeploy_ops.so\"]").getBytes(StandardCharsets.UTF_8));
        refused(listed, "custom_ops_library ['libdipdeploy_ops.so'] is not the bundle's ops.native_library "
                + "'libdipdeploy_ops.so'");
        contents.put("genai_config.json", "{\"model\": ".getBytes(StandardCharsets.UTF_8));
        refused(raw -> {}, "genai_config.json: not readable JSON (JSONDecodeError)");
    }

    /** A bundle file must be a regular file with one link: a hard link may be a file outside the bundle. */
    @Test(timeout = 60_000)
    public void hardLinksAndFifosAreRefused() throws Exception {
        write(raw -> {});
        Files.copy(bundle.resolve("dense.bin"), canary, java.nio.file.StandardCopyOption.REPLACE_EXISTING);
        Files.delete(bundle.resolve("dense.bin"));
        Files.createLink(bundle.resolve("dense.bin"), canary);
        openRefused("dense.bin: 2 hard links to the same bytes (a bundle file must be its own copy; a link may be a "
                + "file outside the bundle)");
        write(raw -> {});
        Path outside = canary.resolveSibling("manifest.json");
        Files.createLink(outside, bundle.resolve(Manifest.FILE));
        openRefused(bundle.resolve(Manifest.FILE) + ": 2 hard links");
        Files.delete(outside);
        write(raw -> {});
        Files.delete(bundle.resolve("tokenizer.json"));
        Process p = new ProcessBuilder("mkfifo", bundle.resolve("tokenizer.json").toString()).start();
        assertEquals(0, p.waitFor());
        openRefused("tokenizer.json: not a regular file (a bundle holds plain files)"); // checked before any open
    }

    /** Each file is read through what was checked: a name swapped after its check is refused, never read. */
    @Test
    public void readsAreBoundToTheirChecks() throws Exception {
        write(raw -> {});
        Path other = canary.resolveSibling("other.bin");
        Files.write(other, new byte[2 * ALIGN]);
        String[] swap = {"link"};
        BundleDir.afterCheck = name -> {
            if (!name.equals("mlp.bin")) return;
            try {
                Path p = bundle.resolve(name);
                if (swap[0].equals("link")) {
                    Files.delete(p);
                    Files.createSymbolicLink(p, other);
                } else Files.move(other, p, java.nio.file.StandardCopyOption.REPLACE_EXISTING);
            } catch (java.io.IOException ex) {
                throw new java.io.UncheckedIOException(ex);
            }
        };
        try {
            openRefused("mlp.bin: a symbolic link (a bundle holds plain files)");
            write(raw -> {});
            swap[0] = "file";
            try {
                Manifest.open(bundle, "none");
                fail("a file swapped in after the check was read");
            } catch (IllegalArgumentException ex) {
                assertTrue(ex.getMessage(), ex.getMessage().contains(
                        "mlp.bin: not the file that was checked (replaced, or a link put in its place)"));
            }
            // bytes changed in place after the check: the hash is over exactly the bytes returned
            write(raw -> {});
            BundleDir.afterCheck = name -> {
                try {
                    if (name.equals("tokenizer.json")) Files.write(bundle.resolve(name), "tokenizer.jsoX".getBytes(
                            StandardCharsets.UTF_8), java.nio.file.StandardOpenOption.TRUNCATE_EXISTING);
                } catch (java.io.IOException ex) {
                    throw new java.io.UncheckedIOException(ex);
                }
            };
            try (BundleDir folder = Manifest.held(bundle)) {
                Manifest.read(folder);
                folder.readBytes("tokenizer.json", true);
                fail("bytes changed after the check were returned");
            } catch (BundleDir.Problem ex) {
                assertEquals("tokenizer.json: sha256 mismatch", ex.problem);
            }
        } finally {
            BundleDir.afterCheck = null;
        }
    }

    /** The engine registers the app's own op library only: one in the bundle's folder, or a link to a bundle file, is refused. */
    @Test
    public void theEngineNeverLoadsABundlesLibrary() throws Exception {
        write(raw -> {});
        Files.write(bundle.resolve("libdipdeploy_ops.so"), new byte[] {0x7f, 'E', 'L', 'F'});
        Path viaLink = Files.createSymbolicLink(canary.resolveSibling("libdipdeploy_ops.so"), bundle.resolve("dense.bin"));
        for (Path given : new Path[] {bundle.resolve("libdipdeploy_ops.so"), viaLink}) {
            Engine.Options opt = new Engine.Options();
            opt.nativeLibraryPath = given.toString();
            try {
                new Engine(bundle, opt);
                fail("loaded " + given);
            } catch (IllegalArgumentException ex) {
                assertTrue(ex.getMessage(), ex.getMessage().contains("the engine never loads code a bundle ships")
                        && !ex.getMessage().contains("\n"));
            }
        }
        try (BundleDir folder = Manifest.held(bundle)) { // the app's own library, outside the bundle, is let through
            Manifest.read(folder);
            Engine.refuseBundleLibrary(folder, Files.write(canary.resolveSibling("libapp.so"), new byte[] {1}));
        }
    }

    @Test
    public void theExportedBundleOpens() throws Exception {
        Map<String, Object> g = Golden.load("bundle.json");
        Path exported = Paths.get((String) g.get("bundle"));
        assertEquals(new ArrayList<String>(), Manifest.open(exported, "all").verify(exported));
    }
}
