package ai.dipdeploy.engine;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;

/**
 * The SentencePiece-style components of a Hugging Face {@code tokenizer.json} (Gemma, Llama 2, Mistral, Phi-3):
 * the normalizer (Replace of a literal string, Prepend, a Sequence of them), the Metaspace pre-tokenizer and the
 * decoder chain (Replace, ByteFallback, Fuse, Strip, Metaspace). Each one mirrors the {@code tokenizers} crate's
 * component of the same name, quirks included (a Metaspace decoder drops every replacement character of the
 * first token; an invalid ByteFallback run becomes one U+FFFD per byte), because tokenisation is bit-equal by
 * contract (android_demo/README.md). Any other component or option is refused with its name: an encoding that
 * silently differs from the library's would feed the model other ids than the Python runtime does.
 */
final class SentencePiece {
    private SentencePiece() {}

    /** A Replace pattern: only {@code {"String": s}} (SentencePiece files use no regex here). */
    static String literal(Object pattern, String where) {
        Map<String, Object> p = Json.obj(pattern, where + ".pattern");
        if (p.size() != 1 || !p.containsKey("String"))
            throw Bpe.unsupported(where + " with pattern " + p.keySet() + " (only a {\"String\": …} pattern)");
        String s = Json.str(p.get("String"), where + ".pattern.String");
        if (s.isEmpty()) throw Bpe.unsupported(where + " with an empty pattern");
        return s;
    }

    /** Replace (literal) and Prepend steps, in order; {@code null} JSON is no normalizer. */
    static final class Normalizer {
        private final List<String[]> steps = new ArrayList<>(); // {"Replace", from, to} or {"Prepend", text}

        Normalizer(Map<String, Object> json) {
            add(json);
        }

        private void add(Map<String, Object> n) {
            String type = Json.str(n.get("type"), "normalizer.type");
            switch (type) {
                case "Sequence":
                    for (Object o : Json.arr(n.get("normalizers"), "normalizer.normalizers")) add(Json.obj(o, "normalizer"));
                    break;
                case "Replace":
                    steps.add(new String[] {type, literal(n.get("pattern"), "normalizer Replace"),
                            Json.str(n.get("content"), "normalizer Replace.content")});
                    break;
                case "Prepend":
                    steps.add(new String[] {type, Json.str(n.get("prepend"), "normalizer Prepend.prepend")});
                    break;
                default:
                    throw Bpe.unsupported("normalizer " + type);
            }
        }

        /** The normalized text of one piece (the crate's Prepend leaves an empty piece empty). */
        String apply(String s) {
            for (String[] st : steps) {
                if (st[0].equals("Replace")) s = s.replace(st[1], st[2]);
                else if (!s.isEmpty()) s = st[1] + s;
            }
            return s;
        }
    }

    /** The Metaspace prepend scheme, from {@code prepend_scheme} or the older {@code add_prefix_space}. */
    private static String prependScheme(Map<String, Object> m, String where) {
        Object scheme = m.get("prepend_scheme");
        if (scheme == null) {
            Object aps = m.get("add_prefix_space");
            return aps == null || Json.bool(aps, where + ".add_prefix_space") ? "always" : "never";
        }
        String s = Json.str(scheme, where + ".prepend_scheme");
        if (!s.equals("always") && !s.equals("first") && !s.equals("never"))
            throw Bpe.unsupported(where + " prepend_scheme " + s);
        return s;
    }

    private static String replacement(Map<String, Object> m, String where) {
        String r = Json.str(m.get("replacement"), where + ".replacement");
        if (r.codePointCount(0, r.length()) != 1) throw Bpe.unsupported(where + " replacement '" + r + "' (one character)");
        return r;
    }

    /** The Metaspace pre-tokenizer: spaces → the replacement, the prepend scheme, optional split before each. */
    static final class Metaspace {
        private final String replacement;
        private final String scheme;
        private final boolean split;

        Metaspace(Map<String, Object> m) {
            replacement = replacement(m, "pre_tokenizer Metaspace");
            scheme = prependScheme(m, "pre_tokenizer Metaspace");
            split = m.get("split") == null || Json.bool(m.get("split"), "pre_tokenizer Metaspace.split");
        }

        /** The words of one non-empty piece; {@code atStart}: it begins at offset 0 of the input text. */
        List<String> apply(String piece, boolean atStart) {
            String s = piece.replace(" ", replacement);
            boolean prepend = scheme.equals("always") || scheme.equals("first") && atStart;
            if (prepend && !s.startsWith(replacement)) s = replacement + s;
            if (!split) return Collections.singletonList(s);
            List<String> words = new ArrayList<>();
            int start = 0;
            for (int i = s.indexOf(replacement, 1); i >= 0; i = s.indexOf(replacement, i + 1)) { // merged with next
                words.add(s.substring(start, i));
                start = i;
            }
            words.add(s.substring(start));
            return words;
        }
    }

    /** The decoder chain: each step maps the list of token strings to a new list; the result is their join. */
    static final class Decoder {
        private final List<Map<String, Object>> steps = new ArrayList<>();
        private boolean byteFallback;

