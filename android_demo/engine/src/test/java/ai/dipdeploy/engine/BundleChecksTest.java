package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Map;
import org.junit.Test;

/**
 * Issue #56's bundle checks on copies of the exported bundle, each damaged one way by
 * android_demo/golden/sandbox_cases.py: {@code verify} lists the problems Python's lists (a genai_config.json
 * naming an op library, a hard link to a file outside the bundle, a FIFO, graphs naming data outside the bundle or
 * past a file's end), and a manifest the Python reader refuses is refused with the same line.
 */
public class BundleChecksTest {
    @Test
    public void damagedCopiesGiveThePythonProblems() throws Exception {
        List<Object> cases = a(Golden.load("sandbox.json").get("bundles"));
        assertTrue(cases.size() >= 8);
        for (Object o : cases) {
            Map<String, Object> c = m(o);
            String name = s(c.get("name"));
            Path bundle = Paths.get(s(c.get("bundle")));
            if (c.containsKey("error")) {
                try {
                    Manifest.read(bundle);
                    fail(name + ": accepted");
                } catch (IllegalArgumentException ex) {
                    assertEquals(name, c.get("error"), ex.getMessage());
                }
                continue;
            }
            assertEquals(name, c.get("verify"), Manifest.read(bundle).verify(bundle));
        }
        System.out.println("BundleChecks: " + cases.size() + " damaged bundle copies, verify equal to Python");
    }
}
