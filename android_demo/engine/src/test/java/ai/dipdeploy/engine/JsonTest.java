package ai.dipdeploy.engine;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;

import java.math.BigInteger;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.junit.Test;

public class JsonTest {
    @Test
    public void parsesValues() {
        Map<String, Object> m = Json.obj(Json.parse(
                " {\"a\": [1, -2, 3.5, 1e-06, true, false, null], \"b\": {\"c\": \"x\\n\\u00e9\\ud83e\\udd17\\\"\"},"
                        + " \"big\": 1000000000000000019884624838656, \"neg\": -9223372036854775808} "), "t");
        assertEquals(Arrays.asList(1L, -2L, 3.5, 1e-06, true, false, null), m.get("a"));
        assertEquals("x\né\uD83E\uDD17\"", Json.obj(m.get("b"), "b").get("c"));
        assertEquals(new BigInteger("1000000000000000019884624838656"), m.get("big"));
        assertEquals(Long.MIN_VALUE, m.get("neg"));
        assertEquals(Arrays.asList("a", "b", "big", "neg"), Arrays.asList(m.keySet().toArray()));
    }

    @Test
    public void shortestReprRoundTrips() {
        // Python's json writes repr(float): the shortest string that round-trips; Java reads it back exactly
        assertEquals(0.1 + 0.2, (Double) Json.parse("0.30000000000000004"), 0.0);
        assertEquals(5.536806233723959, (Double) Json.parse("5.536806233723959"), 0.0);
        assertNull(Json.parse("null"));
        assertEquals(List.of(), Json.parse("[ ]"));
    }

    @Test
    public void rejectsMalformed() {
        for (String bad : new String[] {"", "{", "[1,]", "{\"a\" 1}", "tru", "\"abc", "1 2", "{\"a\":1,}", "\"\\x\""})
            assertThrows(bad, IllegalArgumentException.class, () -> Json.parse(bad));
    }
}
