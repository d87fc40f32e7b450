package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;

import java.util.List;
import java.util.Map;
import org.junit.Test;

public class SlotTableTest {
    @Test
    public void stepsMatchPython() throws Exception {
        List<Object> cases = a(Golden.load("slots.json").get("cases"));
        int steps = 0;
        for (Object co : cases) {
            Map<String, Object> c = m(co);
            String name = s(c.get("name")), policy = s(c.get("policy"));
            int rows = (int) Json.lng(c.get("rows"), "r");
            List<Object> st = a(c.get("steps"));
            int[][] future = null;
            if (policy.equals("belady")) {
                future = new int[st.size()][];
                for (int t = 0; t < st.size(); t++) {
                    future[t] = ints(m(st.get(t)).get("sel"));
                    java.util.Arrays.sort(future[t]);
                }
            }
            boolean[] pinned = c.get("pinned") == null ? null : bools(c.get("pinned"));
            RowCache rc = new RowCache(rows, (int) Json.lng(c.get("capacity"), "c"), policy, future, pinned);
            SlotTable tab = new SlotTable(rows, rc.capacity, (int) Json.lng(c.get("staging"), "s"));
            if (c.get("preload") != null) {
                long[] pins = new long[rc.residentCount()];
                int n = 0;
                for (int r = 0; r < rows; r++) if (pinned[r]) pins[n++] = r;
                SlotTable.Step p = tab.preload(pins);
                assertArrayEquals(name, longs(m(c.get("preload")).get("read_rows")), p.readRows);
                assertArrayEquals(name, longs(m(c.get("preload")).get("read_slots")), p.readSlots);
            }
            for (int t = 0; t < st.size(); t++) {
                Map<String, Object> g = m(st.get(t));
                String at = name + " step " + t + " ";
                long[] sel = longs(g.get("sel"));
                boolean[] hits = rc.access(sel);
                assertEquals(at + "hits", g.get("hits"), bits(hits));
                assertEquals(at + "resident", g.get("resident_after"), bits(rc.resident()));
                SlotTable.Step step = tab.assign(sel, hits, rc.resident());
                assertArrayEquals(at + "slots", longs(g.get("slots")), step.slots);
                assertArrayEquals(at + "read_rows", longs(g.get("read_rows")), step.readRows);
                assertArrayEquals(at + "read_slots", longs(g.get("read_slots")), step.readSlots);
                assertArrayEquals(at + "release", longs(g.get("release")), step.release);
                assertArrayEquals(at + "deferred_rows", longs(g.get("deferred_rows")), step.deferredRows);
                assertArrayEquals(at + "deferred_from", longs(g.get("deferred_from")), step.deferredFrom);
                SlotTable.Moves mv = tab.finish(step);
                assertArrayEquals(at + "moves_from", longs(g.get("moves_from")), mv.from);
                assertArrayEquals(at + "moves_to", longs(g.get("moves_to")), mv.to);
                assertArrayEquals(at + "table = cache", rc.resident(), tab.resident());
                steps++;
            }
        }
        System.out.println("SlotTable: " + cases.size() + " cases, " + steps + " steps equal to Python");
    }

    @Test
    public void refusesInconsistentState() {
        SlotTable t = new SlotTable(8, 2, 1);
        assertThrows(IllegalStateException.class,
                () -> t.assign(new long[] {1}, new boolean[] {true}, new boolean[8]));
        assertThrows(IllegalStateException.class, // two bypassing misses, one staging slot
                () -> t.assign(new long[] {1, 2}, new boolean[2], new boolean[8]));
        assertThrows(IllegalArgumentException.class, () -> new SlotTable(4, 5, 0));
        assertThrows(IllegalArgumentException.class, () -> t.preload(new long[] {1, 2, 3}));
    }
}
