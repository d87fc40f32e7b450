package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;

import java.util.List;
import java.util.Map;
import org.junit.Test;

/** {@link CacheSplit} against Python's {@code dipdeploy.cache.split} (split.json) and by hand. */
public class CacheSplitTest {
    private static int[][] ints2(Object o) {
        List<Object> rows = a(o);
        int[][] out = new int[rows.size()][];
        for (int i = 0; i < out.length; i++) out[i] = ints(rows.get(i));
        return out;
    }

    private static long[][] longs2(Object o) {
        List<Object> rows = a(o);
        long[][] out = new long[rows.size()][];
        for (int i = 0; i < out.length; i++) out[i] = longs(rows.get(i));
        return out;
    }

    @Test
    public void readsSplitMatchesPython() throws Exception {
        Map<String, Object> g = Golden.load("split.json");
        int n = 0;
        for (Object co : a(g.get("cases"))) {
            Map<String, Object> c = m(co);
            int[][] want = ints2(c.get("capacity"));
            int[][] got = CacheSplit.byReads(ints2(c.get("rows")), longs2(c.get("row_bytes")), ints2(c.get("k")),
                    Json.lng(c.get("cache_bytes"), "cache_bytes"));
            for (int i = 0; i < want.length; i++) assertArrayEquals("case " + n + " layer " + i, want[i], got[i]);
            n++;
        }
        for (Object mo : a(g.get("miss_cost"))) {
            Map<String, Object> c = m(mo);
            assertEquals(Json.lng(c.get("cost"), "cost"), CacheSplit.missCost(Json.lng(c.get("row_bytes"), "rb")));
        }
        System.out.println("CacheSplit: " + n + " reads splits equal to dipdeploy.cache.split");
    }

    @Test
    public void smallRowsAreCachedFirst() {
        // SmolLM2's shape at BQ4: a 306 B down row costs a request and a block like a 1,632 B up|gate row
        int[][] rows = {{576, 1536}, {576, 1536}}, k = {{317, 691}, {317, 691}};
        long[][] rb = {{1632, 306}, {1632, 306}};
        int[][] even = {{288, 768}, {288, 768}};
        int[][] reads = CacheSplit.spend(CacheSplit.READS, even, rows, rb, k);
        assertEquals(1536, reads[0][1]);
        assertEquals(1536, reads[1][1]);
        long spent = 0, budget = 0;
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                spent += reads[i][j] * rb[i][j];
                budget += even[i][j] * rb[i][j];
            }
        assertEquals(true, spent <= budget && budget - spent < 2 * 1632);
        assertArrayEquals(even[0], CacheSplit.spend(CacheSplit.EVEN, even, rows, rb, k)[0]);
        assertThrows(IllegalArgumentException.class, () -> CacheSplit.spend("odd", even, rows, rb, k));
    }

    @Test
    public void roundsLikePython() {
        assertEquals(0.1, CacheSplit.round12(0.1 + 1e-14), 0.0);
        assertEquals(1.0 / 3, CacheSplit.round12(1.0 / 3), 1e-12);
        assertEquals(0.0, CacheSplit.round12(0.0), 0.0);
    }
}
