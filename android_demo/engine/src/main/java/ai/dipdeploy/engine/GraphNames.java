package ai.dipdeploy.engine;

import java.util.ArrayList;
import java.util.List;

/**
 * File and I/O names of a bundle's per-layer graphs (dipdeploy/export/DESIGN.md, "Graphs and names";
 * {@code dipdeploy/export/layers.py}). Pure: the tests hold it against the names in the exported ONNX files.
 */
public final class GraphNames {
    private GraphNames() {}

    public static final String EMBED = "embed.onnx", POSITIONS = "positions.onnx", HEAD = "head.onnx";

    /** The graphs beside the layers' own, in the order the manifest lists them after the layers. */
    public static final List<String> EDGE_GRAPHS = java.util.Arrays.asList(EMBED, POSITIONS, HEAD);

    public static String attnFile(int i) { return "layer." + i + ".attn.onnx"; }
    public static String mlpUpFile(int i) { return "layer." + i + ".mlp_up.onnx"; }
    public static String mlpDownFile(int i) { return "layer." + i + ".mlp_down.onnx"; }

    public static String pastKey(int i) { return "past_key_values." + i + ".key"; }
    public static String pastValue(int i) { return "past_key_values." + i + ".value"; }
    public static String presentKey(int i) { return "present." + i + ".key"; }
    public static String presentValue(int i) { return "present." + i + ".value"; }

    public static List<String> embedInputs() { return java.util.Arrays.asList("input_ids"); }
    public static List<String> embedOutputs() { return java.util.Arrays.asList("hidden"); }
    public static List<String> headInputs() { return java.util.Arrays.asList("hidden", "mlp_out"); }

    /** What positions.onnx computes the attention's per-token values from (its outputs: {@link #attnInputs}). */
    public static List<String> positionsInputs() { return java.util.Arrays.asList("attention_mask", "position_ids"); }
    public static List<String> headOutputs() { return java.util.Arrays.asList("logits"); }

    /**
     * {@code perToken}: the positions.onnx outputs layer i's attention takes (the RoPE rows and the mask bias,
     * or GroupQueryAttention's lengths, of its layer type); layer 0 has no previous MLP output to add.
     */
    public static List<String> attnInputs(int i, List<String> perToken) {
        List<String> l = new ArrayList<>(java.util.Arrays.asList("hidden"));
        if (i > 0) l.add("mlp_out");
        l.addAll(perToken);
        l.addAll(java.util.Arrays.asList(pastKey(i), pastValue(i), "cache_in"));
        return l;
    }

    public static List<String> attnOutputs(int i) {
        return java.util.Arrays.asList("hidden_attn", "x", "in_indices", presentKey(i), presentValue(i));
    }

    /** {@code arrays}: the group's graph input names, e.g. up_gate.qweight, up_gate.scales. */
    public static List<String> mlpUpInputs(List<String> arrays) {
        List<String> l = new ArrayList<>(java.util.Arrays.asList("x", "in_indices", "in_slots"));
        l.addAll(arrays);
        l.add("cache_glu");
        return l;
    }

    public static List<String> mlpUpOutputs() { return java.util.Arrays.asList("glu", "glu_indices"); }

    public static List<String> mlpDownInputs(List<String> arrays) {
        List<String> l = new ArrayList<>(java.util.Arrays.asList("glu", "glu_indices", "glu_slots"));
        l.addAll(arrays);
        l.add("hidden_attn");
        return l;
    }

    public static List<String> mlpDownOutputs() { return java.util.Arrays.asList("mlp_out"); }
}
