package ai.dipdeploy.engine;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small strict JSON reader (RFC 8259), enough for manifest.json, tokenizer.json and the golden vectors.
 *
 * <p>Values map to: object → {@code LinkedHashMap<String,Object>} (key order kept), array →
 * {@code ArrayList<Object>}, string → {@code String}, true/false → {@code Boolean}, null → {@code null},
 * numbers → {@code Long} when integral and in range, {@code BigInteger} when integral and larger,
 * {@code Double} otherwise (Double.parseDouble is correctly rounded, so Python's shortest repr of a float
 * round-trips bit-exactly). No external library: org.json is not in the ORT AAR and the engine must run on
 * the plain JVM.
 */
public final class Json {
    private final String s;
    private int i;

    private Json(String s) {
        this.s = s;
    }

    /** Parses one JSON document; throws {@link IllegalArgumentException} with the position on error. */
    public static Object parse(String text) {
        Json p = new Json(text);
        p.ws();
        Object v = p.value();
        p.ws();
        if (p.i != p.s.length()) throw p.error("trailing characters after the JSON value");
        return v;
    }

    private IllegalArgumentException error(String what) {
        return new IllegalArgumentException("JSON: " + what + " at offset " + i);
    }

    private void ws() {
        while (i < s.length()) {
            char c = s.charAt(i);
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') i++;
            else break;
        }
    }

    private Object value() {
        if (i >= s.length()) throw error("unexpected end of input");
        char c = s.charAt(i);
        switch (c) {
            case '{': return object();
            case '[': return array();
            case '"': return string();
            case 't': literal("true"); return Boolean.TRUE;
            case 'f': literal("false"); return Boolean.FALSE;
            case 'n': literal("null"); return null;
            default:
                if (c == '-' || (c >= '0' && c <= '9')) return number();
                // Python's json writes NaN/Infinity unless allow_nan=False; accept them the same way.
                if (s.startsWith("NaN", i)) { i += 3; return Double.NaN; }
                if (s.startsWith("Infinity", i)) { i += 8; return Double.POSITIVE_INFINITY; }
                throw error("unexpected character '" + c + "'");
        }
    }

    private void literal(String word) {
        if (!s.startsWith(word, i)) throw error("expected " + word);
        i += word.length();
    }

    private Map<String, Object> object() {
        Map<String, Object> m = new LinkedHashMap<>();
        i++;
        ws();
        if (i < s.length() && s.charAt(i) == '}') { i++; return m; }
        while (true) {
            ws();
            if (i >= s.length() || s.charAt(i) != '"') throw error("expected a string key");
            String k = string();
            ws();
            if (i >= s.length() || s.charAt(i) != ':') throw error("expected ':'");
            i++;
            ws();
            m.put(k, value());
            ws();
            if (i >= s.length()) throw error("unterminated object");
            char c = s.charAt(i++);
            if (c == '}') return m;
            if (c != ',') throw error("expected ',' or '}'");
        }
    }

    private List<Object> array() {
        List<Object> a = new ArrayList<>();
        i++;
        ws();
        if (i < s.length() && s.charAt(i) == ']') { i++; return a; }
        while (true) {
            ws();
            a.add(value());
            ws();
            if (i >= s.length()) throw error("unterminated array");
            char c = s.charAt(i++);
            if (c == ']') return a;
            if (c != ',') throw error("expected ',' or ']'");
        }
    }

    private String string() {
        i++; // opening quote
        StringBuilder b = null;
        int start = i;
        while (true) {
            if (i >= s.length()) throw error("unterminated string");
            char c = s.charAt(i);
            if (c == '"') {
                String out = b == null ? s.substring(start, i) : b.append(s, start, i).toString();
                i++;
                return out;
            }
            if (c == '\\') {
                if (b == null) b = new StringBuilder();
                b.append(s, start, i);
                i++;
                if (i >= s.length()) throw error("unterminated escape");
                char e = s.charAt(i++);
                switch (e) {
                    case '"': b.append('"'); break;
                    case '\\': b.append('\\'); break;
                    case '/': b.append('/'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'n': b.append('\n'); break;
                    case 'r': b.append('\r'); break;
                    case 't': b.append('\t'); break;
                    case 'u':
                        if (i + 4 > s.length()) throw error("short \\u escape");
                        try {
                            b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        } catch (NumberFormatException ex) {
                            throw error("bad \\u escape");
                        }
                        i += 4;
                        break;
                    default: throw error("bad escape \\" + e);
                }
                start = i;
            } else {
                if (c < 0x20) throw error("control character in string");
                i++;
            }
        }
    }

    private Object number() {
        int start = i;
        if (s.charAt(i) == '-') i++;
        boolean integral = true;
        while (i < s.length()) {
            char c = s.charAt(i);
            if (c >= '0' && c <= '9') i++;
            else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') { integral = false; i++; }
            else break;
        }
        String t = s.substring(start, i);
        if (t.equals("-") ) {
            if (s.startsWith("Infinity", i)) { i += 8; return Double.NEGATIVE_INFINITY; }
            throw error("bad number");
        }
        try {
            if (integral) {
                if (t.length() < 19) return Long.parseLong(t);
                BigInteger big = new BigInteger(t);
                return big.bitLength() < 64 ? (Object) big.longValue() : big;
            }
            return Double.parseDouble(t);
        } catch (NumberFormatException ex) {
            throw error("bad number '" + t + "'");
        }
    }

    // ---- typed accessors (errors name the key) ----

    @SuppressWarnings("unchecked")
    public static Map<String, Object> obj(Object o, String what) {
        if (!(o instanceof Map)) throw new IllegalArgumentException(what + ": expected a JSON object, got " + kind(o));
        return (Map<String, Object>) o;
    }

    @SuppressWarnings("unchecked")
    public static List<Object> arr(Object o, String what) {
        if (!(o instanceof List)) throw new IllegalArgumentException(what + ": expected a JSON array, got " + kind(o));
        return (List<Object>) o;
    }

    public static long lng(Object o, String what) {
        if (o instanceof Long) return (Long) o;
        throw new IllegalArgumentException(what + ": expected an integer, got " + kind(o));
    }

    public static double dbl(Object o, String what) {
        if (o instanceof Number && !(o instanceof BigInteger)) return ((Number) o).doubleValue();
        if (o instanceof BigInteger) return ((BigInteger) o).doubleValue();
        throw new IllegalArgumentException(what + ": expected a number, got " + kind(o));
    }

    public static String str(Object o, String what) {
        if (o instanceof String) return (String) o;
        throw new IllegalArgumentException(what + ": expected a string, got " + kind(o));
    }

    public static boolean bool(Object o, String what) {
        if (o instanceof Boolean) return (Boolean) o;
        throw new IllegalArgumentException(what + ": expected true/false, got " + kind(o));
    }

    public static long[] longs(Object o, String what) {
        List<Object> a = arr(o, what);
        long[] out = new long[a.size()];
        for (int k = 0; k < out.length; k++) out[k] = lng(a.get(k), what + "[" + k + "]");
        return out;
    }

    public static int[] ints(Object o, String what) {
        long[] l = longs(o, what);
        int[] out = new int[l.length];
        for (int k = 0; k < l.length; k++) out[k] = Math.toIntExact(l[k]);
        return out;
    }

    static String kind(Object o) {
        if (o == null) return "null";
        if (o instanceof Map) return "an object";
        if (o instanceof List) return "an array";
        if (o instanceof String) return "a string";
        if (o instanceof Boolean) return "a boolean";
        return "a number";
    }
}
