package ai.dipdeploy.engine;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A byte-level BPE tokenizer read from a Hugging Face {@code tokenizer.json} (GPT-2 style, as SmolLM2 and the
 * tiny test models ship it): added/special tokens split out first (leftmost-longest), then the ByteLevel
 * pre-tokenizer (GPT-2 regex, Unicode classes), bytes mapped to GPT-2's printable alphabet, BPE merges by
 * rank (lowest rank first, leftmost on ties — the order of the {@code tokenizers} crate's priority queue).
 * Decoding maps the alphabet back to bytes and decodes UTF-8 lossily with one U+FFFD per maximal invalid
 * subpart (Rust's {@code String::from_utf8_lossy}).
 *
 * <p>Supported: normalizer null; pre_tokenizer ByteLevel, or a Sequence of Split(regex, Isolated) and
 * ByteLevel(use_regex=false); model BPE (vocab, merges as "a b" strings or [a, b] pairs, ignore_merges, no
 * dropout, no subword prefix/suffix); decoder ByteLevel; post_processor TemplateProcessing (single) or
 * ByteLevel. Anything else is rejected with the field named.
 */
public final class Bpe {
    /** GPT-2's pre-tokenizer regex (the tokenizers crate's ByteLevel with use_regex=true). */
    public static final String GPT2_REGEX =
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

    private static final char[] BYTE_CHAR = new char[256];
    private static final Map<Character, Integer> CHAR_BYTE = new HashMap<>();

    static {
        List<Integer> bs = new ArrayList<>();
        for (int b = '!'; b <= '~'; b++) bs.add(b);
        for (int b = 0xA1; b <= 0xAC; b++) bs.add(b);
        for (int b = 0xAE; b <= 0xFF; b++) bs.add(b);
        boolean[] direct = new boolean[256];
        for (int b : bs) direct[b] = true;
        int n = 0;
        for (int b = 0; b < 256; b++) BYTE_CHAR[b] = direct[b] ? (char) b : (char) (256 + n++);
        for (int b = 0; b < 256; b++) CHAR_BYTE.put(BYTE_CHAR[b], b);
    }

    private final Map<String, Integer> vocab;
    private final String[] idToToken;
    private final Map<String, int[]> merges = new HashMap<>(); // "a\0b" → {rank, id}
    private final boolean ignoreMerges;
    private final List<String> added = new ArrayList<>(); // longest first
    private final Map<String, Integer> addedIds = new HashMap<>();
    private final Map<Integer, Boolean> addedSpecial = new HashMap<>();
    private final Pattern split;          // null: no regex split
    private final boolean addPrefixSpace;
    private final long[] prefixIds, suffixIds;
    private final Map<String, long[]> cache = new HashMap<>();

    @SuppressWarnings("unchecked")
    public Bpe(Map<String, Object> tj) {
        Object norm = tj.get("normalizer");
        if (norm != null)
            throw new IllegalArgumentException("tokenizer.json: normalizer " + Json.obj(norm, "normalizer").get("type")
                    + " is not supported (only null)");
        Map<String, Object> model = Json.obj(tj.get("model"), "model");
        if (!"BPE".equals(model.get("type")))
            throw new IllegalArgumentException("tokenizer.json: model.type " + model.get("type") + " is not supported (BPE)");
        for (String f : new String[] {"continuing_subword_prefix", "end_of_word_suffix"}) {
            Object v = model.get(f);
            if (v != null && !"".equals(v))
                throw new IllegalArgumentException("tokenizer.json: model." + f + " is not supported");
        }
        if (model.get("dropout") != null)
            throw new IllegalArgumentException("tokenizer.json: BPE dropout is not supported");
        ignoreMerges = Boolean.TRUE.equals(model.get("ignore_merges"));
        Map<String, Object> v = Json.obj(model.get("vocab"), "model.vocab");
        vocab = new HashMap<>(v.size() * 2);
        int maxId = -1;
        for (Map.Entry<String, Object> e : v.entrySet()) {
            int id = Math.toIntExact(Json.lng(e.getValue(), "model.vocab"));
            vocab.put(e.getKey(), id);
            maxId = Math.max(maxId, id);
        }
        List<Object> addedList = tj.get("added_tokens") == null ? java.util.Collections.emptyList() : Json.arr(tj.get("added_tokens"), "added_tokens");
        for (Object o : addedList) maxId = Math.max(maxId, Math.toIntExact(Json.lng(Json.obj(o, "added_tokens[]").get("id"), "id")));
        idToToken = new String[maxId + 1];
        for (Map.Entry<String, Integer> e : vocab.entrySet()) idToToken[e.getValue()] = e.getKey();
        List<Object> ms = Json.arr(model.get("merges"), "model.merges");
        for (int rank = 0; rank < ms.size(); rank++) {
            Object o = ms.get(rank);
            String a, b;
            if (o instanceof String) {
                String s = (String) o;
                int sp = s.indexOf(' ', 1);
                if (sp < 0) throw new IllegalArgumentException("tokenizer.json: merge '" + s + "' has no space");
                a = s.substring(0, sp);
                b = s.substring(sp + 1);
            } else {
                List<Object> p = Json.arr(o, "model.merges[]");
                a = Json.str(p.get(0), "merge");
                b = Json.str(p.get(1), "merge");
            }
            Integer id = vocab.get(a + b);
            if (id == null) throw new IllegalArgumentException("tokenizer.json: merge " + a + " " + b + " makes a token not in the vocab");
            merges.putIfAbsent(a + '\0' + b, new int[] {rank, id});
        }
        for (Object o : addedList) {
            Map<String, Object> t = Json.obj(o, "added_tokens[]");
            String content = Json.str(t.get("content"), "content");
            int id = Math.toIntExact(Json.lng(t.get("id"), "id"));
            added.add(content);
            addedIds.put(content, id);
            addedSpecial.put(id, Boolean.TRUE.equals(t.get("special")));
            idToToken[id] = content;
        }
        added.sort((x, y) -> Integer.compare(y.length(), x.length()));
        // pre-tokenizer
        Map<String, Object> pre = tj.get("pre_tokenizer") == null ? null : Json.obj(tj.get("pre_tokenizer"), "pre_tokenizer");
        Pattern sp = null;
        boolean aps = false;
        if (pre == null) throw new IllegalArgumentException("tokenizer.json: a byte-level BPE needs a ByteLevel pre_tokenizer");
        List<Object> steps = "Sequence".equals(pre.get("type")) ? Json.arr(pre.get("pretokenizers"), "pretokenizers")
                : java.util.Arrays.asList(pre);
        boolean byteLevel = false;
        for (Object so : steps) {
            Map<String, Object> s = Json.obj(so, "pre_tokenizer");
            String type = Json.str(s.get("type"), "pre_tokenizer.type");
            if (type.equals("ByteLevel")) {
                byteLevel = true;
                aps = Boolean.TRUE.equals(s.get("add_prefix_space"));
                if (!Boolean.FALSE.equals(s.get("use_regex"))) {
                    if (sp != null) throw new IllegalArgumentException("tokenizer.json: two regex splits are not supported");
                    sp = Pattern.compile(GPT2_REGEX, Pattern.UNICODE_CHARACTER_CLASS);
                }
            } else if (type.equals("Split") && "Isolated".equals(s.get("behavior")) && !Boolean.TRUE.equals(s.get("invert"))) {
                Map<String, Object> pat = Json.obj(s.get("pattern"), "Split.pattern");
                if (sp != null) throw new IllegalArgumentException("tokenizer.json: two regex splits are not supported");
                if (pat.containsKey("Regex")) sp = Pattern.compile(Json.str(pat.get("Regex"), "Regex"), Pattern.UNICODE_CHARACTER_CLASS);
                else sp = Pattern.compile(Pattern.quote(Json.str(pat.get("String"), "String")));
            } else {
                throw new IllegalArgumentException("tokenizer.json: pre_tokenizer " + type + " is not supported");
            }
        }
        if (!byteLevel) throw new IllegalArgumentException("tokenizer.json: a byte-level BPE needs a ByteLevel pre_tokenizer");
        split = sp;
        addPrefixSpace = aps;
        Object dec = tj.get("decoder");
        if (dec == null || !"ByteLevel".equals(Json.obj(dec, "decoder").get("type")))
            throw new IllegalArgumentException("tokenizer.json: decoder must be ByteLevel");
        // post-processor: ids added around a single sequence
        List<Long> pre_ = new ArrayList<>(), post = new ArrayList<>();
        Object pp = tj.get("post_processor");
        if (pp != null) {
            Map<String, Object> p = Json.obj(pp, "post_processor");
            String type = Json.str(p.get("type"), "post_processor.type");
            if (type.equals("TemplateProcessing")) {
                boolean seenA = false;
                Map<String, Object> specials = Json.obj(p.get("special_tokens"), "special_tokens");
                for (Object it : Json.arr(p.get("single"), "single")) {
                    Map<String, Object> item = Json.obj(it, "single[]");
                    if (item.containsKey("Sequence")) { seenA = true; continue; }
                    String id = Json.str(Json.obj(item.get("SpecialToken"), "SpecialToken").get("id"), "id");
                    for (long x : Json.longs(Json.obj(specials.get(id), "special_tokens." + id).get("ids"), "ids"))
                        (seenA ? post : pre_).add(x);
                }
            } else if (!type.equals("ByteLevel")) {
                throw new IllegalArgumentException("tokenizer.json: post_processor " + type + " is not supported");
            }
        }
        prefixIds = pre_.stream().mapToLong(Long::longValue).toArray();
        suffixIds = post.stream().mapToLong(Long::longValue).toArray();
    }

    public static Bpe fromFile(Path p) throws IOException {
        return new Bpe(Json.obj(Json.parse(new String(Files.readAllBytes(p), StandardCharsets.UTF_8)), "tokenizer.json"));
    }

    public int vocabSize() { return idToToken.length; }

    public Integer tokenId(String token) {
        Integer a = addedIds.get(token);
        return a != null ? a : vocab.get(token);
    }

    public String idToToken(int id) { return id >= 0 && id < idToToken.length ? idToToken[id] : null; }

    public boolean isSpecial(int id) { return Boolean.TRUE.equals(addedSpecial.get(id)); }

    /** Token ids of {@code text}, special tokens recognised in the text, post-processor ids added. */
    public long[] encode(String text) {
        return encode(text, true);
    }

    /** {@code addSpecial}: add the post-processor's ids (HF's {@code add_special_tokens}). */
    public long[] encode(String text, boolean addSpecial) {
        List<Long> out = new ArrayList<>();
        if (addSpecial) for (long x : prefixIds) out.add(x);
        int start = 0, i = 0;
        while (i < text.length()) {
            String hit = null;
            for (String a : added) if (text.startsWith(a, i)) { hit = a; break; }
            if (hit == null) { i++; continue; }
            if (i > start) encodePlain(text.substring(start, i), out);
            out.add((long) addedIds.get(hit));
            i += hit.length();
            start = i;
        }
        if (start < text.length()) encodePlain(text.substring(start), out);
        if (addSpecial) for (long x : suffixIds) out.add(x);
        long[] r = new long[out.size()];
        for (int k = 0; k < r.length; k++) r[k] = out.get(k);
        return r;
    }

    private void encodePlain(String text, List<Long> out) {
        if (addPrefixSpace && !text.startsWith(" ")) text = " " + text;
        List<String> pieces = new ArrayList<>();
        if (split == null) pieces.add(text);
        else {
            Matcher m = split.matcher(text);
            int last = 0;
            while (m.find()) {
                if (m.start() > last) pieces.add(text.substring(last, m.start())); // Isolated: gaps stay pieces
                if (m.end() > m.start()) pieces.add(m.group());
                last = m.end();
            }
            if (last < text.length()) pieces.add(text.substring(last));
        }
        for (String piece : pieces) {
            byte[] bytes = piece.getBytes(StandardCharsets.UTF_8);
            StringBuilder w = new StringBuilder(bytes.length);
            for (byte b : bytes) w.append(BYTE_CHAR[b & 0xff]);
            for (long id : word(w.toString())) out.add(id);
        }
    }

    /** BPE of one byte-mapped word. */
    long[] word(String w) {
        long[] hit = cache.get(w);
        if (hit != null) return hit;
        if (ignoreMerges && vocab.containsKey(w)) {
            long[] r = {vocab.get(w)};
            cache.put(w, r);
            return r;
        }
        List<String> sym = new ArrayList<>(w.length());
        for (int k = 0; k < w.length(); ) {
            int cp = w.codePointAt(k);
            int n = Character.charCount(cp);
            sym.add(w.substring(k, k + n));
            k += n;
        }
        while (sym.size() > 1) {
            int best = -1, bestRank = Integer.MAX_VALUE;
            for (int k = 0; k + 1 < sym.size(); k++) {
                int[] mr = merges.get(sym.get(k) + '\0' + sym.get(k + 1));
                if (mr != null && mr[0] < bestRank) { bestRank = mr[0]; best = k; }
            }
            if (best < 0) break;
            sym.set(best, sym.get(best) + sym.get(best + 1));
            sym.remove(best + 1);
        }
        List<Long> ids = new ArrayList<>();
        for (String s : sym) {
            Integer id = vocab.get(s);
            if (id == null) throw new IllegalArgumentException("tokenizer: symbol '" + s + "' is not in the vocab (no unk)");
            ids.add((long) id);
        }
        long[] r = new long[ids.size()];
        for (int k = 0; k < r.length; k++) r[k] = ids.get(k);
        if (cache.size() < 100_000) cache.put(w, r);
        return r;
    }

    /** The bytes of token {@code id} (the ByteLevel decoder; a token with a char outside the alphabet: its UTF-8). */
    public byte[] tokenBytes(int id) {
        String t = idToToken(id);
        if (t == null) throw new IllegalArgumentException("token id " + id + " outside the vocabulary");
        byte[] out = new byte[t.length()];
        for (int k = 0; k < t.length(); k++) {
            Integer b = CHAR_BYTE.get(t.charAt(k));
            if (b == null) return t.getBytes(StandardCharsets.UTF_8);
            out[k] = (byte) (int) b;
        }
        return out;
    }

    public String decode(long[] ids, boolean skipSpecial) {
        ByteArrayOutputStream b = new ByteArrayOutputStream();
        for (long id : ids) {
            if (skipSpecial && isSpecial((int) id)) continue;
            { byte[] tb_ = tokenBytes((int) id); b.write(tb_, 0, tb_.length); }
        }
        return utf8Lossy(b.toByteArray(), 0, b.size());
    }

    public String decode(long[] ids) {
        return decode(ids, true);
    }

    /**
     * Length of the UTF-8 sequence (or maximal invalid subpart) starting at {@code i}; {@code state[0]}:
     * 0 valid, 1 invalid, 2 truncated by {@code end} (a proper prefix of a valid sequence).
     */
    private static int seqLen(byte[] a, int i, int end, int[] state) {
        int b0 = a[i] & 0xff;
        state[0] = 1;
        if (b0 < 0x80) { state[0] = 0; return 1; }
        int need, lo = 0x80, hi = 0xBF;
        if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
        else if (b0 == 0xE0) { need = 2; lo = 0xA0; }
        else if (b0 >= 0xE1 && b0 <= 0xEC || b0 == 0xEE || b0 == 0xEF) need = 2;
        else if (b0 == 0xED) { need = 2; hi = 0x9F; }
        else if (b0 == 0xF0) { need = 3; lo = 0x90; }
        else if (b0 >= 0xF1 && b0 <= 0xF3) need = 3;
        else if (b0 == 0xF4) { need = 3; hi = 0x8F; }
        else return 1; // invalid lead byte
        for (int k = 1; k <= need; k++) {
            if (i + k >= end) { state[0] = 2; return k; }
            int c = a[i + k] & 0xff;
            if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return k;
        }
        state[0] = 0;
        return need + 1;
    }

    /** UTF-8 → String, one U+FFFD per maximal invalid subpart (as Rust's from_utf8_lossy). */
    public static String utf8Lossy(byte[] a, int from, int to) {
        StringBuilder s = new StringBuilder(to - from);
        int[] state = new int[1];
        int i = from;
        while (i < to) {
            int n = seqLen(a, i, to, state);
            if (state[0] == 0) s.append(new String(a, i, n, StandardCharsets.UTF_8));
            else s.append('\uFFFD');
            i += n;
        }
        return s.toString();
    }

    /** Streams text as tokens arrive: emits complete UTF-8 characters, holds back an unfinished one. */
    public final class StreamDecoder {
        private final ByteArrayOutputStream pending = new ByteArrayOutputStream();
        private final boolean skipSpecial;

        public StreamDecoder(boolean skipSpecial) {
            this.skipSpecial = skipSpecial;
        }

        public String push(long id) {
            if (skipSpecial && isSpecial((int) id)) return "";
            { byte[] tb_ = tokenBytes((int) id); pending.write(tb_, 0, tb_.length); }
            byte[] a = pending.toByteArray();
            int cut = a.length;
            int[] state = new int[1];
            for (int i = 0; i < a.length; ) {
                int n = seqLen(a, i, a.length, state);
                if (state[0] == 2) cut = i; // hold back an unfinished character
                i += n;
            }
            String out = utf8Lossy(a, 0, cut);
            pending.reset();
            pending.write(a, cut, a.length - cut);
            return out;
        }

        public String flush() {
            byte[] a = pending.toByteArray();
            pending.reset();
            return utf8Lossy(a, 0, a.length);
        }
    }

    public List<String> addedTokens() { return Collections.unmodifiableList(added); }
}
