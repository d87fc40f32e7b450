package ai.dipdeploy.engine;

import java.math.BigDecimal;
import java.math.RoundingMode;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeSet;

/**
 * How the cache bytes are shared between the MLP groups: the rule of Python's {@code dipdeploy.cache.split},
 * held equal to the Python runtime's capacities by {@code RuntimeParityTest}.
 *
 * <p>{@code even}: {@code round(frac · rows)} rows of every group. {@code reads} (the default, as in
 * {@code dipdeploy run}): the same bytes, spent where a cached byte saves the most reading. A cached row
 * saves about K/rows of a miss per token and a miss costs a request plus whole 4 KiB blocks, so a byte of
 * a group is worth (K/rows) · missCost(rowBytes) / rowBytes; groups are filled in that order, groups of
 * equal worth to the same fraction.
 */
public final class CacheSplit {
    public static final String EVEN = "even";
    public static final String READS = "reads";
    /** The Flash block and what one request costs in blocks' transfer: Python's {@code dipdeploy.flash.BLOCK}, {@code REQUEST_BLOCKS}. */
    static final long BLOCK = Defaults.BLOCK;
    static final long REQUEST_BLOCKS = Defaults.REQUEST_BLOCKS;

    private CacheSplit() {}

    /** What reading one missed row costs in blocks' transfer: its request plus the blocks it covers (at least one). */
    public static long missCost(long rowBytes) {
        return REQUEST_BLOCKS + Math.max(1, Math.floorDiv(rowBytes + BLOCK - 1, BLOCK));
    }

    /** The capacities [layer][0 = up_gate, 1 = down] of {@code split} for a bundle at cache fraction {@code frac}. */
    public static int[][] forManifest(Manifest m, double frac, String policy, String split) {
        int layers = m.numLayers();
        int[][] rows = new int[layers][2], k = new int[layers][2], even = new int[layers][2];
        long[][] rowBytes = new long[layers][2];
        String[] groups = {"up_gate", "down"};
        for (int i = 0; i < layers; i++) {
            Manifest.LayerPlan lp = m.layers.get(i);
            for (int g = 0; g < 2; g++) {
                rows[i][g] = g == 0 ? m.hiddenSize() : m.intermediateSize();
                k[i][g] = g == 0 ? lp.kIn : lp.kGlu;
                even[i][g] = MlpGroup.capacityFor(frac, rows[i][g], policy);
                for (Manifest.Tensor t : m.groupArrays(i, groups[g]))  // per-row arrays only, as MlpGroup reads them
                    if (t.shape.length > 0 && t.shape[0] == rows[i][g]) rowBytes[i][g] += t.rowBytes();
            }
        }
        return spend(split, even, rows, rowBytes, k);  // policy none: no bytes to spend, every capacity 0
    }

    /** The capacities of {@code split}, given the even split's: {@code reads} re-spends the bytes {@code even} gives. */
    public static int[][] spend(String split, int[][] even, int[][] rows, long[][] rowBytes, int[][] k) {
        if (split.equals(EVEN)) {
            int[][] out = new int[even.length][];
            for (int i = 0; i < even.length; i++) out[i] = even[i].clone();
            return out;
        }
        if (!split.equals(READS))
            throw new IllegalArgumentException("cache split " + split + " unknown; choose one of even, reads");
        long bytes = 0;
        for (int i = 0; i < even.length; i++)
            for (int g = 0; g < even[i].length; g++) bytes += (long) even[i][g] * rowBytes[i][g];
        return byReads(rows, rowBytes, k, bytes);
    }

    /** Capacities spending at most {@code cacheBytes} where a cached byte saves the most reading. */
    public static int[][] byReads(int[][] rows, long[][] rowBytes, int[][] k, long cacheBytes) {
        int layers = rows.length;
        double[][] worth = new double[layers][];
        TreeSet<Double> tiers = new TreeSet<>();
        for (int i = 0; i < layers; i++) {
            worth[i] = new double[rows[i].length];
            for (int g = 0; g < rows[i].length; g++) {
                double w = rows[i][g] != 0 && rowBytes[i][g] != 0
                        ? ((double) k[i][g] / rows[i][g]) * missCost(rowBytes[i][g]) / rowBytes[i][g] : 0.0;
                worth[i][g] = round12(w);
                tiers.add(worth[i][g]);
            }
        }
        int[][] cap = new int[layers][];
        for (int i = 0; i < layers; i++) cap[i] = new int[rows[i].length];
        long left = cacheBytes;
        for (double w : tiers.descendingSet()) {
            List<int[]> tier = new ArrayList<>();
            long size = 0;
            for (int i = 0; i < layers; i++)
                for (int g = 0; g < rows[i].length; g++)
                    if (worth[i][g] == w) {
                        tier.add(new int[] {i, g});
                        size += (long) rows[i][g] * rowBytes[i][g];
                    }
            double frac = size != 0 ? Math.min(1.0, (double) left / (double) size) : 0.0;
            for (int[] ig : tier) {
                int i = ig[0], g = ig[1];
                cap[i][g] = (int) (frac * rows[i][g]);
                left -= (long) cap[i][g] * rowBytes[i][g];
            }
            if (left <= 0) break;
        }
        return cap;
    }

    /** Python's {@code round(v, 12)}: the double nearest the exact value rounded half-even to 12 decimals. */
    static double round12(double v) {
        return Double.parseDouble(new BigDecimal(v).setScale(12, RoundingMode.HALF_EVEN).toPlainString());
    }
}
