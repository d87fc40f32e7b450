package ai.dipdeploy.engine;

import java.util.Arrays;

/**
 * Which weight rows of one matrix group are resident in DRAM: the Java mirror of
 * {@code dipdeploy/cache/policies.py} ({@code RowCache}, one sequence, i.e. {@code batch=1}).
 *
 * <p>One rule serves every policy: (1) hits = resident[selected]; (2) the selected rows' statistics are
 * updated (last use = step, use count + 1); (3) the new resident set is the top-C of resident ∪ selected by
 * the policy's key. Keys are packed into one unique int64 per row exactly as in Python:
 * {@code ((primary << 24) | secondary) << 17 | (rows - 1 - index)}, so ties go to the lower index.
 *
 * <table>
 *   <caption>keys</caption>
 *   <tr><td>none</td><td>capacity forced to 0</td></tr>
 *   <tr><td>lru</td><td>(last use, 0)</td></tr>
 *   <tr><td>lfu</td><td>(use count, last use)</td></tr>
 *   <tr><td>belady</td><td>(horizon − next use, last use), needs the future selections</td></tr>
 *   <tr><td>static</td><td>a pinned set, never updated</td></tr>
 * </table>
 */
public final class RowCache {
    /**
     * One record per policy, the mirror of {@code dipdeploy.cache.policies.POLICY_RECORDS} (same order, same
     * traits; {@code tests/test_records.py} holds them equal): whether an access changes the resident set
     * (then the constant defines {@link #key}), whether the capacity is forced to 0, whether it needs the
     * future selections (a trace), whether it keeps a pinned set. Callers ask the traits, never the name.
     */
    public enum Policy {
        NONE("none", false, true, false, false),
        LRU("lru", true, false, false, false) {
            @Override long key(RowCache c, int r) { return pack(c.lastUse[r], 0, c.rows, r); }
        },
        LFU("lfu", true, false, false, false) {
            @Override long key(RowCache c, int r) { return pack(c.uses[r], c.lastUse[r], c.rows, r); }
        },
        BELADY("belady", true, false, true, false) {
            @Override long key(RowCache c, int r) { // nearer next use → higher key, from the step just taken
                int t = Math.min(c.step - 1, c.nextUse.length - 1);
                long horizon = c.nextUse.length + 1;
                return pack(horizon - c.nextUse[t][r], c.lastUse[r], c.rows, r);
            }
        },
        STATIC("static", false, false, false, true);

        public final String id;
        public final boolean updates, zeroCapacity, needsFuture, pinned;

        Policy(String id, boolean updates, boolean zeroCapacity, boolean needsFuture, boolean pinned) {
            this.id = id;
            this.updates = updates;
            this.zeroCapacity = zeroCapacity;
            this.needsFuture = needsFuture;
            this.pinned = pinned;
        }

        /** The packed key of row {@code r} (policies that update only). */
        long key(RowCache c, int r) { throw new IllegalStateException("policy " + id + " keeps no key"); }

        /** Whether it needs data recorded beforehand (a trace or calibration counts). */
        public boolean offline() { return needsFuture || pinned; }

        public static Policy of(String id) {
            for (Policy p : values()) if (p.id.equals(id)) return p;
            throw new IllegalArgumentException("cache policy '" + id + "' unknown; choose one of "
                    + String.join(", ", POLICIES));
        }
    }

    public static final String[] POLICIES = Arrays.stream(Policy.values()).map(p -> p.id).toArray(String[]::new);
    static final int IDX_BITS = 17;
    static final int SEC_BITS = 24;
    static final int MAX_ROWS = 1 << IDX_BITS;

    public final int rows;
    public final int capacity;
    public final String policy;
    public final Policy traits;
    private final boolean[] resident;
    private final long[] lastUse;
    private final long[] uses;
    private final int[][] nextUse; // belady: [T][rows]
    private int step;
    private long hits, misses;

    // scratch
    private final int[] cand;
    private final long[] candKey;
    private final int[] mark;
    private int markGen;

    public RowCache(int rows, int capacity, String policy) {
        this(rows, capacity, policy, null, null);
    }

