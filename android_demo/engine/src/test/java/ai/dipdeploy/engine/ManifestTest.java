package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.Test;

public class ManifestTest {
    @Test
    public void readsTheExportedBundleLikePython() throws Exception {
        Map<String, Object> g = Golden.load("bundle.json");
        Map<String, Object> e = m(g.get("expected"));
        Manifest man = Manifest.read(Paths.get(s(g.get("bundle"))));
        assertEquals(e.get("method"), man.method);
        assertEquals(Json.lng(e.get("alignment"), "a"), man.alignment);
        assertEquals(Json.lng(e.get("hidden_size"), "d"), man.hiddenSize());
        assertEquals(Json.lng(e.get("intermediate_size"), "f"), man.intermediateSize());
        assertEquals(Json.lng(e.get("num_layers"), "l"), man.numLayers());
        assertEquals(Json.lng(e.get("vocab_size"), "v"), man.vocabSize());
        assertEquals(Json.lng(e.get("num_kv_heads"), "h"), man.numKvHeads());
        assertEquals(Json.lng(e.get("head_dim"), "h"), man.headDim());
        assertEquals(e.get("native_library"), man.nativeLibrary());
        assertEquals(e.get("graph_layers"), man.layerGraphs());
        assertEquals(e.get("dipca"), man.dipca());
        long[] kIn = longs(e.get("k_in")), kGlu = longs(e.get("k_glu"));
        for (int i = 0; i < man.layers.size(); i++) {
            assertEquals(kIn[i], man.layers.get(i).kIn);
            assertEquals(kGlu[i], man.layers.get(i).kGlu);
        }
        Map<String, Object> tensors = m(e.get("tensors")), rowBytes = m(e.get("row_bytes"));
        assertEquals(new ArrayList<>(tensors.keySet()), new ArrayList<>(man.tensors.keySet()));
        for (Map.Entry<String, Object> te : tensors.entrySet()) {
            Map<String, Object> t = m(te.getValue());
            Manifest.Tensor mt = man.tensors.get(te.getKey());
            assertEquals(t.get("file"), mt.file);
            assertEquals(t.get("offset"), mt.offset);
            assertEquals(t.get("length"), mt.length);
            assertEquals(t.get("dtype"), mt.dtype);
            assertArrayEquals(longs(t.get("shape")), mt.shape);
            assertEquals(te.getKey(), rowBytes.get(te.getKey()), mt.rowBytes());
        }
    }

    @Test
    public void acceptsAndRejectsWhatPythonDoes() throws Exception {
        for (Object o : a(Golden.load("bundle.json").get("variants"))) {
            Map<String, Object> v = m(o);
            boolean ok;
            try {
                Manifest.fromJson(s(v.get("text")));
                ok = true;
            } catch (IllegalArgumentException ex) {
                ok = false;
                assertTrue(ex.getMessage(), ex.getMessage().contains("dipdeploy export"));
            }
            assertEquals(s(v.get("name")), v.get("ok"), ok);
        }
    }

    @Test
    public void verifyFindsTheSameProblems() throws Exception {
        Map<String, Object> g = Golden.load("bundle.json");
        Path bundle = Paths.get(s(g.get("bundle"))), damaged = Paths.get(s(g.get("damaged")));
        assertEquals(g.get("verify"), Manifest.read(bundle).verify(bundle));
        List<String> got = Manifest.read(damaged).verify(damaged);
        assertEquals(g.get("verify_damaged"), got);
        assertFalse(got.isEmpty());
    }

    @Test
    public void graphNamesMatchTheExportedGraphs() throws Exception {
        Map<String, Object> g = Golden.load("bundle.json");
        Map<String, Object> io = m(g.get("graph_io"));
        Manifest man = Manifest.read(Paths.get(s(g.get("bundle"))));
        assertEquals(m(io.get(GraphNames.EMBED)).get("inputs"), GraphNames.embedInputs());
        assertEquals(m(io.get(GraphNames.EMBED)).get("outputs"), GraphNames.embedOutputs());
        assertEquals(m(io.get(GraphNames.HEAD)).get("inputs"), GraphNames.headInputs());
        assertEquals(m(io.get(GraphNames.HEAD)).get("outputs"), GraphNames.headOutputs());
        assertEquals(m(io.get(GraphNames.POSITIONS)).get("inputs"), GraphNames.positionsInputs());
        List<Object> perToken = new ArrayList<>((List<?>) m(io.get(GraphNames.POSITIONS)).get("outputs"));
        assertEquals(5, perToken.size()); // the standard attention's RoPE rows (q and k layouts) and mask bias
        List<String> names = new ArrayList<>();
        for (Object o : perToken) names.add(s(o));
        for (int i = 0; i < man.numLayers(); i++) {
            assertEquals(m(io.get(GraphNames.attnFile(i))).get("inputs"), GraphNames.attnInputs(i, names));
            assertEquals(m(io.get(GraphNames.attnFile(i))).get("outputs"), GraphNames.attnOutputs(i));
            List<String> ug = new ArrayList<>(), dn = new ArrayList<>();
            for (Manifest.Tensor t : man.groupArrays(i, "up_gate")) ug.add(MlpGroup.inputName("up_gate", t));
            for (Manifest.Tensor t : man.groupArrays(i, "down")) dn.add(MlpGroup.inputName("down", t));
            assertEquals(m(io.get(GraphNames.mlpUpFile(i))).get("inputs"), GraphNames.mlpUpInputs(ug));
            assertEquals(m(io.get(GraphNames.mlpUpFile(i))).get("outputs"), GraphNames.mlpUpOutputs());
            assertEquals(m(io.get(GraphNames.mlpDownFile(i))).get("inputs"), GraphNames.mlpDownInputs(dn));
            assertEquals(m(io.get(GraphNames.mlpDownFile(i))).get("outputs"), GraphNames.mlpDownOutputs());
        }
    }

    @Test
    public void errorsNameTheFix() {
        try {
            Manifest.fromJson("{\"format\": \"dipdeploy-bundle\", \"version\": 7}");
            fail();
        } catch (IllegalArgumentException ex) {
            assertTrue(ex.getMessage(), ex.getMessage().contains("bundle version 7 is not supported"));
            assertTrue(ex.getMessage().contains("dipdeploy export"));
        }
        assertNull(Json.parse("null"));
    }
}
