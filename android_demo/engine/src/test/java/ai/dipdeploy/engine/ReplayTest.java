package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;

import java.util.List;
import java.util.Map;
import org.junit.Test;

/** The DIP-CA token loop (score under the cache → top-K → access) on tiny-llama's recorded magnitudes. */
public class ReplayTest {
    @Test
    public void dipcaLoopMatchesPython() throws Exception {
        List<Object> cases = a(Golden.load("replay.json").get("cases"));
        int steps = 0;
        for (Object co : cases) {
            Map<String, Object> c = m(co);
            String name = "layer " + c.get("layer") + " " + c.get("group") + " " + c.get("policy");
            int rows = (int) Json.lng(c.get("rows"), "r"), k = (int) Json.lng(c.get("k"), "k");
            RowCache rc = new RowCache(rows, (int) Json.lng(c.get("capacity"), "c"), s(c.get("policy")));
            float gamma = (float) Json.dbl(c.get("gamma"), "g");
            int topN = (int) Json.lng(c.get("fixed_top_n"), "n");
            List<Object> x = a(c.get("x_abs")), st = a(c.get("steps"));
            for (int t = 0; t < st.size(); t++) {
                float[] sc = DipCaScore.scores(floats(x.get(t)), rc.resident(), gamma, topN);
                long[] sel = DipCaScore.topkIndices(sc, k);
                assertArrayEquals(name + " step " + t, longs(m(st.get(t)).get("sel")), sel);
                assertEquals(name + " step " + t, m(st.get(t)).get("hits"), bits(rc.access(sel)));
                steps++;
            }
        }
        System.out.println("Replay: " + cases.size() + " DIP-CA loops, " + steps + " steps equal to Python");
    }
}
