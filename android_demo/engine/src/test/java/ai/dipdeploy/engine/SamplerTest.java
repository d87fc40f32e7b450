package ai.dipdeploy.engine;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import org.junit.Test;

public class SamplerTest {
    @Test
    public void greedyTakesTheFirstMaximum() {
        assertEquals(1, Sampler.greedy().next(new float[] {0f, 3f, 3f, -1f}));
    }

    @Test
    public void seededSamplingIsReproducible() {
        float[] logits = new float[50];
        for (int k = 0; k < logits.length; k++) logits[k] = (float) Math.sin(k) * 3;
        Sampler a = new Sampler(0.8f, 0.9f, 42), b = new Sampler(0.8f, 0.9f, 42);
        for (int t = 0; t < 100; t++) assertEquals(a.next(logits), b.next(logits));
    }

    @Test
    public void tinyTopPIsGreedyAndTopPBoundsTheChoices() {
        float[] logits = {1f, 5f, 4.9f, -2f, 0f};
        Sampler s = new Sampler(1f, 1e-6f, 1);
        for (int t = 0; t < 50; t++) assertEquals(1, s.next(logits));
        Sampler nucleus = new Sampler(1f, 0.6f, 7); // p(1) ≈ 0.50, p(2) ≈ 0.45: the nucleus is {1, 2}
        int[] seen = new int[5];
        for (int t = 0; t < 2000; t++) seen[nucleus.next(logits)]++;
        assertEquals(0, seen[0] + seen[3] + seen[4]);
        assertTrue(seen[1] > 800 && seen[2] > 700);
        assertThrows(IllegalArgumentException.class, () -> new Sampler(1f, 0f, 0));
    }
}
