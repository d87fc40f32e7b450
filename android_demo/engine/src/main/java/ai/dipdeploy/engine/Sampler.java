package ai.dipdeploy.engine;

import java.util.Arrays;
import java.util.Random;

/**
 * Next-token choice from logits: greedy (argmax, ties → lower id, like numpy's argmax) or temperature +
 * nucleus (top-p) sampling with a seeded {@link Random}, so a run is reproducible on one JVM. The random
 * stream is Java's, not numpy's: sampled text is not comparable with the Python runtime, greedy text is.
 */
public final class Sampler {
    public final float temperature, topP;
    private final Random rng;

    /** {@code temperature <= 0} means greedy. */
    public Sampler(float temperature, float topP, long seed) {
        if (!(topP > 0 && topP <= 1)) throw new IllegalArgumentException("top_p must lie in (0, 1], got " + topP);
        this.temperature = temperature;
        this.topP = topP;
        this.rng = new Random(seed);
    }

    public static Sampler greedy() {
        return new Sampler(0f, 1f, 0);
    }

    public static int argmax(float[] logits, int off, int len) {
        int best = 0;
        for (int k = 1; k < len; k++) if (logits[off + k] > logits[off + best]) best = k;
        return best;
    }

    public int next(float[] logits) {
        return next(logits, 0, logits.length);
    }

    /** Picks from {@code logits[off, off+len)}. */
    public int next(float[] logits, int off, int len) {
        if (temperature <= 0) return argmax(logits, off, len);
        double max = Double.NEGATIVE_INFINITY;
        for (int k = 0; k < len; k++) max = Math.max(max, logits[off + k]);
        double[] p = new double[len];
        double sum = 0;
        for (int k = 0; k < len; k++) sum += p[k] = Math.exp((logits[off + k] - max) / temperature);
        Integer[] order = new Integer[len];
        for (int k = 0; k < len; k++) order[k] = k;
        Arrays.sort(order, (a, b) -> Double.compare(p[b], p[a])); // stable: ties → lower id
        double cum = 0;
        int keep = 0;
        while (keep < len) {
            cum += p[order[keep]] / sum;
            keep++;
            if (cum >= topP) break;
        }
        double mass = 0;
        for (int k = 0; k < keep; k++) mass += p[order[k]];
        double r = rng.nextDouble() * mass;
        for (int k = 0; k < keep; k++) {
            r -= p[order[k]];
            if (r < 0) return order[k];
        }
        return order[keep - 1];
    }
}
