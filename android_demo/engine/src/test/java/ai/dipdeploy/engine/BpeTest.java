package ai.dipdeploy.engine;

import static ai.dipdeploy.engine.Golden.*;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;

import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.util.List;
import java.util.Map;
import org.junit.Test;

public class BpeTest {
    private void check(String which) throws Exception {
        Map<String, Object> g = m(Golden.load("tokenizer.json").get(which));
        Bpe tok = Bpe.fromFile(Paths.get(s(g.get("file"))));
        assertEquals(which, Json.lng(g.get("vocab_size"), "v"), tok.vocabSize());
        int n = 0;
        for (Object o : a(g.get("cases"))) {
            Map<String, Object> c = m(o);
            String text = s(c.get("text"));
            long[] ids = longs(c.get("ids"));
            assertArrayEquals(which + " encode " + text, ids, tok.encode(text));
            assertEquals(which + " decode " + text, c.get("decode"), tok.decode(ids));
            assertEquals(which + " decode keep " + text, c.get("decode_special"), tok.decode(ids, false));
            List<Object> single = a(c.get("single"));
            for (int j = 0; j < ids.length; j++)
                assertEquals(which + " single " + ids[j], single.get(j), tok.decode(new long[] {ids[j]}, false));
            if (c.get("prefixes") != null) {
                List<Object> pre = a(c.get("prefixes"));
                for (int k = 0; k <= ids.length; k++)
                    assertEquals(which + " prefix " + k + " of " + text, pre.get(k),
                            tok.decode(java.util.Arrays.copyOf(ids, k)));
            }
            // streaming emits exactly the decoded text, never a broken character
            Bpe.StreamDecoder sd = tok.new StreamDecoder(true);
            StringBuilder sb = new StringBuilder();
            for (long id : ids) {
                String delta = sd.push(id);
                if (!s(c.get("decode")).contains("\uFFFD"))
                    assertFalse(which + " stream broke a character: " + text, delta.contains("\uFFFD"));
                sb.append(delta);
            }
            sb.append(sd.flush());
            assertEquals(which + " stream " + text, c.get("decode"), sb.toString());
            n++;
        }
        for (Object o : a(g.get("bytes"))) {
            Map<String, Object> c = m(o);
            assertEquals(which + " lossy " + c.get("ids"), c.get("decode"), tok.decode(longs(c.get("ids"))));
        }
        System.out.println("Bpe " + which + ": " + n + " strings encode/decode equal to the tokenizers library");
    }

    @Test
    public void smollm2MatchesTokenizers() throws Exception {
        check("smollm2");
    }

    @Test
    public void tinyByteTokenizerMatchesTokenizers() throws Exception {
        check("tiny");
    }

    @Test
    public void postProcessorIdsOnlyWithAddSpecial() {
        StringBuilder vocab = new StringBuilder();
        String[] alphabet = {"a", "b", "ab", "<s>"};
        for (int k = 0; k < alphabet.length; k++) vocab.append(k == 0 ? "" : ",").append('"').append(alphabet[k]).append("\":").append(k);
        String tj = "{\"normalizer\": null, \"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true}],"
                + "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true},"
                + "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
                + "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"ids\": [3]}}},"
                + "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"dropout\": null,"
                + "\"vocab\": {" + vocab + "}, \"merges\": [\"a b\"]}}";
        Bpe tok = new Bpe(Json.obj(Json.parse(tj), "t"));
        assertArrayEquals(new long[] {3, 2, 0}, tok.encode("aba"));
        assertArrayEquals(new long[] {2, 0}, tok.encode("aba", false));
        assertArrayEquals(new long[] {3, 2, 3}, tok.encode("<s>ab<s>", false));
        assertEquals("aba", tok.decode(new long[] {3, 2, 0}));
        assertEquals("<s>aba", tok.decode(new long[] {3, 2, 0}, false));
    }

    @Test
    public void lossyUtf8IsOneReplacementPerMaximalSubpart() {
        byte[] b = {(byte) 0xF0, (byte) 0x9F, 0x41, (byte) 0xE2, (byte) 0x82, (byte) 0xAC, (byte) 0xED, (byte) 0xA0,
                (byte) 0x80, (byte) 0xC0, (byte) 0xAF};
        assertEquals("\uFFFDA€\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD", Bpe.utf8Lossy(b, 0, b.length));
        String ok = "naïve 日本 🤗";
        byte[] u = ok.getBytes(StandardCharsets.UTF_8);
        assertEquals(ok, Bpe.utf8Lossy(u, 0, u.length));
    }
}
