package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;

import java.util.List;
import java.util.Map;
import org.junit.Test;

public class DipCaScoreTest {
    @Test
    public void scoresAndTopkMatchPythonBitForBit() throws Exception {
        List<Object> cases = a(Golden.load("score.json").get("cases"));
        int checks = 0;
        for (int n = 0; n < cases.size(); n++) {
            Map<String, Object> c = m(cases.get(n));
            float[] x = floats(c.get("x"));
            boolean[] res = c.get("resident") == null ? null : bools(c.get("resident"));
            float gamma = (float) Json.dbl(c.get("gamma"), "gamma");
            int topN = (int) Json.lng(c.get("fixed_top_n"), "n");
            float[] s = DipCaScore.scores(x, res, gamma, topN);
            long[] want = longs(c.get("scores"));
            for (int r = 0; r < s.length; r++)
                assertEquals("case " + n + " row " + r, want[r], (long) Float.floatToRawIntBits(s[r]) & 0xffffffffL);
            for (Map.Entry<String, Object> e : m(c.get("topk")).entrySet()) {
                int k = Integer.parseInt(e.getKey());
                assertArrayEquals("case " + n + " topk " + k, longs(e.getValue()), DipCaScore.topkIndices(s, k));
                assertArrayEquals("case " + n + " rows " + k, longs(m(c.get("rows")).get(e.getKey())),
                        DipCaScore.topkRows(s, k));
                checks++;
            }
        }
        System.out.println("DipCaScore: " + cases.size() + " score cases, " + checks + " top-k checks equal to Python");
    }

    @Test
    public void gammaWarmupMatchesPython() throws Exception {
        for (Object o : a(Golden.load("score.json").get("gamma_at"))) {
            Map<String, Object> c = m(o);
            assertEquals(c.toString(), Json.dbl(c.get("value"), "v"),
                    DipCaScore.gammaAt(Json.dbl(c.get("gamma"), "g"), (int) Json.lng(c.get("step"), "s"),
                            (int) Json.lng(c.get("warmup"), "w")), 0.0);
        }
    }

    @Test
    public void greedyIsNumpyArgmax() throws Exception {
        for (Object o : a(Golden.load("score.json").get("argmax"))) {
            Map<String, Object> c = m(o);
            assertEquals(Json.lng(c.get("argmax"), "a"), Sampler.greedy().next(floats(c.get("logits"))));
        }
    }

    @Test
    public void tiesGoToTheLowerIndex() {
        float[] s = {0.5f, 1f, 0.5f, -0.0f, 0.0f, 1f};
        assertArrayEquals(new long[] {1, 5, 0, 2, 3}, DipCaScore.topkIndices(s, 5));
        assertArrayEquals(new long[] {0, 1, 2, 3, 5}, DipCaScore.topkRows(s, 5));
    }
}