        Decoder(Map<String, Object> json) {
            if ("Sequence".equals(json.get("type"))) {
                for (Object o : Json.arr(json.get("decoders"), "decoder.decoders")) add(Json.obj(o, "decoder"));
            } else {
                add(json);
            }
        }

        private void add(Map<String, Object> d) {
            String type = Json.str(d.get("type"), "decoder.type");
            switch (type) {
                case "Replace":
                    literal(d.get("pattern"), "decoder Replace");
                    Json.str(d.get("content"), "decoder Replace.content");
                    break;
                case "ByteFallback":
                    byteFallback = true;
                    break;
                case "Fuse":
                    break;
                case "Strip":
                    String c = Json.str(d.get("content"), "decoder Strip.content");
                    if (c.codePointCount(0, c.length()) != 1)
                        throw Bpe.unsupported("decoder Strip with content '" + c + "' (one character)");
                    Json.lng(d.get("start"), "decoder Strip.start");
                    Json.lng(d.get("stop"), "decoder Strip.stop");
                    break;
                case "Metaspace":
                    replacement(d, "decoder Metaspace");
                    prependScheme(d, "decoder Metaspace");
                    break;
                default:
                    throw Bpe.unsupported("decoder " + type + (type.equals("ByteLevel")
                            ? " inside a decoder Sequence" : ""));
            }
            steps.add(d);
        }

        /** Whether the chain turns {@code <0xNN>} tokens into bytes (a trailing run of them is still open). */
        boolean byteFallback() { return byteFallback; }

        String decode(List<String> tokens) {
            List<String> t = tokens;
            for (Map<String, Object> d : steps) t = step(d, t);
            return String.join("", t);
        }

        private static List<String> step(Map<String, Object> d, List<String> in) {
            List<String> out = new ArrayList<>(in.size());
            switch ((String) d.get("type")) {
                case "Replace": {
                    String from = literal(d.get("pattern"), "decoder Replace"), to = (String) d.get("content");
                    for (String s : in) out.add(s.replace(from, to));
                    return out;
                }
                case "ByteFallback": {
                    java.io.ByteArrayOutputStream run = new java.io.ByteArrayOutputStream();
                    for (String s : in) {
                        int b = fallbackByte(s);
                        if (b >= 0) { run.write(b); continue; }
                        flushRun(run, out);
                        out.add(s);
                    }
                    flushRun(run, out);
                    return out;
                }
                case "Fuse":
                    return Collections.singletonList(String.join("", in));
                case "Strip": {
                    int c = ((String) d.get("content")).codePointAt(0);
                    int start = (int) Json.lng(d.get("start"), "start"), stop = (int) Json.lng(d.get("stop"), "stop");
                    for (String s : in) {
                        int[] cp = s.codePoints().toArray();
                        int from = 0, to = cp.length;
                        while (from < Math.min(start, cp.length) && cp[from] == c) from++;
                        for (int k = 0; k < stop && to - 1 >= from && cp[to - 1] == c; k++) to--;
                        out.add(new String(cp, from, to - from));
                    }
                    return out;
                }
                default: { // Metaspace
                    String r = (String) d.get("replacement");
                    boolean dropFirst = !prependScheme(d, "decoder Metaspace").equals("never");
                    for (int i = 0; i < in.size(); i++)
                        out.add(in.get(i).replace(r, i == 0 && dropFirst ? "" : " "));
                    return out;
                }
            }
        }

        /** A run of byte tokens: its UTF-8 text, or one U+FFFD per byte when it is not valid UTF-8 as a whole. */
        private static void flushRun(java.io.ByteArrayOutputStream run, List<String> out) {
            if (run.size() == 0) return;
            byte[] b = run.toByteArray();
            run.reset();
            if (validUtf8(b)) {
                out.add(new String(b, java.nio.charset.StandardCharsets.UTF_8));
            } else {
                for (int k = 0; k < b.length; k++) out.add("\uFFFD");
            }
        }

        private static boolean validUtf8(byte[] b) {
            try {
                java.nio.charset.StandardCharsets.UTF_8.newDecoder().decode(java.nio.ByteBuffer.wrap(b));
                return true;
            } catch (java.nio.charset.CharacterCodingException e) {
                return false;
            }
        }
    }

    /**
     * The byte of a ByteFallback token {@code <0xNN>}, else −1: six bytes long, the two between {@code <0x} and
     * {@code >} parsed as Rust's {@code u8::from_str_radix(_, 16)} does (a leading '+' accepted).
     */
    static int fallbackByte(String t) {
        if (t.length() != 6 || !t.startsWith("<0x") || t.charAt(5) != '>') return -1;
        char a = t.charAt(3), b = t.charAt(4);
        int hb = Character.digit(b, 16);
        if (hb < 0 || b > 0x7f) return -1;
        if (a == '+') return hb;
        int ha = Character.digit(a, 16);
        return ha < 0 || a > 0x7f ? -1 : ha * 16 + hb;
    }
}
