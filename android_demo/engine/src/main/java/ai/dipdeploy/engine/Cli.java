package ai.dipdeploy.engine;

import java.nio.file.Paths;

/**
 * Command-line front end of {@link Engine}, for a desktop JVM with the ORT Java package
 * ({@code com.microsoft.onnxruntime:onnxruntime:1.29.0}, same API as the Android AAR) or a device shell:
 *
 * <pre>
 *   java -cp engine-classes:onnxruntime-1.29.0.jar ai.dipdeploy.engine.Cli BUNDLE "prompt"
 *        [--tokens N] [--policy lfu|lru|none] [--cache-frac F] [--cache-split reads|even] [--threads T] [--native libdipdeploy_ops.so]
 *        [--temperature T] [--top-p P] [--seed S]
 * </pre>
 *
 * Options left out take {@link Defaults} (Python's, as {@code dipdeploy run}), the cache options the bundle's.
 * Prints the generated text as it streams, then the token ids and the stats line.
 */
public final class Cli {
    private Cli() {}

    /** Bad input (options, a bundle or tokenizer.json the engine refuses): one line on stderr, exit status 2. */
    public static void main(String[] args) throws Exception {
        try {
            run(args);
        } catch (IllegalArgumentException e) {
            System.err.println("error: " + e.getMessage());
            System.exit(2);
        }
    }

    private static void run(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: Cli BUNDLE PROMPT [--tokens N] [--policy P] [--cache-frac F] [--cache-split S] [--threads T] "
                    + "[--native LIB] [--temperature T] [--top-p P] [--seed S]");
            System.exit(2);
        }
        Engine.Options opt = new Engine.Options();
        int tokens = Defaults.MAX_NEW_TOKENS;
        float temperature = Defaults.TEMPERATURE, topP = Defaults.TOP_P;
        long seed = Defaults.SEED;
        for (int k = 2; k < args.length; k += 2) {
            if (k + 1 >= args.length) throw new IllegalArgumentException(args[k] + " needs a value");
            String v = args[k + 1];
            switch (args[k]) {
                case "--tokens": tokens = Integer.parseInt(v); break;
                case "--policy": opt.policy = v; break;
                case "--cache-frac": opt.cacheFrac = Double.parseDouble(v); break;
                case "--cache-split": opt.cacheSplit = v; break;
                case "--threads": opt.threads = Integer.parseInt(v); break;
                case "--native": opt.nativeLibraryPath = v; break;
                case "--temperature": temperature = Float.parseFloat(v); break;
                case "--top-p": topP = Float.parseFloat(v); break;
                case "--seed": seed = Long.parseLong(v); break;
                default: throw new IllegalArgumentException("unknown option " + args[k]);
            }
        }
        try (Engine e = new Engine(Paths.get(args[0]), opt)) {
            System.err.println("ops: " + (e.nativeOps ? "native library" : "stock ORT fallback functions"
                    + (e.nativeError != null ? " (" + e.nativeError + ")" : "")));
            System.out.print(args[1]);
            long[] ids = e.generate(args[1], tokens, new Sampler(temperature, topP, seed), new Engine.Listener() {
                @Override
                public void onText(String delta) {
                    System.out.print(delta);
                    System.out.flush();
                }
            });
            System.out.println();
            System.out.println("ids " + java.util.Arrays.toString(ids));
            System.out.println(e.stats);
        }
    }
}