    /**
     * @param future belady only: the selections of every step, [T][K]
     * @param pinned static only: the pinned rows (bool [rows]), at most {@code capacity} of them
     */
    public RowCache(int rows, int capacity, String policy, int[][] future, boolean[] pinned) {
        Policy p = Policy.of(policy);
        if (rows <= 0 || rows >= MAX_ROWS)
            throw new IllegalArgumentException("rows must lie in [1, " + (MAX_ROWS - 1) + "], got " + rows);
        if (p.zeroCapacity) capacity = 0;
        this.capacity = Math.min(Math.max(capacity, 0), rows);
        this.rows = rows;
        this.policy = policy;
        this.traits = p;
        this.resident = new boolean[rows];
        this.lastUse = new long[rows];
        this.uses = new long[rows];
        this.cand = new int[rows];
        this.candKey = new long[rows];
        this.mark = new int[rows];
        if (p.needsFuture) {
            if (future == null)
                throw new IllegalArgumentException("policy '" + policy + "' needs the future selections (a recorded trace)");
            this.nextUse = nextUseTable(future, rows);
        } else {
            this.nextUse = null;
        }
        if (p.pinned) {
            if (pinned == null)
                throw new IllegalArgumentException("policy '" + policy + "' needs the pinned rows (see staticRows)");
            if (pinned.length != rows)
                throw new IllegalArgumentException(policy + ": pinned has " + pinned.length + " entries, rows " + rows);
            int n = 0;
            for (boolean b : pinned) if (b) n++;
            if (n > this.capacity)
                throw new IllegalArgumentException(policy + ": " + n + " pinned rows exceed capacity " + this.capacity);
            System.arraycopy(pinned, 0, resident, 0, rows);
        }
    }

    /** next_use[t][r] = first step > t at which row r is selected (T + 1 if never). */
    static int[][] nextUseTable(int[][] future, int rows) {
        int T = future.length;
        int[][] nu = new int[T][];
        int[] cur = new int[rows];
        Arrays.fill(cur, T + 1);
        for (int t = T - 1; t >= 0; t--) {
            nu[t] = cur.clone();
            for (int r : future[t]) cur[r] = t;
        }
        return nu;
    }

    static long pack(long primary, long secondary, int rows, int index) {
        long tie = rows - 1 - index;
        return ((primary << SEC_BITS) | secondary) << IDX_BITS | tie;
    }

    long key(int r) { return traits.key(this, r); }

    /** Records one step's selection (row indices); returns the hit of each entry (residency before the step). */
    public boolean[] access(long[] selected) {
        for (long s : selected)
            if (s < 0 || s >= rows)
                throw new IndexOutOfBoundsException("selected rows must lie in [0, " + rows + "), got " + s);
        boolean[] hit = new boolean[selected.length];
        for (int j = 0; j < selected.length; j++) {
            hit[j] = resident[(int) selected[j]];
            if (hit[j]) hits++;
            else misses++;
        }
        step++;
        // numpy fancy-index updates: a row listed twice is updated once
        if (++markGen == Integer.MAX_VALUE) { Arrays.fill(mark, 0); markGen = 1; }
        for (long s : selected) {
            int r = (int) s;
            if (mark[r] == markGen) continue;
            mark[r] = markGen;
            lastUse[r] = step;
            uses[r] += 1;
        }
        if (traits.updates && capacity > 0) {
            int n = 0;
            for (int r = 0; r < rows; r++)
                if (resident[r] || mark[r] == markGen) cand[n++] = r;
            if (n > capacity) {
                for (int k = 0; k < n; k++) candKey[k] = key(cand[k]);
                // keys are unique: the top-C set is well defined; sort descending by key
                long[] keys = Arrays.copyOf(candKey, n);
                Arrays.sort(keys);
                long threshold = keys[n - capacity]; // smallest key that stays
                Arrays.fill(resident, false);
                for (int k = 0; k < n; k++) if (candKey[k] >= threshold) resident[cand[k]] = true;
            } else {
                for (int k = 0; k < n; k++) resident[cand[k]] = true;
            }
        }
        return hit;
    }

    public boolean isResident(int row) { return resident[row]; }

    /** A copy of the residency (bool [rows]). */
    public boolean[] resident() { return resident.clone(); }

    /** Writes the residency as bytes (1 = resident) into {@code out} from its position (ONNX bool tensor). */
    public void residentInto(java.nio.ByteBuffer out) {
        int p = out.position();
        for (int r = 0; r < rows; r++) out.put(p + r, (byte) (resident[r] ? 1 : 0));
    }

    public int residentCount() {
        int n = 0;
        for (boolean b : resident) if (b) n++;
        return n;
    }

    public int step() { return step; }
    public long hits() { return hits; }
    public long misses() { return misses; }

    public double hitRate() {
        long total = hits + misses;
        return total == 0 ? 0.0 : (double) hits / total;
    }

    /**
     * The pinned set of {@code static}: the {@code capacity} most used rows in calibration {@code counts},
     * ties → lower index (Python's {@code static_rows}: stable argsort of −counts).
     */
    public static boolean[] staticRows(long[] counts, int capacity) {
        int n = counts.length;
        capacity = Math.min(Math.max(capacity, 0), n);
        boolean[] mask = new boolean[n];
        if (capacity == 0) return mask;
        Integer[] order = new Integer[n];
        for (int k = 0; k < n; k++) order[k] = k;
        Arrays.sort(order, (a, b) -> Long.compare(counts[b], counts[a])); // stable (TimSort)
        for (int k = 0; k < capacity; k++) mask[order[k]] = true;
        return mask;
    }
}
