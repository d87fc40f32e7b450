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
 * A BPE tokenizer read from a Hugging Face {@code tokenizer.json}, of one of two families, chosen from the file's
 * decoder and checked against its normalizer, pre-tokenizer and model:
 *
 * <ul>
 *   <li><b>byte-level</b> (GPT-2 style: SmolLM2, Llama 3, Qwen, the tiny test models): decoder ByteLevel,
 *       normalizer null, pre_tokenizer ByteLevel or a Sequence of Split(regex, Isolated) and
 *       ByteLevel(use_regex=false) (GPT-2 regex, Unicode classes); bytes mapped to GPT-2's printable alphabet;
 *       decoding maps it back and decodes UTF-8 lossily, one U+FFFD per maximal invalid subpart (Rust's
 *       {@code String::from_utf8_lossy}).</li>
 *   <li><b>SentencePiece-style</b> (Gemma, Llama 2, Mistral, Phi-3): decoder a Sequence of Replace, ByteFallback,
 *       Fuse, Strip, or Metaspace; normalizer null, Replace (literal), Prepend or a Sequence of them;
 *       pre_tokenizer null or Metaspace; BPE over the normalized text's characters with {@code byte_fallback}
 *       ({@code <0xNN>} tokens) and {@code unk_token}/{@code fuse_unk} ({@link SentencePiece}).</li>
 * </ul>
 *
 * <p>Both: added/special tokens split out first (leftmost-longest; {@code normalized: false} ones in the raw
 * text, then {@code normalized: true} ones in each normalized piece, as the crate's added vocabulary does), BPE
 * merges by rank (lowest rank first, leftmost on ties — the order of the {@code tokenizers} crate's priority
 * queue), model BPE (vocab, merges as "a b" strings or [a, b] pairs, ignore_merges, no dropout, no subword
 * prefix/suffix), post_processor TemplateProcessing (single) or ByteLevel; added tokens' {@code lstrip},
 * {@code rstrip} (Phi-3's chat markers) and {@code single_word}. Anything else — another component or a mix of
 * the two families — is refused with the component named, never encoded differently from the library
 * (android_demo/README.md).
 */
public final class Bpe {
    /** The tokenizer family, read from tokenizer.json (see the class comment). */
    public enum Family { BYTE_LEVEL, SENTENCEPIECE }

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

    private final Family family;
    private final Map<String, Integer> vocab;
    private final String[] idToToken;
    private final Map<Long, int[]> merges = new HashMap<>(); // (a id << 32 | b id) → {rank, merged id}
    private final boolean ignoreMerges;
    private final boolean byteFallback;
    private final int[] byteIds = new int[256]; // ids of <0x00>…<0xFF>, -1 where absent
    private final Integer unkId;
    private final boolean fuseUnk;
    private final List<String> added = new ArrayList<>(); // longest first
    private final AddedTokens rawAdded = new AddedTokens(), normalizedAdded = new AddedTokens();
    private final Map<String, Integer> addedIds = new HashMap<>();
    private final Map<Integer, Boolean> addedSpecial = new HashMap<>();
    private final Pattern split;          // byte-level: null = no regex split
    private final boolean addPrefixSpace; // byte-level
    private final SentencePiece.Normalizer normalizer; // SentencePiece-style, null = none
    private final SentencePiece.Metaspace metaspace;   // SentencePiece-style, null = no pre-tokenizer
    private final SentencePiece.Decoder spDecoder;     // SentencePiece-style
    private final long[] prefixIds, suffixIds;
    private final Map<String, long[]> cache = new HashMap<>();

    static IllegalArgumentException unsupported(String what) {
        return new IllegalArgumentException("tokenizer.json: " + what + " is not supported by the Android engine's "
                + "tokenizer, which implements byte-level BPE (GPT-2, Llama 3, Qwen) and SentencePiece-style BPE (Gemma, "
                + "Llama 2, Mistral); run this bundle with `dipdeploy run` on a desktop instead (android_demo/README.md)");
    }

    @SuppressWarnings("unchecked")
    public Bpe(Map<String, Object> tj) {
        for (String f : new String[] {"truncation", "padding"}) // the library would cut or pad every encoding
            if (tj.get(f) != null) throw unsupported(f + " (it must be null)");
        Map<String, Object> model = Json.obj(tj.get("model"), "model");
        if (!"BPE".equals(model.get("type"))) throw unsupported("model " + model.get("type") + " (only BPE)");
        for (String f : new String[] {"continuing_subword_prefix", "end_of_word_suffix"}) {
            Object v = model.get(f);
            if (v != null && !"".equals(v)) throw unsupported("model." + f);
        }
        if (model.get("dropout") != null) throw unsupported("BPE dropout");
        ignoreMerges = Boolean.TRUE.equals(model.get("ignore_merges"));
        byteFallback = Boolean.TRUE.equals(model.get("byte_fallback"));
        fuseUnk = Boolean.TRUE.equals(model.get("fuse_unk"));
        Map<String, Object> v = Json.obj(model.get("vocab"), "model.vocab");
        vocab = new HashMap<>(v.size() * 2);
        int maxId = -1;
        for (Map.Entry<String, Object> e : v.entrySet()) {
            int id = Math.toIntExact(Json.lng(e.getValue(), "model.vocab"));
            vocab.put(e.getKey(), id);
            maxId = Math.max(maxId, id);
        }
        Object unk = model.get("unk_token");
        unkId = unk == null ? null : vocab.get(Json.str(unk, "model.unk_token"));
        if (unk != null && unkId == null) throw new IllegalArgumentException("tokenizer.json: model.unk_token " + unk + " is not in the vocab");
        for (int b = 0; b < 256; b++) {
            Integer id = vocab.get(String.format("<0x%02X>", b));
            byteIds[b] = id == null ? -1 : id;
        }
        List<Object> addedList = tj.get("added_tokens") == null ? Collections.emptyList() : Json.arr(tj.get("added_tokens"), "added_tokens");
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
            Integer id = vocab.get(a + b), ia = vocab.get(a), ib = vocab.get(b);
            if (id == null || ia == null || ib == null)
                throw new IllegalArgumentException("tokenizer.json: merge " + a + " " + b + " uses or makes a token not in the vocab");
            merges.putIfAbsent(pair(ia, ib), new int[] {rank, id});
        }
        List<Map<String, Object>> normalizedList = new ArrayList<>();
        for (Object o : addedList) {
            Map<String, Object> t = Json.obj(o, "added_tokens[]");
            String content = Json.str(t.get("content"), "content");
            int id = Math.toIntExact(Json.lng(t.get("id"), "id"));
            boolean special = Boolean.TRUE.equals(t.get("special"));
            Object norm = t.get("normalized"); // absent: the crate's default, normalized unless special
            boolean normalized = norm == null ? !special : Json.bool(norm, "added_tokens[].normalized");
            if (normalized) normalizedList.add(t);
            else rawAdded.add(content, id, t);
            added.add(content);
            addedIds.put(content, id);
            addedSpecial.put(id, special);
            idToToken[id] = content;
        }
        added.sort((x, y) -> Integer.compare(y.length(), x.length()));
        // the family, from the decoder; the normalizer and pre-tokenizer must belong to it
        Object dec = tj.get("decoder");
        if (dec == null) throw unsupported("decoder null");
        Map<String, Object> decoder = Json.obj(dec, "decoder");
        Object norm = tj.get("normalizer");
        Map<String, Object> pre = tj.get("pre_tokenizer") == null ? null : Json.obj(tj.get("pre_tokenizer"), "pre_tokenizer");
        Pattern sp = null;
        boolean aps = false;
        if ("ByteLevel".equals(decoder.get("type"))) {
            family = Family.BYTE_LEVEL;
            if (norm != null) throw unsupported("normalizer " + Json.obj(norm, "normalizer").get("type") + " with a ByteLevel decoder");
            if (pre == null) throw unsupported("pre_tokenizer null with a ByteLevel decoder (it needs a ByteLevel pre_tokenizer)");
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
                        if (sp != null) throw unsupported("two regex splits in the pre_tokenizer");
                        sp = Pattern.compile(GPT2_REGEX, Pattern.UNICODE_CHARACTER_CLASS);
                    }
                } else if (type.equals("Split") && "Isolated".equals(s.get("behavior")) && !Boolean.TRUE.equals(s.get("invert"))) {
                    Map<String, Object> pat = Json.obj(s.get("pattern"), "Split.pattern");
                    if (sp != null) throw unsupported("two regex splits in the pre_tokenizer");
                    if (pat.containsKey("Regex")) sp = Pattern.compile(Json.str(pat.get("Regex"), "Regex"), Pattern.UNICODE_CHARACTER_CLASS);
                    else sp = Pattern.compile(Pattern.quote(Json.str(pat.get("String"), "String")));
                } else {
                    throw unsupported("pre_tokenizer " + type + " with a ByteLevel decoder");
                }
            }
            if (!byteLevel) throw unsupported("a pre_tokenizer without ByteLevel with a ByteLevel decoder");
            normalizer = null;
            metaspace = null;
            spDecoder = null;
        } else {
            family = Family.SENTENCEPIECE;
            spDecoder = new SentencePiece.Decoder(decoder);
            normalizer = norm == null ? null : new SentencePiece.Normalizer(Json.obj(norm, "normalizer"));
            if (pre != null && !"Metaspace".equals(pre.get("type")))
                throw unsupported("pre_tokenizer " + pre.get("type") + " with a SentencePiece-style decoder (only null or Metaspace)");
            metaspace = pre == null ? null : new SentencePiece.Metaspace(pre);
        }
        split = sp;
        addPrefixSpace = aps;
        for (Map<String, Object> t : normalizedList) { // matched in the normalized text, so normalized themselves
            String content = (String) t.get("content"), normalized = normalizer == null ? content : normalizer.apply(content);
            int id = Math.toIntExact(Json.lng(t.get("id"), "id"));
            normalizedAdded.add(normalized, id, t);
            idToToken[id] = normalized; // the token string the decoder sees, as in the crate
        }
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
                throw unsupported("post_processor " + type);
            }
        }
        prefixIds = pre_.stream().mapToLong(Long::longValue).toArray();
        suffixIds = post.stream().mapToLong(Long::longValue).toArray();
    }

    private static long pair(int a, int b) {
        return ((long) a << 32) | (b & 0xffffffffL);
    }

    public static Bpe fromFile(Path p) throws IOException {
        return fromBytes(Files.readAllBytes(p));
    }

    /** The tokenizer of a {@code tokenizer.json}'s bytes (the engine passes those its checks read and hashed). */
    public static Bpe fromBytes(byte[] json) {
        return new Bpe(Json.obj(Json.parse(new String(json, StandardCharsets.UTF_8)), "tokenizer.json"));
    }

    public int vocabSize() { return idToToken.length; }

    public Integer tokenId(String token) {
        Integer a = addedIds.get(token);
        return a != null ? a : vocab.get(token);
    }

    public String idToToken(int id) { return id >= 0 && id < idToToken.length ? idToToken[id] : null; }

    public boolean isSpecial(int id) { return Boolean.TRUE.equals(addedSpecial.get(id)); }

    public Family family() { return family; }

    /** Token ids of {@code text}, special tokens recognised in the text, post-processor ids added. */
    public long[] encode(String text) {
        return encode(text, true);
    }

    /** {@code addSpecial}: add the post-processor's ids (HF's {@code add_special_tokens}). */
    public long[] encode(String text, boolean addSpecial) {
        List<Long> out = new ArrayList<>();
        if (addSpecial) for (long x : prefixIds) out.add(x);
        int start = 0;
        for (int[] m : rawAdded.matches(text)) {
            if (m[0] > start) encodePiece(text.substring(start, m[0]), start == 0, out);
            out.add((long) m[2]);
            start = m[1];
        }
        encodePiece(text.substring(start), start == 0, out);
        if (addSpecial) for (long x : suffixIds) out.add(x);
        long[] r = new long[out.size()];
        for (int k = 0; k < r.length; k++) r[k] = out.get(k);
        return r;
    }

    /** One piece between raw added tokens: normalized, then split on the normalized added tokens. */
    private void encodePiece(String raw, boolean atStart, List<Long> out) {
        if (raw.isEmpty()) return;
        String text = normalizer == null ? raw : normalizer.apply(raw);
        int start = 0;
        for (int[] m : normalizedAdded.matches(text)) {
            if (m[0] > start) encodeWords(text.substring(start, m[0]), atStart && start == 0, out);
            out.add((long) m[2]);
            start = m[1];
        }
        encodeWords(text.substring(start), atStart && start == 0, out);
    }

    /** Pre-tokenizer and BPE of one piece; {@code atStart}: it begins at offset 0 of the text (Metaspace "first"). */
    private void encodeWords(String text, boolean atStart, List<Long> out) {
        if (text.isEmpty()) return;
        if (family == Family.SENTENCEPIECE) {
            List<String> words = metaspace == null ? Collections.singletonList(text) : metaspace.apply(text, atStart);
            for (String w : words) if (!w.isEmpty()) for (long id : word(w)) out.add(id);
            return;
        }
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

    /**
     * BPE of one word, as the crate's {@code merge_word}: each character its vocab id, else its UTF-8 bytes as
     * {@code <0xNN>} tokens (byte_fallback, when all of them exist), else the unk token (consecutive unknowns
     * fused into one with fuse_unk; a pending unk is placed at the next in-vocab character, after any
     * byte-fallback tokens in between, as the crate does); then merges by rank.
     */
    long[] word(String w) {
        long[] hit = cache.get(w);
        if (hit != null) return hit;
        if (ignoreMerges && vocab.containsKey(w)) {
            long[] r = {vocab.get(w)};
            cache.put(w, r);
            return r;
        }
        List<Integer> sym = new ArrayList<>(w.length());
        boolean pendingUnk = false;
        for (int k = 0; k < w.length(); ) {
            int n = Character.charCount(w.codePointAt(k));
            String c = w.substring(k, k + n);
            k += n;
            Integer id = vocab.get(c);
            if (id != null) {
                if (pendingUnk) sym.add(unkId);
                pendingUnk = false;
                sym.add(id);
                continue;
            }
            if (byteFallback) {
                byte[] bytes = c.getBytes(StandardCharsets.UTF_8);
                boolean all = true;
                for (byte b : bytes) all &= byteIds[b & 0xff] >= 0;
                if (all) {
                    for (byte b : bytes) sym.add(byteIds[b & 0xff]);
                    continue;
                }
            }
            if (unkId == null)
                throw new IllegalArgumentException("tokenizer: '" + c + "' is not in the vocab and tokenizer.json has no unk_token");
            if (pendingUnk && !fuseUnk) sym.add(unkId);
            pendingUnk = true;
        }
        if (pendingUnk) sym.add(unkId);
        long[] r = mergeAll(sym);
        if (w.length() <= CACHED_WORD_CHARS && cache.size() < 100_000) cache.put(w, r);
        return r;
    }

    /** Longer words (a whole Gemma prompt is one word: no pre-tokenizer) are not cached. */
    private static final int CACHED_WORD_CHARS = 256;

    /**
     * Merges by rank, lowest first and leftmost on ties, with the crate's priority queue over a linked list of
     * symbols (n log n: a SentencePiece-style word can be a whole prompt); a queued pair is stale once either
     * side has been merged into something else.
     */
    private long[] mergeAll(List<Integer> sym) {
        int n = sym.size();
        int[] c = new int[n], prev = new int[n], next = new int[n];
        boolean[] gone = new boolean[n];
        for (int k = 0; k < n; k++) { c[k] = sym.get(k); prev[k] = k - 1; next[k] = k + 1 < n ? k + 1 : -1; }
        java.util.PriorityQueue<int[]> queue = new java.util.PriorityQueue<>( // {rank, pos, merged id}
                (x, y) -> x[0] != y[0] ? Integer.compare(x[0], y[0]) : Integer.compare(x[1], y[1]));
        for (int k = 0; k + 1 < n; k++) {
            int[] mr = merges.get(pair(c[k], c[k + 1]));
            if (mr != null) queue.add(new int[] {mr[0], k, mr[1]});
        }
        int left = n;
        while (!queue.isEmpty()) {
            int[] top = queue.poll();
            int pos = top[1], nx = next[pos];
            if (gone[pos] || nx < 0) continue;
            int[] mr = merges.get(pair(c[pos], c[nx]));
            if (mr == null || mr[1] != top[2]) continue;
            c[pos] = top[2];
            gone[nx] = true;
            left--;
            next[pos] = next[nx];
            if (next[nx] >= 0) prev[next[nx]] = pos;
            if (prev[pos] >= 0) {
                int[] m = merges.get(pair(c[prev[pos]], c[pos]));
                if (m != null) queue.add(new int[] {m[0], prev[pos], m[1]});
            }
            if (next[pos] >= 0) {
                int[] m = merges.get(pair(c[pos], c[next[pos]]));
                if (m != null) queue.add(new int[] {m[0], pos, m[1]});
            }
        }
        long[] r = new long[left];
        for (int k = 0, j = 0; k < n; k++) if (!gone[k]) r[j++] = c[k];
        return r;
    }

    /** The bytes of token {@code id} (the ByteLevel decoder; a token with a char outside the alphabet: its UTF-8). */
    public byte[] tokenBytes(int id) {
        String t = token(id);
        byte[] out = new byte[t.length()];
        for (int k = 0; k < t.length(); k++) {
            Integer b = CHAR_BYTE.get(t.charAt(k));
            if (b == null) return t.getBytes(StandardCharsets.UTF_8);
            out[k] = (byte) (int) b;
        }
        return out;
    }

    private String token(int id) {
        String t = idToToken(id);
        if (t == null) throw new IllegalArgumentException("token id " + id + " outside the vocabulary");
        return t;
    }

    /** The token strings the decoder sees: added tokens included, special ones left out with {@code skipSpecial}. */
    private List<String> tokens(long[] ids, boolean skipSpecial) {
        List<String> t = new ArrayList<>(ids.length);
        for (long id : ids) if (!(skipSpecial && isSpecial((int) id))) t.add(token((int) id));
        return t;
    }

    public String decode(long[] ids, boolean skipSpecial) {
        if (family == Family.SENTENCEPIECE) return spDecoder.decode(tokens(ids, skipSpecial));
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

    /**
     * Streams text as tokens arrive; the pieces joined are exactly {@link #decode(long[], boolean)} of the ids.
     * Byte-level: emits complete UTF-8 characters, holds back an unfinished one. SentencePiece-style: decodes the
     * sequence so far, less a trailing run of {@code <0xNN>} tokens (ByteFallback judges a run as a whole, so an
     * open run may still change), and emits what the text gained — each step decodes the whole sequence, which is
     * linear in its length and cheap beside a model step.
     */
    public final class StreamDecoder {
        private final ByteArrayOutputStream pending = new ByteArrayOutputStream();
        private final List<String> tokens = new ArrayList<>();
        private int emitted;
        private final boolean skipSpecial;

        public StreamDecoder(boolean skipSpecial) {
            this.skipSpecial = skipSpecial;
        }

        public String push(long id) {
            if (skipSpecial && isSpecial((int) id)) return "";
            if (family == Family.SENTENCEPIECE) {
                tokens.add(token((int) id));
                int cut = tokens.size();
                if (spDecoder.byteFallback())
                    while (cut > 0 && SentencePiece.fallbackByte(tokens.get(cut - 1)) >= 0) cut--;
                return emit(spDecoder.decode(tokens.subList(0, cut)));
            }
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

        private String emit(String text) {
            if (text.length() <= emitted) return "";
            String delta = text.substring(emitted);
            emitted = text.length();
            return delta;
        }

        public String flush() {
            if (family == Family.SENTENCEPIECE) {
                String out = emit(spDecoder.decode(tokens));
                tokens.clear();
                emitted = 0;
                return out;
            }
            byte[] a = pending.toByteArray();
            pending.reset();
            return utf8Lossy(a, 0, a.length);
        }
    }

    public List<String> addedTokens() { return Collections.unmodifiableList(added); }

    /**
     * Added tokens of one kind (raw or normalized), found as the crate's added vocabulary finds them: leftmost-
     * longest without overlap (its Aho-Corasick scan resumes after each match); a {@code single_word} token is
     * skipped where a word character (Unicode {@code \w}) touches it; {@code lstrip}/{@code rstrip} widen the
     * match over the whitespace (Unicode White_Space) before/after it, never back over an earlier match.
     */
    private static final class AddedTokens {
        private static final Pattern WORD = Pattern.compile("\\w", Pattern.UNICODE_CHARACTER_CLASS);
        private static final Pattern SPACE = Pattern.compile("\\s", Pattern.UNICODE_CHARACTER_CLASS);
        private final Map<Character, List<String>> byFirst = new HashMap<>(); // each list longest first
        private final Map<String, int[]> info = new HashMap<>(); // content → {id, single_word, lstrip, rstrip}

        void add(String content, int id, Map<String, Object> t) {
            if (content.isEmpty()) return;
            info.put(content, new int[] {id, flag(t, "single_word"), flag(t, "lstrip"), flag(t, "rstrip")});
            List<String> l = byFirst.computeIfAbsent(content.charAt(0), c -> new ArrayList<>());
            if (!l.contains(content)) l.add(content);
            l.sort((x, y) -> Integer.compare(y.length(), x.length()));
        }

        private static int flag(Map<String, Object> t, String name) {
            return t.get(name) != null && Json.bool(t.get(name), "added_tokens[]." + name) ? 1 : 0;
        }

        private static boolean is(Pattern p, int cp) {
            return p.matcher(new String(Character.toChars(cp))).matches();
        }

        /** {start, end, id} of each match in {@code text}, in order (an rstrip may reach past the next start). */
        List<int[]> matches(String text) {
            List<int[]> r = new ArrayList<>();
            if (byFirst.isEmpty()) return r;
            int taken = 0; // end of the last emitted match
            for (int i = 0; i < text.length(); ) {
                String hit = null;
                List<String> c = byFirst.get(text.charAt(i));
                if (c != null) for (String a : c) if (text.startsWith(a, i)) { hit = a; break; }
                if (hit == null) { i++; continue; }
                int[] f = info.get(hit);
                int start = i, stop = i + hit.length();
                i = stop;
                if (f[1] == 1 && (start > 0 && is(WORD, text.codePointBefore(start))
                        || stop < text.length() && is(WORD, text.codePointAt(stop)))) continue;
                if (f[2] == 1) {
                    int s = start;
                    while (s > 0 && is(SPACE, text.codePointBefore(s))) s -= Character.charCount(text.codePointBefore(s));
                    start = Math.max(s, taken);
                }
                if (f[3] == 1)
                    while (stop < text.length() && is(SPACE, text.codePointAt(stop))) stop += Character.charCount(text.codePointAt(stop));
                r.add(new int[] {start, stop, f[0]});
                taken = stop;
            }
            return r;
        }
    }
}
