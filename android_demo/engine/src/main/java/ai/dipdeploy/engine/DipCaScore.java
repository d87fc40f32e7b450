package ai.dipdeploy.engine;

/**
 * The mask rule of DIP and DIP-CA: the Java mirror of {@code dipdeploy/cache/score.py}, one row at a time.
 *
 * <pre>
 *   s = |x| ⊙ (c + γ (1 − c)) / ‖x‖∞        (float32 arithmetic, like numpy on float32)
 *   mask = top-K(s)                           (ties → lower index first)
 * </pre>
 *
 * Comparisons use primitive float operators (as numpy does), so −0.0 and 0.0 tie and go to the lower index.
 * In the engine the score runs inside the ONNX graphs (TopKColumnMask); this class is the reference the
 * tests hold the Python definition against, and what a Java-side simulator would use.
 */
public final class DipCaScore {
    private DipCaScore() {}

    /** Scores from magnitudes {@code xAbs} and the residency (null = no cache / plain DIP). */
    public static float[] scores(float[] xAbs, boolean[] resident, float gamma, int fixedTopN) {
        if (!(gamma >= 0.0f && gamma <= 1.0f))
            throw new IllegalArgumentException("gamma must lie in [0, 1], got " + gamma);
        float peak = Float.NEGATIVE_INFINITY;
        for (float v : xAbs) if (v > peak) peak = v;
        float div = peak > 0 ? peak : 1.0f;
        float[] s = new float[xAbs.length];
        for (int r = 0; r < s.length; r++) s[r] = xAbs[r] / div;
        if (resident == null || gamma == 1.0f) return s;
        float[] w = new float[s.length];
        for (int r = 0; r < s.length; r++) w[r] = resident[r] ? 1.0f : gamma;
        if (fixedTopN > 0) for (long r : topkIndices(xAbs, Math.min(fixedTopN, xAbs.length))) w[(int) r] = 1.0f;
        for (int r = 0; r < s.length; r++) s[r] = s[r] * w[r];
        return s;
    }

    /** Indices of the k largest scores, largest first, ties → lower index (stable sort of −s). */
    public static long[] topkIndices(float[] scores, int k) {
        int n = scores.length;
        if (k <= 0 || k > n) throw new IllegalArgumentException("k must lie in [1, " + n + "], got " + k);
        // insertion into a sorted prefix of size k: O(n k) worst case, fine for the sizes used here;
        // a row displaces an entry only if strictly larger, so equal scores keep index order.
        int[] idx = new int[k];
        int filled = 0;
        for (int r = 0; r < n; r++) {
            float v = scores[r];
            if (filled == k && !(v > scores[idx[k - 1]])) continue;
            int pos = filled == k ? k - 1 : filled++;
            while (pos > 0 && v > scores[idx[pos - 1]]) {
                idx[pos] = idx[pos - 1];
                pos--;
            }
            idx[pos] = r;
        }
        long[] out = new long[k];
        for (int j = 0; j < k; j++) out[j] = idx[j];
        return out;
    }

    /** The row set of {@link #topkIndices} in ascending index order. */
    public static long[] topkRows(float[] scores, int k) {
        long[] t = topkIndices(scores, k);
        java.util.Arrays.sort(t);
        return t;
    }

    /** γ warm-up: 1 at step 0, linearly down to {@code gamma} at {@code warmup} (double, as in Python). */
    public static double gammaAt(double gamma, int step, int warmup) {
        if (warmup <= 0 || step >= warmup) return gamma;
        return 1.0 - (1.0 - gamma) * step / warmup;
    }
}
