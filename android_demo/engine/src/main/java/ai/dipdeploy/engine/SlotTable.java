package ai.dipdeploy.engine;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * Which slab slot each cached row of one group uses: the Java mirror of {@code dipdeploy/cache/slots.py}.
 *
 * <p>The slab has {@code capacity + staging} rows: slots [0, capacity) hold the rows the {@link RowCache}
 * keeps resident, the rest is a staging area for rows this token needs but the cache does not admit. One
 * step: (1) hits keep their slot; (2) rows evicted by this step that the token does not use free their
 * slots at once; (3) misses, in ascending row order, that the cache admits take the lowest free slot; the
 * others, and admitted rows for which no slot is free yet, take staging slots in row order; (4) after the
 * MLP ran ({@link #finish}) the evicted rows the token used free their slots and the admitted rows waiting
 * in staging move to the lowest free slots (a DRAM copy, never a second Flash read).
 */
public final class SlotTable {
    /** What one step asks of the slab (see the Python {@code SlotStep}). */
    public static final class Step {
        /** slot of every selected row, aligned with the selection (the op's {@code *_slots} input) */
        public final long[] slots;
        /** Flash reads before the MLP: rows ascending, and their slots */
        public final long[] readRows, readSlots;
        /** evicted rows the token used: their slots are freed by {@link #finish} */
        public final long[] release;
        /** admitted rows that wait in staging, and their staging slots */
        public final long[] deferredRows, deferredFrom;

        Step(long[] slots, long[] readRows, long[] readSlots, long[] release, long[] deferredRows,
             long[] deferredFrom) {
            this.slots = slots;
            this.readRows = readRows;
            this.readSlots = readSlots;
            this.release = release;
            this.deferredRows = deferredRows;
            this.deferredFrom = deferredFrom;
        }
    }

    /** DRAM copies of {@link #finish}: staging slot {@code from[j]} → cache slot {@code to[j]}. */
    public static final class Moves {
        public final long[] from, to;

        Moves(long[] from, long[] to) {
            this.from = from;
            this.to = to;
        }
    }

    public final int rows, capacity, staging;
    private final long[] slotOf; // row → slot or -1
    private final long[] rowOf;  // slot → row or -1 (cache slots only)

    public SlotTable(int rows, int capacity, int staging) {
        if (capacity < 0 || staging < 0 || capacity > rows)
            throw new IllegalArgumentException("slot table: need 0 <= capacity <= rows and staging >= 0, got rows="
                    + rows + ", capacity=" + capacity + ", staging=" + staging);
        this.rows = rows;
        this.capacity = capacity;
        this.staging = staging;
        this.slotOf = new long[rows];
        this.rowOf = new long[capacity];
        Arrays.fill(slotOf, -1);
        Arrays.fill(rowOf, -1);
    }

    public int slabRows() { return capacity + staging; }

    /** Rows that hold a cache slot; equals the cache's residency between steps. */
    public boolean[] resident() {
        boolean[] out = new boolean[rows];
        for (int r = 0; r < rows; r++) out[r] = slotOf[r] >= 0;
        return out;
    }

    public long slotOf(int row) { return slotOf[row]; }

    /** Gives {@code rs} the lowest free slots (as many as are free); returns the slots given. */
    private long[] take(long[] rs) {
        long[] free = new long[Math.min(rs.length, capacity)];
        int n = 0;
        for (int s = 0; s < capacity && n < rs.length; s++) if (rowOf[s] < 0) free[n++] = s;
        for (int j = 0; j < n; j++) {
            rowOf[(int) free[j]] = rs[j];
            slotOf[(int) rs[j]] = free[j];
        }
        return Arrays.copyOf(free, n);
    }

    private void release(long[] rs) {
        for (long r : rs) {
            rowOf[(int) slotOf[(int) r]] = -1;
            slotOf[(int) r] = -1;
        }
    }

    /** Places {@code rows} (e.g. the pinned set of {@code static}) before the first token; returns the reads. */
    public Step preload(long[] rowsToLoad) {
        long[] rs = rowsToLoad.clone();
        Arrays.sort(rs);
        if (rs.length > capacity)
            throw new IllegalArgumentException("preload: " + rs.length + " rows exceed the capacity of " + capacity
                    + " slots");
        long[] given = take(rs);
        long[] empty = new long[0];
        return new Step(empty, rs, given, empty, empty, empty);
    }

    /** Slots for one token's {@code selected} rows (rule steps 1–3). */
    public Step assign(long[] sel, boolean[] hits, boolean[] residentAfter) {
        int k = sel.length;
        long[] slots = new long[k];
        for (int j = 0; j < k; j++) {
            if ((slotOf[(int) sel[j]] >= 0) != hits[j])
                throw new IllegalStateException("slot table out of step with the cache: a hit has no slot or a "
                        + "miss holds one");
            if (hits[j]) slots[j] = slotOf[(int) sel[j]];
        }
        boolean[] used = new boolean[rows];
        for (long r : sel) used[(int) r] = true;
        List<Long> evictedUsed = new ArrayList<>();
        List<Long> evictedFree = new ArrayList<>();
        for (int s = 0; s < capacity; s++) {
            long r = rowOf[s];
            if (r >= 0 && !residentAfter[(int) r]) (used[(int) r] ? evictedUsed : evictedFree).add(r);
        }
        release(toArray(evictedFree));
        Integer[] misses = missesByRow(sel, hits);
        List<Integer> admitted = new ArrayList<>();
        List<Integer> bypass = new ArrayList<>();
        for (int j : misses) (residentAfter[(int) sel[j]] ? admitted : bypass).add(j);
        long[] admittedRows = new long[admitted.size()];
        for (int a = 0; a < admittedRows.length; a++) admittedRows[a] = sel[admitted.get(a)];
        long[] given = take(admittedRows);
        for (int a = 0; a < given.length; a++) slots[admitted.get(a)] = given[a];
        List<Integer> staged = new ArrayList<>(bypass);
        List<Integer> deferred = admitted.subList(given.length, admitted.size());
        staged.addAll(deferred);
        staged.sort((x, y) -> Long.compare(sel[x], sel[y])); // stable
        if (staged.size() > staging)
            throw new IllegalStateException("slot table: " + staged.size() + " rows need staging, only " + staging
                    + " slots");
        for (int a = 0; a < staged.size(); a++) slots[staged.get(a)] = capacity + a;
        long[] readRows = new long[misses.length], readSlots = new long[misses.length];
        for (int a = 0; a < misses.length; a++) {
            readRows[a] = sel[misses[a]];
            readSlots[a] = slots[misses[a]];
        }
        long[] dRows = new long[deferred.size()], dFrom = new long[deferred.size()];
        for (int a = 0; a < dRows.length; a++) {
            dRows[a] = sel[deferred.get(a)];
            dFrom[a] = slots[deferred.get(a)];
        }
        return new Step(slots, readRows, readSlots, toArray(evictedUsed), dRows, dFrom);
    }

    /** Rule step 4, after the MLP ran: returns the DRAM copies (staging slot → cache slot) to do. */
    public Moves finish(Step step) {
        release(step.release);
        long[] to = take(step.deferredRows);
        if (to.length != step.deferredRows.length)
            throw new IllegalStateException("slot table: no free slot for an admitted row after the step");
        return new Moves(step.deferredFrom.clone(), to);
    }

    private static Integer[] missesByRow(long[] sel, boolean[] hits) {
        List<Integer> m = new ArrayList<>();
        for (int j = 0; j < sel.length; j++) if (!hits[j]) m.add(j);
        m.sort((x, y) -> Long.compare(sel[x], sel[y])); // stable
        return m.toArray(new Integer[0]);
    }

    private static long[] toArray(List<Long> l) {
        long[] out = new long[l.size()];
        for (int j = 0; j < out.length; j++) out[j] = l.get(j);
        return out;
    }
}
