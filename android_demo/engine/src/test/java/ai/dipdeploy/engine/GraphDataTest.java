package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;

import java.util.List;
import java.util.Map;
import org.junit.Test;

/**
 * The external data of hand-built graph bytes (android_demo/golden/sandbox_cases.py): {@link GraphData}'s walk and
 * {@link BundleCheck#graphDataProblems} find what Python's {@code graph_data_problems} finds, string for string —
 * initializers, node attributes, subgraphs, sparse tensors, functions, training graphs, and unreadable bytes.
 */
public class GraphDataTest {
    static byte[] unhex(String h) {
        byte[] b = new byte[h.length() / 2];
        for (int k = 0; k < b.length; k++) b[k] = (byte) Integer.parseInt(h.substring(2 * k, 2 * k + 2), 16);
        return b;
    }

    @Test
    public void problemsEqualPythons() throws Exception {
        List<Object> cases = a(Golden.load("sandbox.json").get("graphdata"));
        assertFalse(cases.isEmpty());
        int found = 0;
        for (Object o : cases) {
            Map<String, Object> c = m(o);
            List<String> got = BundleCheck.graphDataProblems("g.onnx", unhex(s(c.get("hex"))), m(c.get("files")));
            assertEquals(s(c.get("name")), c.get("problems"), got);
            found += got.size();
        }
        assertFalse("no case found a problem", found == 0);
        System.out.println("GraphData: " + cases.size() + " graph byte cases, " + found + " problems equal to Python");
    }
}
