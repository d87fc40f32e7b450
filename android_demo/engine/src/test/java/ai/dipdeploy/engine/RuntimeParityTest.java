package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assume.assumeTrue;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Map;
import org.junit.Test;

/**
 * Parity with the Python host runtime ({@code dipdeploy.runtime.Engine}, greedy, on the tiny bundle): the
 * engine's pure part — tokenizer, cache capacities under both cache splits, the per-group protocol (RowCache + SlotTable + Flash
 * reads) — fed the selections the runtime's graphs made, gives the runtime's hits and Flash totals.
 * (The graphs themselves need ORT's native library, which cannot run here.)
 */
public class RuntimeParityTest {
    @Test
    public void groupsReproduceThePythonRuntime() throws Exception {
        Map<String, Object> g = Golden.load("runtime.json");
        assumeTrue("the Python runtime was not available when the golden vectors were written",
                Boolean.TRUE.equals(g.get("available")));
        Path bundle = Paths.get(s(g.get("bundle")));
        Manifest man = Manifest.read(bundle);
        Bpe tok = Bpe.fromFile(bundle.resolve("tokenizer.json"));
        int steps = 0;
        for (Object ro : a(g.get("runs"))) {
            Map<String, Object> run = m(ro);
            String policy = s(run.get("policy"));
            assertArrayEquals(longs(run.get("prompt_ids")), tok.encode(s(run.get("prompt")), false));
            assertEquals(run.get("text"), tok.decode(longs(run.get("tokens"))));
            List<Object> caps = a(run.get("capacity")), ks = a(run.get("k"));
            int[][] javaCaps = CacheSplit.forManifest(man, 0.5, policy, s(run.get("split")));
            try (FlashStore fs = new FlashStore(bundle.resolve("mlp.bin"))) {
                for (int i = 0; i < man.numLayers(); i++) {
                    String[] groups = {"up_gate", "down"};
                    String[] sels = {"sel_in", "sel_glu"}, hits = {"hits_in", "hits_glu"};
                    for (int gi = 0; gi < 2; gi++) {
                        long cap = longs(a(caps).get(i))[gi];
                        int k = (int) longs(a(ks).get(i))[gi];
                        assertEquals(policy + " " + s(run.get("split")) + " layer " + i + " " + groups[gi]
                                + " capacity", cap, javaCaps[i][gi]);
                        assertEquals(k, gi == 0 ? man.layers.get(i).kIn : man.layers.get(i).kGlu);
                        MlpGroup grp = new MlpGroup(man, i, groups[gi], k, policy, (int) cap, fs, null, null);
                        List<Object> sel = a(a(run.get(sels[gi])).get(i)), hit = a(a(run.get(hits[gi])).get(i));
                        for (int t = 0; t < sel.size(); t++) {
                            grp.prepare(longs(sel.get(t)));
                            // the hits the runtime recorded are the residency before this token
                            assertEquals(policy + " layer " + i + " " + groups[gi] + " token " + t, hit.get(t),
                                    bits(grp.lastHits));
                            grp.finish();
                            steps++;
                        }
                    }
                }
                // the runtime reads the groups interleaved by layer; the totals do not depend on the order
                assertEquals(policy + " Flash bytes", Json.lng(run.get("flash_bytes"), "b"), fs.bytes);
                assertEquals(policy + " Flash requests", Json.lng(run.get("flash_requests"), "r"), fs.requests);
            }
        }
        System.out.println("RuntimeParity: " + steps + " group-token steps, hits and Flash totals equal to dipdeploy.runtime");
    }
}
