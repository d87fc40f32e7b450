package ai.dipdeploy.engine;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;

/** Live numbers for the UI: tokens/s, cache hit rate, Flash MB/token, resident memory. */
public final class Stats {
    public long tokens;
    public long nanos;
    public long hits, misses;
    public long flashBytes, flashRequests;
    /** What the engine holds by design: slabs + dense weights file + KV cache (bytes). */
    public long residentEstimate;
    /** The process's resident set from /proc/self/status (VmRSS), -1 where unreadable. */
    public long rssBytes = -1;

    public double tokensPerSecond() { return nanos == 0 ? 0 : tokens * 1e9 / nanos; }
    public double hitRate() { return hits + misses == 0 ? 0 : (double) hits / (hits + misses); }
    public double flashMBPerToken() { return tokens == 0 ? 0 : flashBytes / 1e6 / tokens; }

    /** VmRSS of this process in bytes (Linux and Android), or -1. */
    public static long processRss() {
        Path p = Paths.get("/proc/self/status");
        try {
            for (String line : Files.readAllLines(p, StandardCharsets.UTF_8))
                if (line.startsWith("VmRSS:")) {
                    String[] f = line.substring(6).trim().split("\\s+");
                    return Long.parseLong(f[0]) * 1024L;
                }
        } catch (IOException | RuntimeException e) {
            return -1;
        }
        return -1;
    }

    @Override
    public String toString() {
        return String.format("%d tokens, %.2f tok/s, hit rate %.1f%%, Flash %.3f MB/token, resident %.1f MB (RSS %.1f MB)",
                tokens, tokensPerSecond(), 100 * hitRate(), flashMBPerToken(), residentEstimate / 1e6,
                rssBytes < 0 ? Double.NaN : rssBytes / 1e6);
    }
}
