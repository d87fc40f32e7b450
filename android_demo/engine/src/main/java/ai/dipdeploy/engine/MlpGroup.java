package ai.dipdeploy.engine;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * One MLP group of one layer (the up|gate rows, or the down rows) as the host runtime drives it per token,
 * without ONNX Runtime: the cache ({@link RowCache}), the slab slots ({@link SlotTable}), the DRAM slab
 * (one direct buffer per per-row array, {@code capacity + K} rows) and the Flash reads ({@link FlashStore}).
 *
 * <p>Per token: {@link #residencyInto} (the graph's {@code cache_in}/{@code cache_glu}) → the graph selects
 * rows → {@link #prepare} (RowCache.access, SlotTable.assign, Flash reads of the misses into the slab) →
 * the op reads slab rows at the returned slots → {@link #finish} (deferred DRAM moves).
 */
public final class MlpGroup {
    public final int layer;
    public final String group;
    public final int rows, k, capacity;
    public final String policy;
    /** Replaced by {@link #reset}; read them after it, not before. */
    public RowCache cache;
    public SlotTable table;
    private final int[][] future;
    private final boolean[] pinned;
    public final List<Manifest.Tensor> rowTensors = new ArrayList<>();
    public final List<FlashStore.RowArray> arrays = new ArrayList<>();
    public final List<ByteBuffer> slabs = new ArrayList<>();
    /** Tensors of the group that are not per-row (VQ3 codebooks): read whole once, bound as they are. */
    public final List<Manifest.Tensor> sharedTensors = new ArrayList<>();
    public final List<ByteBuffer> shared = new ArrayList<>();
    private final FlashStore store;
    private SlotTable.Step pending;
    /** The hits of the last {@link #prepare} (aligned with its selection). */
    public boolean[] lastHits = new boolean[0];
    public long movedRows;

    /** Capacity of a cache holding {@code frac} of {@code rows}: Python's round() (half to even). */
    public static int capacityFor(double frac, int rows, String policy) {
        return RowCache.Policy.of(policy).zeroCapacity ? 0 : (int) Math.rint(frac * rows);
    }

    /**
     * @param group  "up_gate" or "down"
     * @param k      the plan's K for this group (staging rows)
     * @param future belady only (an offline trace); {@code pinned}: static only
     */
    public MlpGroup(Manifest m, int layer, String group, int k, String policy, int capacity, FlashStore store,
                    int[][] future, boolean[] pinned) throws IOException {
        this.layer = layer;
        this.group = group;
        this.store = store;
        this.k = k;
        List<Manifest.Tensor> all = m.groupArrays(layer, group);
        this.rows = Math.toIntExact(all.get(0).shape[0]);
        for (Manifest.Tensor t : all) {
            if (t.shape.length > 0 && t.shape[0] == rows) {
                long rb = t.rowBytes();
                if (rb * rows != t.length)
                    throw new IllegalArgumentException(t.name + ": length " + t.length + " != rows " + rows + " × "
                            + rb + " bytes; " + Manifest.REGENERATE);
                rowTensors.add(t);
            } else {
                sharedTensors.add(t);
            }
        }
        this.policy = policy;
        this.future = future;
        this.pinned = pinned;
        this.cache = new RowCache(rows, capacity, policy, future, pinned);
        this.capacity = cache.capacity;
        this.table = new SlotTable(rows, this.capacity, k);
        for (Manifest.Tensor t : rowTensors) {
            int rb = Math.toIntExact(t.rowBytes());
            arrays.add(new FlashStore.RowArray(t.name, t.offset, rows, rb));
            slabs.add(ByteBuffer.allocateDirect(Math.multiplyExact(table.slabRows(), rb)).order(ByteOrder.LITTLE_ENDIAN));
        }
        for (Manifest.Tensor t : sharedTensors)
            shared.add(store.readWhole(t.offset, Math.toIntExact(t.length)).order(ByteOrder.LITTLE_ENDIAN));
        preload();
    }

    private void preload() throws IOException {
        if (pinned != null && cache.traits.pinned) {
            long[] pins = new long[cache.residentCount()];
            int n = 0;
            for (int r = 0; r < rows; r++) if (pinned[r]) pins[n++] = r;
            SlotTable.Step s = table.preload(pins);
            store.read(arrays, slabs, s.readRows, s.readSlots);
        }
    }

    /** A new sequence: a fresh cache and slot table (as the Python runtime's reset); static re-pins its rows. */
    public void reset() throws IOException {
        cache = new RowCache(rows, capacity, policy, future, pinned);
        table = new SlotTable(rows, capacity, k);
        pending = null;
        preload();
    }

    /** The graph input name of array {@code t}: {@code <group>.<array>} (e.g. {@code up_gate.qweight}). */
    public static String inputName(String group, Manifest.Tensor t) {
        return group + "." + t.name.substring(t.name.lastIndexOf('.') + 1);
    }

    /** Shape of the slab tensor of per-row array {@code a}: [capacity + K, shape[1:]...]. */
    public long[] slabShape(int a) {
        long[] s = rowTensors.get(a).shape.clone();
        s[0] = table.slabRows();
        return s;
    }

    public long slabBytes() {
        long n = 0;
        for (ByteBuffer b : slabs) n += b.capacity();
        for (ByteBuffer b : shared) n += b.capacity();
        return n;
    }

    /** The residency before this token as an ONNX bool tensor's bytes (1 byte per row). */
    public void residencyInto(ByteBuffer out) {
        cache.residentInto(out);
    }

    /** Access + assign + Flash reads for this token's selection; returns the slots for the op. */
    public long[] prepare(long[] selected) throws IOException {
        if (pending != null) throw new IllegalStateException("finish() the previous step first");
        boolean[] hits = cache.access(selected);
        lastHits = hits;
        SlotTable.Step step = table.assign(selected, hits, cache.resident());
        store.read(arrays, slabs, step.readRows, step.readSlots);
        pending = step;
        return step.slots;
    }

    /** After the MLP ran: frees slots and moves admitted rows out of staging (DRAM copies). */
    public SlotTable.Moves finish() {
        SlotTable.Moves mv = table.finish(pending);
        for (int a = 0; a < slabs.size(); a++) FlashStore.moveRows(slabs.get(a), arrays.get(a).rowBytes, mv.from, mv.to);
        movedRows += mv.from.length;
        pending = null;
        return mv;
    }

    /** The bytes of slab slot {@code slot} of per-row array {@code a} (tests, debugging). */
    public byte[] slabRow(int a, long slot) {
        int rb = arrays.get(a).rowBytes;
        byte[] out = new byte[rb];
        ByteBuffer d = slabs.get(a).duplicate();
        d.position(Math.toIntExact(slot * rb));
        d.get(out);
        return out;
    }

    @Override
    public String toString() {
        return "MlpGroup(layer " + layer + " " + group + ", rows " + rows + ", K " + k + ", capacity " + capacity
                + ", arrays " + Arrays.toString(arrays.stream().map(x -> x.name).toArray()) + ")";
    }
}
