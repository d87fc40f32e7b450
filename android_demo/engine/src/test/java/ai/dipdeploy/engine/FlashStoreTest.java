package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;

import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import org.junit.Test;

public class FlashStoreTest {
    @Test
    public void readsTheRowsNumpySees() throws Exception {
        Map<String, Object> g = Golden.load("bundle.json");
        Path bundle = Paths.get(s(g.get("bundle")));
        Manifest man = Manifest.read(bundle);
        int cases = 0;
        try (FlashStore fs = new FlashStore(bundle.resolve("mlp.bin"))) {
            for (Object o : a(g.get("flash"))) {
                Map<String, Object> c = m(o);
                long[] rows = longs(c.get("rows")), slots = longs(c.get("slots"));
                int slabRows = (int) Json.lng(c.get("slab_rows"), "s");
                List<FlashStore.RowArray> arrays = new ArrayList<>();
                List<ByteBuffer> slabs = new ArrayList<>();
                for (Object ao : a(c.get("arrays"))) {
                    Manifest.Tensor t = man.tensors.get(s(m(ao).get("name")));
                    int rb = (int) Json.lng(m(ao).get("row_bytes"), "rb");
                    assertEquals(rb, t.rowBytes());
                    arrays.add(new FlashStore.RowArray(t.name, t.offset, (int) t.shape[0], rb));
                    slabs.add(ByteBuffer.allocateDirect(slabRows * rb));
                }
                long b0 = fs.bytes, r0 = fs.requests;
                fs.read(arrays, slabs, rows, slots);
                assertEquals(Json.lng(c.get("bytes"), "b"), fs.bytes - b0);
                assertEquals(Json.lng(c.get("requests"), "r"), fs.requests - r0);
                for (int a = 0; a < arrays.size(); a++) {
                    List<Object> hex = a(m(a(c.get("arrays")).get(a)).get("rows_hex"));
                    for (int j = 0; j < rows.length; j++) {
                        byte[] got = new byte[arrays.get(a).rowBytes];
                        ByteBuffer d = slabs.get(a).duplicate();
                        d.position((int) slots[j] * got.length);
                        d.get(got);
                        assertEquals(arrays.get(a).name + " row " + rows[j], hex.get(j), HexFormat.of().formatHex(got));
                    }
                }
                cases++;
            }
        }
        System.out.println("FlashStore: " + cases + " read cases equal to numpy memmap");
    }

    @Test
    public void runsAndMoves() {
        assertArrayEquals(new int[] {0, 3, 4, 6}, FlashStore.runs(new long[] {1, 2, 3, 7, 9, 10}));
        assertArrayEquals(new int[] {0}, FlashStore.runs(new long[0]));
        ByteBuffer slab = ByteBuffer.allocateDirect(8);
        for (int k = 0; k < 8; k++) slab.put(k, (byte) k);
        FlashStore.moveRows(slab, 2, new long[] {3}, new long[] {0});
        assertEquals(6, slab.get(0));
        assertEquals(7, slab.get(1));
    }

    static String sha(byte[] b) throws Exception {
        return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(b));
    }
}
