package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;

import java.util.List;
import java.util.Map;
import org.junit.Test;

public class RowCacheTest {
    @Test
    public void matchesPythonOnEveryPolicy() throws Exception {
        List<Object> cases = a(Golden.load("rowcache.json").get("cases"));
        int steps = 0;
        for (Object co : cases) {
            Map<String, Object> c = m(co);
            String name = s(c.get("name")), policy = s(c.get("policy"));
            int rows = (int) Json.lng(c.get("rows"), "rows");
            int[][] sels = intRows(c.get("selections"));
            boolean[] pinned = c.get("pinned") == null ? null : bools(c.get("pinned"));
            RowCache rc = new RowCache(rows, (int) Json.lng(c.get("capacity"), "cap"), policy,
                    policy.equals("belady") ? sels : null, pinned);
            assertEquals(name, Json.lng(c.get("capacity_effective"), "c"), rc.capacity);
            List<Object> hits = a(c.get("hits")), res = a(c.get("resident"));
            for (int t = 0; t < sels.length; t++) {
                long[] sel = new long[sels[t].length];
                for (int j = 0; j < sel.length; j++) sel[j] = sels[t][j];
                assertEquals(name + " step " + t + " hits", hits.get(t), bits(rc.access(sel)));
                assertEquals(name + " step " + t + " resident", res.get(t), bits(rc.resident()));
                steps++;
            }
            assertEquals(name, Json.lng(c.get("hits_total"), "h"), rc.hits());
            assertEquals(name, Json.lng(c.get("misses_total"), "m"), rc.misses());
        }
        System.out.println("RowCache: " + cases.size() + " cases, " + steps + " steps equal to Python");
    }

    @Test
    public void staticRowsMatchPython() throws Exception {
        List<Object> cases = a(Golden.load("rowcache.json").get("static_rows"));
        for (Object co : cases) {
            Map<String, Object> c = m(co);
            assertEquals(c.toString(), c.get("mask"),
                    bits(RowCache.staticRows(longs(c.get("counts")), (int) Json.lng(c.get("capacity"), "c"))));
        }
    }

    @Test
    public void packedKeysTieToLowerIndex() {
        // equal primary and secondary: the lower index gets the larger key
        assertEquals(1, Long.signum(RowCache.pack(3, 1, 10, 2) - RowCache.pack(3, 1, 10, 7)));
        assertEquals(((3L << 24 | 1L) << 17) | 7, RowCache.pack(3, 1, 10, 2));
        RowCache c = new RowCache(8, 2, "lru");
        c.access(new long[] {5, 1, 3});
        assertArrayEquals(new boolean[] {false, true, false, true, false, false, false, false}, c.resident());
    }

    @Test
    public void rejectsBadArguments() {
        assertThrows(IllegalArgumentException.class, () -> new RowCache(8, 2, "fifo"));
        assertThrows(IllegalArgumentException.class, () -> new RowCache(8, 2, "belady"));
        assertThrows(IllegalArgumentException.class, () -> new RowCache(8, 2, "static"));
        assertThrows(IllegalArgumentException.class, () -> new RowCache(1 << 17, 2, "lru"));
        assertThrows(IllegalArgumentException.class,
                () -> new RowCache(4, 1, "static", null, new boolean[] {true, true, false, false}));
        assertThrows(IndexOutOfBoundsException.class, () -> new RowCache(4, 1, "lru").access(new long[] {4}));
        assertEquals(0, new RowCache(4, 3, "none").capacity);
    }
}
