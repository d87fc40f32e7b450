package ai.dipdeploy.engine;

import static org.junit.Assert.assertTrue;
import static org.junit.Assume.assumeTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Map;

/**
 * Golden vectors written by android_demo/golden/make_golden.py. Their folder comes from the system property
 * {@code dipdeploy.golden} (check.sh sets it) or the environment variable {@code DIPDEPLOY_GOLDEN}; without
 * either the golden tests are skipped (e.g. {@code ./gradlew test} in Android Studio), with either they must
 * exist.
 */
final class Golden {
    private Golden() {}

    static Path dir() {
        String d = System.getProperty("dipdeploy.golden");
        if (d == null || d.isEmpty()) d = System.getenv("DIPDEPLOY_GOLDEN");
        assumeTrue("golden vectors not configured (-Ddipdeploy.golden=DIR)", d != null && !d.isEmpty());
        Path p = Paths.get(d);
        assertTrue(p + "/golden.ok missing: run android_demo/golden/make_golden.py", Files.isRegularFile(p.resolve("golden.ok")));
        return p;
    }

    static Map<String, Object> load(String name) throws IOException {
        return Json.obj(Json.parse(new String(Files.readAllBytes(dir().resolve(name)), StandardCharsets.UTF_8)), name);
    }

    static Map<String, Object> m(Object o) { return Json.obj(o, "golden"); }
    static List<Object> a(Object o) { return Json.arr(o, "golden"); }
    static long[] longs(Object o) { return Json.longs(o, "golden"); }
    static int[] ints(Object o) { return Json.ints(o, "golden"); }
    static String s(Object o) { return (String) o; }

    static float[] floats(Object o) {
        long[] b = longs(o);
        float[] f = new float[b.length];
        for (int k = 0; k < b.length; k++) f[k] = Float.intBitsToFloat((int) b[k]);
        return f;
    }

    static boolean[] bools(Object o) {
        String s = (String) o;
        boolean[] r = new boolean[s.length()];
        for (int k = 0; k < r.length; k++) r[k] = s.charAt(k) == '1';
        return r;
    }

    static String bits(boolean[] b) {
        StringBuilder s = new StringBuilder(b.length);
        for (boolean x : b) s.append(x ? '1' : '0');
        return s.toString();
    }

    static int[][] intRows(Object o) {
        List<Object> l = a(o);
        int[][] r = new int[l.size()][];
        for (int k = 0; k < r.length; k++) r[k] = ints(l.get(k));
        return r;
    }
}
