package ai.dipdeploy.engine;

import ai.onnxruntime.OnnxJavaType;
import ai.onnxruntime.OnnxTensor;
import ai.onnxruntime.OnnxValue;
import ai.onnxruntime.OrtEnvironment;
import ai.onnxruntime.OrtException;
import ai.onnxruntime.OrtSession;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.LongBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The DIP-CA decoder over a bundle's per-layer graphs with the ONNX Runtime Java API (the Android AAR's
 * {@code ai.onnxruntime}), one sequence, token by token — the protocol of the Python host runtime:
 *
 * <pre>
 *   embed.onnx: input_ids → hidden
 *   positions.onnx: attention_mask, position_ids → the RoPE rows and mask bias every attention graph takes
 *   per layer i:
 *     layer.i.attn.onnx (hidden, mlp_out of layer i−1, the positions' values, cache_in = up|gate residency)
 *                                                                 → hidden_attn, x, in_indices, present kv
 *     up|gate group: RowCache.access, SlotTable.assign, Flash reads of the misses into the slab
 *     layer.i.mlp_up.onnx (x, in_indices, in_slots, slab, cache_glu = down residency) → glu, glu_indices
 *     down group: the same                                        → glu_slots
 *     layer.i.mlp_down.onnx (glu, glu_indices, glu_slots, slab, hidden_attn) → mlp_out
 *     SlotTable.finish for both groups (DRAM moves out of staging)
 *   head.onnx: hidden (the last hidden_attn), mlp_out → logits
 * </pre>
 *
 * The prompt is prefilled token by token as well (DIP-CA's mask at token t depends on the cache after t−1),
 * encoded without post-processor tokens; {@link #reset} starts a sequence with an empty KV cache and fresh
 * row caches; a plan's γ warm-up is not applied — all as in the Python runtime ({@code dipdeploy run}).
 * The slabs, residency and slot buffers are direct buffers wrapped once as OnnxTensors (zero copy): the
 * engine rewrites their contents and re-runs. The native custom-op library is registered when a path is
 * given and loads; otherwise stock ORT inlines the graphs' fallback functions (same results, slower).
 *
 * <p>Only compiled here (javac against the AAR's classes.jar); it has not been run: the AAR's native
 * libraries are bionic (Android) builds. Its pure parts ({@link MlpGroup}, {@link RowCache},
 * {@link SlotTable}, {@link FlashStore}, {@link Bpe}, {@link Sampler}, {@link Manifest}) are unit-tested
 * on the JVM against golden vectors written by the Python code.
 */
public final class Engine implements AutoCloseable {
    /** Run-time choices; defaults come from the manifest's {@code dipca} section. */
    public static final class Options {
        public String policy;            // null: the manifest's (Defaults.POLICY when absent), else lru/lfu/none
        public double cacheFrac = -1;    // < 0: the manifest's cache_frac (Defaults.CACHE_FRAC when absent)
        public String cacheSplit = Defaults.CACHE_SPLIT; // how those bytes are shared by the groups: reads | even
        public int threads = Defaults.THREADS;  // 0: ORT's default, the physical cores
        public String nativeLibraryPath; // e.g. context.getApplicationInfo().nativeLibraryDir + "/libdipdeploy_ops.so"
        public int maxContext = Defaults.CONTEXT; // KV-cache tokens, at most the bundle's positions
    }

    /** Receives streamed text and live stats. */
    public interface Listener {
        void onText(String delta);

        default void onStats(Stats stats) {}
    }

    public final Path bundle;
    public final Manifest manifest;
    public final Bpe tokenizer;
    public final boolean nativeOps;
    public final String nativeError;
    private final OrtEnvironment env;
    private final OrtSession embed, positions, head;
    private final OrtSession[] attn, up, down;
    /** Per layer, the positions.onnx outputs its attention graph takes. */
    private final List<String>[] perToken;
    private final MlpGroup[] upGroups, downGroups;
    private final Map<String, OnnxTensor>[] upSlabs, downSlabs;
    private final FlashStore flash;
    private final int layers, d, f, kvHeads, headDim;
    private final ByteBuffer cacheIn, cacheGlu;
    private final OnnxTensor cacheInT, cacheGluT;
    private final OnnxTensor[] pastK, pastV;
    private final OrtSession.Result[] kvOwner;
    /** The plan's γ warm-up (tokens), recorded but not applied: γ holds from the first token, as in the Python runtime. */
    public final int gammaWarmup;
    private final long denseBytes;
    private final int maxContext;
    private int position;
    public final Stats stats = new Stats();

    @SuppressWarnings("unchecked")
    public Engine(Path bundle, Options opt) throws IOException, OrtException {
        this.bundle = bundle;
        // every bundle file is read through one folder, checked before it is opened (BundleDir)
        try (BundleDir files = Manifest.held(bundle)) {
            this.manifest = Manifest.open(files, "small");
            if (opt.nativeLibraryPath != null) refuseBundleLibrary(files, Paths.get(opt.nativeLibraryPath));
            this.tokenizer = Bpe.fromBytes(read(files, "tokenizer.json"));
            this.layers = manifest.numLayers();
            this.d = manifest.hiddenSize();
            this.f = manifest.intermediateSize();
            this.kvHeads = manifest.numKvHeads();
            this.headDim = manifest.headDim();
            if (manifest.layers.size() != layers || !manifest.layerGraphs().contains(GraphNames.attnFile(0)))
                throw new IllegalArgumentException(bundle + " has no per-layer graphs (a dense or --no-per-layer export); "
                        + "export it with `dipdeploy export --method dip-ca` (per-layer graphs are the default)");
            if (!manifest.layerGraphs().contains(GraphNames.POSITIONS))
                throw new IllegalArgumentException(bundle + " has per-layer graphs without " + GraphNames.POSITIONS
                        + " (an older export); " + Manifest.REGENERATE);
            Map<String, Object> ca = manifest.dipca();
            String policy = opt.policy != null ? opt.policy
                    : ca != null && ca.get("policy") != null ? (String) ca.get("policy") : Defaults.POLICY;
            if (RowCache.Policy.of(policy).offline())
                throw new IllegalArgumentException("policy " + policy + " needs offline data (a trace / pinned rows); "
                        + "the app runs lru, lfu or none");
            double frac = opt.cacheFrac >= 0 ? opt.cacheFrac
                    : ca != null && ca.get("cache_frac") != null ? Json.dbl(ca.get("cache_frac"), "cache_frac") : Defaults.CACHE_FRAC;
            // like the Python runtime: a plan's γ warm-up is not applied (γ from the first token)
            this.gammaWarmup = ca != null && ca.get("gamma_warmup") != null
                    ? Math.toIntExact(Json.lng(ca.get("gamma_warmup"), "gamma_warmup")) : 0;

            env = OrtEnvironment.getEnvironment();
            OrtSession.SessionOptions so = new OrtSession.SessionOptions();
            so.setIntraOpNumThreads(opt.threads);
            boolean nat = false;
            String err = null;
            if (opt.nativeLibraryPath != null && Files.isRegularFile(Paths.get(opt.nativeLibraryPath))) {
                try {
                    so.registerCustomOpLibrary(opt.nativeLibraryPath);
                    nat = true;
                } catch (OrtException e) {
                    err = e.getMessage();
                    so.close();
                    so = new OrtSession.SessionOptions();
                    so.setIntraOpNumThreads(opt.threads);
                }
            }
            this.nativeOps = nat;
            this.nativeError = err;
            // ORT opens the graphs' external data by name, in the bundle folder (Java cannot hand it the held one)
            so.addConfigEntry(EXTERNAL_FOLDER, bundle.toAbsolutePath().toString());
            embed = open(so, files, GraphNames.EMBED);
            positions = open(so, files, GraphNames.POSITIONS);
            check(positions, GraphNames.positionsInputs(), GraphNames.POSITIONS);
            head = open(so, files, GraphNames.HEAD);
            check(head, GraphNames.headInputs(), GraphNames.HEAD);
            attn = new OrtSession[layers];
            up = new OrtSession[layers];
            down = new OrtSession[layers];
            perToken = (List<String>[]) new List<?>[layers];
            upGroups = new MlpGroup[layers];
            downGroups = new MlpGroup[layers];
            upSlabs = (Map<String, OnnxTensor>[]) new Map<?, ?>[layers];
            downSlabs = (Map<String, OnnxTensor>[]) new Map<?, ?>[layers];
            flash = new FlashStore(bundle.resolve("mlp.bin"), files.openChannel("mlp.bin"));
            int[][] capacity = CacheSplit.forManifest(manifest, frac, policy, opt.cacheSplit);
            for (int i = 0; i < layers; i++) {
                Manifest.LayerPlan lp = manifest.layers.get(i);
                upGroups[i] = new MlpGroup(manifest, i, "up_gate", lp.kIn, policy, capacity[i][0], flash, null, null);
                downGroups[i] = new MlpGroup(manifest, i, "down", lp.kGlu, policy, capacity[i][1], flash, null, null);
                upSlabs[i] = slabTensors(upGroups[i]);
                downSlabs[i] = slabTensors(downGroups[i]);
                attn[i] = open(so, files, GraphNames.attnFile(i));
                up[i] = open(so, files, GraphNames.mlpUpFile(i));
                down[i] = open(so, files, GraphNames.mlpDownFile(i));
                perToken[i] = new ArrayList<>(positions.getOutputNames());
                perToken[i].retainAll(attn[i].getInputNames());
                check(attn[i], GraphNames.attnInputs(i, perToken[i]), GraphNames.attnFile(i));
                check(up[i], GraphNames.mlpUpInputs(new ArrayList<>(upSlabs[i].keySet())), GraphNames.mlpUpFile(i));
                check(down[i], GraphNames.mlpDownInputs(new ArrayList<>(downSlabs[i].keySet())), GraphNames.mlpDownFile(i));
            }
            cacheIn = ByteBuffer.allocateDirect(d);
            cacheGlu = ByteBuffer.allocateDirect(f);
            cacheInT = OnnxTensor.createTensor(env, cacheIn, new long[] {d}, OnnxJavaType.BOOL);
            cacheGluT = OnnxTensor.createTensor(env, cacheGlu, new long[] {f}, OnnxJavaType.BOOL);
            pastK = new OnnxTensor[layers];
            pastV = new OnnxTensor[layers];
            kvOwner = new OrtSession.Result[layers];
            Object db = Json.obj(manifest.raw.get("files"), "files").get("dense.bin");
            Object dense = db instanceof Map ? ((Map<?, ?>) db).get("size") : null;
            denseBytes = dense instanceof Long ? (Long) dense : 0;
            maxContext = Math.min(opt.maxContext, manifest.configIntOr("max_position_embeddings", Integer.MAX_VALUE));
        }
        reset();
    }

    /** ORT's session option naming the folder a graph given as bytes finds its external data in. */
    static final String EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path";

    /** The checked bytes of a listed file, or the one line naming its problem. */
    private static byte[] read(BundleDir files, String name) throws IOException {
        try {
            return files.readBytes(name, true);
        } catch (BundleDir.Problem ex) {
            throw files.error(ex.problem);
        }
    }

    /**
     * An ORT session for the graph {@code file}, built from the bytes the manifest's sha256 vouches for (never by
     * path), after its external-data locations are checked on those bytes and on the files they name; after
     * ORT opened those files by name, each must still be the file checked (docs/decisions/0008-bundle-reads.md).
     */
    private OrtSession open(OrtSession.SessionOptions so, BundleDir files, String file) throws OrtException, IOException {
        byte[] data = read(files, file);
        List<String> problems = BundleCheck.graphDataProblems(file, data, files.files);
        if (!problems.isEmpty()) throw files.error(problems.get(0));
        List<String> locations = externalLocations(data);
        for (String location : locations) { // checked on a channel: what ORT must find under that name
            try {
                files.open(location).close();
            } catch (BundleDir.Problem ex) {
                throw files.error(ex.problem);
            }
        }
        OrtSession s;
        try {
            s = env.createSession(data, so);
        } catch (OrtException | RuntimeException ex) {
            refuseChanged(files, file, locations);
            throw ex;
        }
        try {
            refuseChanged(files, file, locations);
        } catch (IllegalArgumentException ex) {
            s.close();
            throw ex;
        }
        return s;
    }

    static List<String> externalLocations(byte[] graph) {
        java.util.TreeSet<String> out = new java.util.TreeSet<>();
        try {
            for (GraphData.Entry e : GraphData.externalData(graph)) if (e.location != null) out.add(e.location);
        } catch (GraphData.Error ex) {
            throw new IllegalStateException(ex); // graphDataProblems parsed these bytes already
        }
        return new ArrayList<>(out);
    }

    private static void refuseChanged(BundleDir files, String graph, List<String> locations) {
        List<String> changed = files.unchanged(locations);
        if (!changed.isEmpty())
            throw files.error(changed.get(0) + ": not the file that was checked when onnxruntime opened it for " + graph
                    + " (replaced, or a link put in its place)");
    }

    /**
     * The engine registers only the app's own op library, never one a bundle ships (code that came with the
     * data): a library in the bundle's folder, or the same file as one the bundle lists, is refused.
     */
    static void refuseBundleLibrary(BundleDir files, Path lib) throws IOException {
        boolean inBundle = false;
        Path dir = lib.toAbsolutePath().getParent();
        if (dir != null && Files.isDirectory(dir)) inBundle = Files.isSameFile(dir, files.path);
        if (!inBundle && Files.exists(lib))
            for (String name : files.files.keySet()) {
                Path p = files.path.resolve(name);
                if (BundleCheck.nameProblem(name) == null && Files.exists(p, java.nio.file.LinkOption.NOFOLLOW_LINKS)
                        && Files.isSameFile(lib, p)) inBundle = true;
            }
        if (inBundle)
            throw new IllegalArgumentException("the op library " + lib + " is a file of the bundle " + files.path
                    + ": the engine never loads code a bundle ships; give the app's own library (its nativeLibraryDir) "
                    + "or none");
    }

    private static void check(OrtSession s, List<String> want, String file) {
        if (!s.getInputNames().containsAll(want) || s.getInputNames().size() != want.size())
            throw new IllegalArgumentException(file + ": inputs " + s.getInputNames() + ", the engine binds " + want
                    + "; " + Manifest.REGENERATE);
    }

    private Map<String, OnnxTensor> slabTensors(MlpGroup g) throws OrtException {
        Map<String, OnnxTensor> m = new java.util.LinkedHashMap<>();
        for (int a = 0; a < g.rowTensors.size(); a++) {
            Manifest.Tensor t = g.rowTensors.get(a);
            m.put(MlpGroup.inputName(g.group, t), OnnxTensor.createTensor(env, g.slabs.get(a), g.slabShape(a), type(t.dtype)));
        }
        for (int a = 0; a < g.sharedTensors.size(); a++) {
            Manifest.Tensor t = g.sharedTensors.get(a);
            m.put(MlpGroup.inputName(g.group, t), OnnxTensor.createTensor(env, g.shared.get(a), t.shape, type(t.dtype)));
        }
        return m;
    }

    static OnnxJavaType type(String dtype) {
        switch (dtype) {
            case "float32": return OnnxJavaType.FLOAT;
            case "float16": return OnnxJavaType.FLOAT16;
            case "uint8": return OnnxJavaType.UINT8;
            case "int8": return OnnxJavaType.INT8;
            case "int32": return OnnxJavaType.INT32;
            case "int64": return OnnxJavaType.INT64;
            case "bool": return OnnxJavaType.BOOL;
            default: throw new IllegalArgumentException("dtype " + dtype + " has no ORT Java type here");
        }
    }

    /** A new sequence: empty KV cache and fresh row caches (as the Python runtime's {@code reset}). */
    public void reset() throws OrtException, IOException {
        for (int i = 0; i < layers; i++) {
            upGroups[i].reset();
            downGroups[i].reset();
        }
        for (int i = 0; i < layers; i++) {
            if (kvOwner[i] != null) kvOwner[i].close();
            else {
                if (pastK[i] != null) pastK[i].close();
                if (pastV[i] != null) pastV[i].close();
            }
            kvOwner[i] = null;
            long[] shape = {1, kvHeads, 0, headDim};
            pastK[i] = OnnxTensor.createTensor(env, emptyFloats(), shape);
            pastV[i] = OnnxTensor.createTensor(env, emptyFloats(), shape);
        }
        position = 0;
    }

    /** A direct float buffer with no elements but a real address (the first token's empty past KV). */
    private static FloatBuffer emptyFloats() {
        ByteBuffer b = ByteBuffer.allocateDirect(16).order(ByteOrder.nativeOrder());
        b.limit(0);
        return b.asFloatBuffer();
    }

    private static OnnxTensor longs(OrtEnvironment env, long[] v, long[] shape) throws OrtException {
        LongBuffer b = ByteBuffer.allocateDirect(v.length * 8).order(ByteOrder.nativeOrder()).asLongBuffer();
        b.put(v).flip();
        return OnnxTensor.createTensor(env, b, shape);
    }

    private static long[] row(OnnxValue v) {
        LongBuffer b = ((OnnxTensor) v).getLongBuffer();
        long[] out = new long[b.remaining()];
        b.get(out);
        return out;
    }

    private static OnnxValue out(OrtSession.Result r, String name) {
        return r.get(name).orElseThrow(() -> new IllegalStateException("graph output " + name + " missing"));
    }

    /** Runs one token at the next position; returns its logits [vocab]. */
    public float[] step(long tokenId) throws OrtException, IOException {
        long t0 = System.nanoTime();
        long flashBefore = flash.bytes;
        List<AutoCloseable> trash = new ArrayList<>();
        try {
            OnnxTensor ids = longs(env, new long[] {tokenId}, new long[] {1, 1});
            trash.add(ids);
            long[] ones = new long[position + 1];
            java.util.Arrays.fill(ones, 1);
            OnnxTensor mask = longs(env, ones, new long[] {1, position + 1});
            OnnxTensor pos = longs(env, new long[] {position}, new long[] {1, 1});
            trash.add(mask);
            trash.add(pos);
            OrtSession.Result er = embed.run(java.util.Collections.singletonMap("input_ids", ids));
            trash.add(er);
            Map<String, OnnxTensor> p = new HashMap<>();
            p.put("attention_mask", mask);
            p.put("position_ids", pos);
            OrtSession.Result pr = positions.run(p); // the mask and RoPE rows, once for every layer
            trash.add(pr);
            OnnxValue hidden = out(er, "hidden"), mlpOut = null;
            for (int i = 0; i < layers; i++) {
                MlpGroup ug = upGroups[i], dg = downGroups[i];
                ug.residencyInto(cacheIn);
                Map<String, OnnxTensor> in = new HashMap<>();
                in.put("hidden", (OnnxTensor) hidden);
                if (mlpOut != null) in.put("mlp_out", (OnnxTensor) mlpOut);
                for (String name : perToken[i]) in.put(name, (OnnxTensor) out(pr, name));
                in.put(GraphNames.pastKey(i), pastK[i]);
                in.put(GraphNames.pastValue(i), pastV[i]);
                in.put("cache_in", cacheInT);
                OrtSession.Result ar = attn[i].run(in);
                long[] sel = row(out(ar, "in_indices"));
                OnnxTensor inSlots = longs(env, ug.prepare(sel), new long[] {1, sel.length});
                trash.add(inSlots);
                dg.residencyInto(cacheGlu);
                Map<String, OnnxTensor> u = new HashMap<>(upSlabs[i]);
                u.put("x", (OnnxTensor) out(ar, "x"));
                u.put("in_indices", (OnnxTensor) out(ar, "in_indices"));
                u.put("in_slots", inSlots);
                u.put("cache_glu", cacheGluT);
                OrtSession.Result ur = up[i].run(u);
                trash.add(ur);
                ug.finish();
                long[] gsel = row(out(ur, "glu_indices"));
                OnnxTensor gluSlots = longs(env, dg.prepare(gsel), new long[] {1, gsel.length});
                trash.add(gluSlots);
                Map<String, OnnxTensor> dn = new HashMap<>(downSlabs[i]);
                dn.put("glu", (OnnxTensor) out(ur, "glu"));
                dn.put("glu_indices", (OnnxTensor) out(ur, "glu_indices"));
                dn.put("glu_slots", gluSlots);
                dn.put("hidden_attn", (OnnxTensor) out(ar, "hidden_attn"));
                OrtSession.Result dr = down[i].run(dn);
                trash.add(dr);
                dg.finish();
                hidden = out(ar, "hidden_attn");
                mlpOut = out(dr, "mlp_out");
                // the attention result owns the new KV cache: keep it, drop the previous one
                if (kvOwner[i] != null) kvOwner[i].close();
                else {
                    pastK[i].close();
                    pastV[i].close();
                }
                kvOwner[i] = ar;
                pastK[i] = (OnnxTensor) out(ar, GraphNames.presentKey(i));
                pastV[i] = (OnnxTensor) out(ar, GraphNames.presentValue(i));
            }
            Map<String, OnnxTensor> hd = new HashMap<>();
            hd.put("hidden", (OnnxTensor) hidden);
            hd.put("mlp_out", (OnnxTensor) mlpOut);
            OrtSession.Result hr = head.run(hd);
            trash.add(hr);
            FloatBuffer lb = ((OnnxTensor) out(hr, "logits")).getFloatBuffer();
            float[] logits = new float[lb.remaining()];
            lb.get(logits);
            position++;
            stats.tokens++;
            stats.nanos += System.nanoTime() - t0;
            stats.flashBytes += flash.bytes - flashBefore;
            stats.flashRequests = flash.requests;
            updateCacheStats();
            return logits;
        } finally {
            for (AutoCloseable c : trash) {
                try {
                    c.close();
                } catch (Exception ignored) {
                    // closing a native value twice is harmless here
                }
            }
        }
    }

    private void updateCacheStats() {
        long h = 0, m = 0, slabs = 0;
        for (int i = 0; i < layers; i++) {
            h += upGroups[i].cache.hits() + downGroups[i].cache.hits();
            m += upGroups[i].cache.misses() + downGroups[i].cache.misses();
            slabs += upGroups[i].slabBytes() + downGroups[i].slabBytes();
        }
        stats.hits = h;
        stats.misses = m;
        long kv = 2L * layers * kvHeads * position * headDim * 4;
        stats.residentEstimate = slabs + denseBytes + kv;
        stats.rssBytes = Stats.processRss();
    }

    /** Prefills {@code prompt} and streams up to {@code maxNewTokens} tokens; returns the generated ids. */
    public long[] generate(String prompt, int maxNewTokens, Sampler sampler, Listener listener)
            throws OrtException, IOException {
        long[] ids = tokenizer.encode(prompt, false); // add_special_tokens=False, as the Python runtime
        if (ids.length == 0) throw new IllegalArgumentException("empty prompt");
        float[] logits = null;
        for (long id : ids) logits = step(id);
        long[] eos = manifest.eosTokenIds();
        Bpe.StreamDecoder text = tokenizer.new StreamDecoder(true);
        List<Long> outIds = new ArrayList<>();
        for (int n = 0; n < maxNewTokens && position < maxContext; n++) {
            int next = sampler.next(logits);
            outIds.add((long) next);
            boolean stop = false;
            for (long e : eos) stop |= e == next;
            if (stop) break;
            listener.onText(text.push(next));
            logits = step(next);
            listener.onStats(stats);
        }
        listener.onText(text.flush());
        return outIds.stream().mapToLong(Long::longValue).toArray();
    }

    public int position() { return position; }

    @Override
    public void close() throws Exception {
        for (int i = 0; i < layers; i++) {
            if (kvOwner[i] != null) kvOwner[i].close();
            else {
                pastK[i].close();
                pastV[i].close();
            }
            for (OnnxTensor t : upSlabs[i].values()) t.close();
            for (OnnxTensor t : downSlabs[i].values()) t.close();
            attn[i].close();
            up[i].close();
            down[i].close();
        }
        cacheInT.close();
        cacheGluT.close();
        embed.close();
        positions.close();
        head.close();
        flash.close();
    }
}
