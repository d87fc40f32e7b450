package ai.dipdeploy.engine;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import org.junit.Test;

/**
 * This engine reads MLP file rows as logical rows, so a bundle whose rows are in a calibrated order
 * ({@code dipdeploy export --row-order calibrated}, docs/method.md "Flash layout") is refused with the fix,
 * while a natural order, or no {@code row_order} at all (older bundles), is read.
 */
public class ManifestRowOrderTest {
    private static String manifest(String rowOrder) {
        return "{\"source\": {\"config\": {}}, \"method\": \"dip\", \"plan\": null, \"quant\": null, \"ops\": {},"
                + " \"onnxruntime\": {}, \"graphs\": {}, \"tensors\": {}, \"files\": {},"
                + (rowOrder == null ? "" : " \"row_order\": " + rowOrder + ",")
                + " \"format\": \"dipdeploy-bundle\", \"version\": " + Manifest.VERSION + "}";
    }

    @Test
    public void naturalAndAbsentRowOrdersAreRead() {
        assertEquals("dip", Manifest.fromJson(manifest(null)).method);
        assertEquals("dip", Manifest.fromJson(manifest("{\"order\": \"natural\"}")).method);
    }

    @Test
    public void aCalibratedRowOrderIsRefusedWithTheFix() {
        try {
            Manifest.fromJson(manifest("{\"order\": \"calibrated\"}"));
            fail("a calibrated row order was accepted");
        } catch (IllegalArgumentException e) {
            assertTrue(e.getMessage(), e.getMessage().contains("--row-order natural"));
        }
    }
}
