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
            long[] ids = longs(c.get("ids"));
            assertEquals(which + " lossy " + c.get("ids"), c.get("decode"), tok.decode(ids));
            Bpe.StreamDecoder sd = tok.new StreamDecoder(true); // invalid and unfinished bytes stream as decoded
            StringBuilder sb = new StringBuilder();
            for (long id : ids) sb.append(sd.push(id));
            assertEquals(which + " stream lossy " + c.get("ids"), c.get("decode"), sb.append(sd.flush()).toString());
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

    /** SentencePiece-style files built by golden/sp_tokenizers.py: Gemma, Llama 2, Metaspace (two forms), unk, Phi-3's lstrip/rstrip/single_word. */
    @Test
    public void sentencePieceStyleMatchesTokenizers() throws Exception {
        for (String which : new String[] {"sp-gemma", "sp-llama2", "sp-metaspace", "sp-legacy", "sp-unk", "sp-phi3"}) {
            check(which);
            Bpe tok = Bpe.fromFile(Paths.get(s(m(Golden.load("tokenizer.json").get(which)).get("file"))));
            assertEquals(which, Bpe.Family.SENTENCEPIECE, tok.family());
        }
    }

    @Test
    public void byteLevelFilesAreByteLevel() throws Exception {
        for (String which : new String[] {"smollm2", "tiny"}) {
            Bpe tok = Bpe.fromFile(Paths.get(s(m(Golden.load("tokenizer.json").get(which)).get("file"))));
            assertEquals(which, Bpe.Family.BYTE_LEVEL, tok.family());
        }
    }

    /** A hand-checkable Gemma-style file: " " → "▁", merges "▁ a" then "a a", byte fallback for "A" only. */
    private static String spJson(String normalizer, String pre, String decoder, String model, String added) {
        return "{\"added_tokens\": [" + added + "], \"normalizer\": " + normalizer + ", \"pre_tokenizer\": " + pre
                + ", \"post_processor\": null, \"decoder\": " + decoder + ", \"model\": {\"type\": " + model
                + ", \"dropout\": null, \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true,"
                + " \"vocab\": {\"<unk>\": 0, \"\u2581\": 1, \"a\": 2, \"\u2581a\": 3, \"aa\": 4, \"<0x41>\": 5, \"<s>\": 6},"
                + " \"merges\": [\"\u2581 a\", \"a a\"]}}";
    }

    private static final String GEMMA_NORM = "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}";
    private static final String GEMMA_DEC = "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\":"
            + " {\"String\": \"\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}";
    private static final String BOS = "{\"id\": 6, \"content\": \"<s>\", \"special\": true, \"normalized\": false}";

    private static Bpe sp(String normalizer, String pre, String decoder, String model, String added) {
        return new Bpe(Json.obj(Json.parse(spJson(normalizer, pre, decoder, model, added)), "t"));
    }

    @Test
    public void sentencePieceByHand() {
        Bpe tok = sp(GEMMA_NORM, "null", GEMMA_DEC, "\"BPE\"", BOS);
        assertEquals(Bpe.Family.SENTENCEPIECE, tok.family());
        // "aa a" → a a ▁ a → (▁ a first: rank 0) a a ▁a → (a a) aa ▁a; "A" → <0x41>; "é" → no bytes → <unk>
        assertArrayEquals(new long[] {4, 3}, tok.encode("aa a"));
        assertArrayEquals(new long[] {5, 3}, tok.encode("A a"));
        assertArrayEquals(new long[] {2, 0, 6, 1}, tok.encode("a\u00e9\u00e9<s> "));
        assertEquals("aa a", tok.decode(new long[] {4, 3}));
        assertEquals("A a", tok.decode(new long[] {5, 3}));
        assertEquals("a<unk><s> ", tok.decode(new long[] {2, 0, 6, 1}, false));
        assertEquals("a<unk> ", tok.decode(new long[] {2, 0, 6, 1}));
    }

    private static void assertRefused(String named, Runnable build) {
        try {
            build.run();
        } catch (IllegalArgumentException e) {
            org.junit.Assert.assertTrue(named + " not named in: " + e.getMessage(), e.getMessage().contains(named));
            org.junit.Assert.assertTrue(e.getMessage(), e.getMessage().contains("not supported"));
            return;
        }
        org.junit.Assert.fail("accepted a tokenizer.json with " + named);
    }

    @Test
    public void unsupportedComponentsAreRefusedByName() {
        String bl = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}";
        assertRefused("normalizer NFKC", () -> sp("{\"type\": \"NFKC\"}", "null", GEMMA_DEC, "\"BPE\"", BOS));
        assertRefused("normalizer Lowercase", () -> sp("{\"type\": \"Sequence\", \"normalizers\": [" + GEMMA_NORM
                + ", {\"type\": \"Lowercase\"}]}", "null", GEMMA_DEC, "\"BPE\"", BOS));
        assertRefused("normalizer Replace with pattern [Regex]", () -> sp(GEMMA_NORM.replace("String", "Regex"), "null",
                GEMMA_DEC, "\"BPE\"", BOS));
        assertRefused("pre_tokenizer Whitespace", () -> sp(GEMMA_NORM, "{\"type\": \"Whitespace\"}", GEMMA_DEC, "\"BPE\"", BOS));
        assertRefused("pre_tokenizer ByteLevel with a SentencePiece-style decoder", () -> sp("null", bl, GEMMA_DEC, "\"BPE\"", BOS));
        assertRefused("normalizer Replace with a ByteLevel decoder", () -> sp(GEMMA_NORM, bl, bl, "\"BPE\"", BOS));
        assertRefused("decoder CTC", () -> sp(GEMMA_NORM, "null", GEMMA_DEC.replace("\"Fuse\"", "\"CTC\""), "\"BPE\"", BOS));
        assertRefused("decoder WordPiece", () -> sp(GEMMA_NORM, "null", "{\"type\": \"WordPiece\"}", "\"BPE\"", BOS));
        assertRefused("decoder ByteLevel inside a decoder Sequence", () -> sp(GEMMA_NORM, "null",
                GEMMA_DEC.replace("\"Fuse\"", "\"ByteLevel\""), "\"BPE\"", BOS));
        assertRefused("decoder null", () -> sp(GEMMA_NORM, "null", "null", "\"BPE\"", BOS));
        assertRefused("truncation", () -> new Bpe(Json.obj(Json.parse(spJson(GEMMA_NORM, "null", GEMMA_DEC, "\"BPE\"", BOS)
                .replaceFirst("\\{", "{\"truncation\": {\"max_length\": 4}, ")), "t")));
        assertRefused("model Unigram", () -> sp(GEMMA_NORM, "null", GEMMA_DEC, "\"Unigram\"", BOS));
        assertRefused("prepend_scheme sometimes", () -> sp("null", "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\","
                + " \"prepend_scheme\": \"sometimes\", \"split\": false}", GEMMA_DEC, "\"BPE\"", BOS));
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
