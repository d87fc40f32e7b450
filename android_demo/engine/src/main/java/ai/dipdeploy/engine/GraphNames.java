package ai.dipdeploy.engine;

import java.util.ArrayList;
import java.util.List;

/**
 * File and I/O names of a bundle's per-layer graphs (dipdeploy/export/DESIGN.md, "Graphs and names";
 * {@code dipdeploy/export/layers.py}). Pure: the tests hold it against the names in the exported ONNX files.
 */
public final class GraphNames {
    private GraphNames() {}

    public static final String EMBED = "embed.onnx", HEAD = "head.onnx";

    public static String attnFile(int i) { return "layer." + i + ".attn.onnx"; }
    public static String mlpUpFile(int i) { return "layer." + i + ".mlp_up.onnx"; }
    public static String mlpDownFile(int i) { return "layer." + i + ".mlp_down.onnx"; }

    public static String pastKey(int i) { return "past_key_values." + i + ".key"; }
    public static String pastValue(int i) { return "past_key_values." + i + ".value"; }
    public static String presentKey(int i) { return "present." + i + ".key"; }
    public static String presentValue(int i) { return "present." + i + ".value"; }

    public static List<String> embedInputs() { return java.util.Arrays.asList("input_ids"); }
    public static List<String> embedOutputs() { return java.util.Arrays.asList("hidden"); }
    public static List<String> headInputs() { return java.util.Arrays.asList("hidden"); }
    public static List<String> headOutputs() { return java.util.Arrays.asList("logits"); }

    public static List<String> attnInputs(int i) {
        return java.util.Arrays.asList("hidden", "attention_mask", "position_ids", pastKey(i), pastValue(i), "cache_in");
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

    public static List<String> mlpDownOutputs() { return java.util.Arrays.asList("hidden"); }
}
