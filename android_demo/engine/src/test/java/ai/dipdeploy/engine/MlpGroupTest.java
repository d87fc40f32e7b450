package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;

import java.io.ByteArrayOutputStream;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Map;
import org.junit.Test;

/**
 * The engine's per-token group protocol without ORT: RowCache.access → SlotTable.assign → Flash reads into
 * the slab → (the op reads slab rows at the slots) → finish. The bytes the op would read, gathered from the
 * slab at the returned slots in selection order, must hash like Python's memmap rows of the selection.
 */
public class MlpGroupTest {
    @Test
    public void slabHoldsTheSelectedRowsAtTheirSlots() throws Exception {
        Map<String, Object> g = Golden.load("bundle.json");
        Path bundle = Paths.get(s(g.get("bundle")));
        Manifest man = Manifest.read(bundle);
        int steps = 0;
        for (Object o : a(g.get("groups"))) {
            Map<String, Object> c = m(o);
            try (FlashStore fs = new FlashStore(bundle.resolve("mlp.bin"))) {
                int layer = (int) Json.lng(c.get("layer"), "l");
                String policy = s(c.get("policy"));
                MlpGroup grp = new MlpGroup(man, layer, s(c.get("group")), (int) Json.lng(c.get("k"), "k"), policy,
                        (int) Json.lng(c.get("capacity"), "c"), fs, null, null);
                String name = grp.toString() + " " + policy;
                assertEquals(name, c.get("arrays"), grp.arrays.stream().map(x -> x.name).collect(java.util.stream.Collectors.toList()));
                List<Object> st = a(c.get("steps"));
                for (int t = 0; t < st.size(); t++) {
                    Map<String, Object> e = m(st.get(t));
                    long[] sel = longs(e.get("sel"));
                    long b0 = fs.bytes, r0 = fs.requests;
                    byte[] res = new byte[grp.rows];
                    grp.residencyInto(java.nio.ByteBuffer.wrap(res));
                    for (int r = 0; r < grp.rows; r++) assertEquals(grp.cache.isResident(r) ? 1 : 0, res[r]);
                    long[] slots = grp.prepare(sel);
                    assertArrayEquals(name + " step " + t, longs(e.get("slots")), slots);
                    assertEquals(name + " step " + t + " bytes", Json.lng(e.get("bytes"), "b"), fs.bytes - b0);
                    assertEquals(name + " step " + t + " requests", Json.lng(e.get("requests"), "r"), fs.requests - r0);
                    ByteArrayOutputStream op = new ByteArrayOutputStream();
                    for (int a = 0; a < grp.arrays.size(); a++)
                        for (long slot : slots) op.write(grp.slabRow(a, slot));
                    assertEquals(name + " step " + t + " slab bytes", e.get("sha256"), FlashStoreTest.sha(op.toByteArray()));
                    assertEquals(name + " step " + t + " moves", Json.lng(e.get("moves"), "m"), grp.finish().from.length);
                    steps++;
                }
            }
        }
        System.out.println("MlpGroup: " + steps + " token steps: slots, Flash bytes/requests and slab contents equal to Python");
    }

    @Test
    public void resetStartsLikeANewGroup() throws Exception {
        Map<String, Object> g = Golden.load("bundle.json");
        Path bundle = Paths.get(s(g.get("bundle")));
        Manifest man = Manifest.read(bundle);
        Map<String, Object> c = m(a(g.get("groups")).get(0));
        List<Object> st = a(c.get("steps"));
        try (FlashStore fs = new FlashStore(bundle.resolve("mlp.bin"))) {
            MlpGroup grp = new MlpGroup(man, (int) Json.lng(c.get("layer"), "l"), s(c.get("group")),
                    (int) Json.lng(c.get("k"), "k"), s(c.get("policy")), (int) Json.lng(c.get("capacity"), "c"), fs, null, null);
            for (int round = 0; round < 2; round++) {
                for (int t = 0; t < 6; t++) {
                    assertArrayEquals("round " + round + " step " + t, longs(m(st.get(t)).get("slots")),
                            grp.prepare(longs(m(st.get(t)).get("sel"))));
                    grp.finish();
                }
                grp.reset();
                assertEquals(0, grp.cache.residentCount());
            }
        }
    }

    @Test
    public void capacityRoundsLikePython() {
        assertEquals(32, MlpGroup.capacityFor(0.5, 64, "lfu"));
        assertEquals(2, MlpGroup.capacityFor(0.5, 5, "lru"));   // round(2.5) = 2 (half to even)
        assertEquals(4, MlpGroup.capacityFor(0.5, 7, "lru"));   // round(3.5) = 4
        assertEquals(0, MlpGroup.capacityFor(0.5, 64, "none"));
    }
}
