package ai.dipdeploy.demo;

import ai.dipdeploy.engine.Defaults;
import ai.dipdeploy.engine.Engine;
import ai.dipdeploy.engine.Sampler;
import ai.dipdeploy.engine.Stats;

import android.app.Activity;
import android.content.ContentResolver;
import android.content.Intent;
import android.database.Cursor;
import android.net.Uri;
import android.os.Bundle;
import android.provider.DocumentsContract;
import android.view.View;
import android.widget.ArrayAdapter;
import android.widget.Button;
import android.widget.EditText;
import android.widget.LinearLayout;
import android.widget.ScrollView;
import android.widget.Spinner;
import android.widget.TextView;

import java.io.File;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * The demo's only screen, kept thin on purpose (all logic is in the plain-Java engine): pick a bundle folder
 * in app storage (or import one through the system folder picker, which copies it there), type a prompt,
 * watch the text stream with tokens/s, cache hit rate, Flash MB/token and resident memory.
 *
 * <p>Bundles live in {@code getExternalFilesDir("bundles")/<name>/} (adb push needs no permission there) or
 * {@code getFilesDir()/bundles/<name>/} (imported). Not compiled on the development machine (no android.jar).
 */
public class MainActivity extends Activity {
    private static final int PICK_FOLDER = 1;

    private final ExecutorService worker = Executors.newSingleThreadExecutor();
    private final AtomicBoolean stop = new AtomicBoolean();
    private Spinner bundles;
    private EditText prompt;
    private TextView output, stats;
    private Button run;
    private Engine engine;
    private File engineDir;
    private boolean running; // UI thread only

    @Override
    protected void onCreate(Bundle state) {
        super.onCreate(state);
        LinearLayout root = new LinearLayout(this);
        root.setOrientation(LinearLayout.VERTICAL);
        root.setPadding(24, 24, 24, 24);
        bundles = new Spinner(this);
        Button importButton = new Button(this);
        importButton.setText("Import bundle folder…");
        importButton.setOnClickListener(v -> startActivityForResult(
                new Intent(Intent.ACTION_OPEN_DOCUMENT_TREE), PICK_FOLDER));
        prompt = new EditText(this);
        prompt.setHint("Prompt");
        prompt.setText("The capital of France is");
        run = new Button(this);
        run.setText("Generate");
        run.setOnClickListener(this::onRun);
        stats = new TextView(this);
        output = new TextView(this);
        output.setTextIsSelectable(true);
        ScrollView scroll = new ScrollView(this);
        scroll.addView(output);
        root.addView(bundles);
        root.addView(importButton);
        root.addView(prompt);
        root.addView(run);
        root.addView(stats);
        root.addView(scroll, new LinearLayout.LayoutParams(LinearLayout.LayoutParams.MATCH_PARENT, 0, 1f));
        setContentView(root);
        refreshBundles();
    }

    private List<File> bundleDirs() {
        List<File> out = new ArrayList<>();
        for (File base : new File[] {getExternalFilesDir("bundles"), new File(getFilesDir(), "bundles")}) {
            File[] kids = base == null ? null : base.listFiles();
            if (kids == null) continue;
            for (File k : kids) if (new File(k, "manifest.json").isFile()) out.add(k);
        }
        return out;
    }

    private void refreshBundles() {
        List<String> names = new ArrayList<>();
        for (File f : bundleDirs()) names.add(f.getName() + "  (" + f.getParentFile().getParent() + ")");
        if (names.isEmpty()) names.add("no bundle: adb push one to " + getExternalFilesDir("bundles"));
        bundles.setAdapter(new ArrayAdapter<>(this, android.R.layout.simple_spinner_dropdown_item, names));
    }

    private void onRun(View v) {
        if (running) {
            stop.set(true);
            return;
        }
        List<File> dirs = bundleDirs();
        int pick = bundles.getSelectedItemPosition();
        if (dirs.isEmpty() || pick < 0 || pick >= dirs.size()) return;
        File dir = dirs.get(pick);
        String text = prompt.getText().toString();
        output.setText(text);
        run.setText("Stop");
        running = true;
        stop.set(false);
        worker.execute(() -> generate(dir, text));
    }

    /** Worker thread: (re)open the engine for the chosen bundle, stream tokens to the UI. */
    private void generate(File dir, String text) {
        try {
            if (engine == null || !dir.equals(engineDir)) {
                if (engine != null) engine.close();
                Engine.Options opt = new Engine.Options();
                opt.threads = Math.max(1, Runtime.getRuntime().availableProcessors() / 2);
                opt.nativeLibraryPath = getApplicationInfo().nativeLibraryDir + "/libdipdeploy_ops.so";
                engine = new Engine(dir.toPath(), opt);
                engineDir = dir;
                String mode = engine.nativeOps ? "native kernels" : "stock ORT fallback functions"
                        + (engine.nativeError != null ? " (" + engine.nativeError + ")" : "");
                runOnUiThread(() -> stats.setText("loaded " + dir.getName() + ": " + mode));
            } else {
                engine.reset();
            }
            engine.generate(text, Defaults.CHAT_MAX_NEW_TOKENS, Sampler.greedy(), new Engine.Listener() {
                @Override
                public void onText(String delta) {
                    if (stop.get()) throw new StopRequested();
                    runOnUiThread(() -> output.append(delta));
                }

                @Override
                public void onStats(Stats s) {
                    String line = String.format("%.1f tok/s · hit rate %.0f%% · Flash %.2f MB/token · resident %.0f MB (RSS %.0f MB)",
                            s.tokensPerSecond(), 100 * s.hitRate(), s.flashMBPerToken(), s.residentEstimate / 1e6,
                            s.rssBytes / 1e6);
                    runOnUiThread(() -> stats.setText(line));
                }
            });
        } catch (StopRequested ignored) {
            // the user pressed Stop
        } catch (Exception e) {
            runOnUiThread(() -> output.append("\n\n[error] " + e));
        } finally {
            runOnUiThread(() -> {
                run.setText("Generate");
                running = false;
            });
        }
    }

    private static final class StopRequested extends RuntimeException {}

    @Override
    protected void onActivityResult(int request, int result, Intent data) {
        super.onActivityResult(request, result, data);
        if (request != PICK_FOLDER || result != RESULT_OK || data == null) return;
        Uri tree = data.getData();
        stats.setText("copying the bundle into app storage…");
        worker.execute(() -> {
            try {
                String name = copyTree(tree);
                runOnUiThread(() -> {
                    stats.setText("imported " + name);
                    refreshBundles();
                });
            } catch (Exception e) {
                runOnUiThread(() -> stats.setText("import failed: " + e));
            }
        });
    }

    /** Copies the files of a picked folder (a bundle is flat) into filesDir/bundles/<folder name>/. */
    private String copyTree(Uri tree) throws Exception {
        ContentResolver cr = getContentResolver();
        String rootId = DocumentsContract.getTreeDocumentId(tree);
        String name = rootId.substring(rootId.lastIndexOf('/') + 1).replace(':', '_');
        File dst = new File(new File(getFilesDir(), "bundles"), name);
        if (!dst.isDirectory() && !dst.mkdirs()) throw new IllegalStateException("cannot create " + dst);
        Uri children = DocumentsContract.buildChildDocumentsUriUsingTree(tree, rootId);
        String[] cols = {DocumentsContract.Document.COLUMN_DOCUMENT_ID, DocumentsContract.Document.COLUMN_DISPLAY_NAME,
                DocumentsContract.Document.COLUMN_MIME_TYPE};
        try (Cursor c = cr.query(children, cols, null, null, null)) {
            byte[] buf = new byte[1 << 20];
            while (c != null && c.moveToNext()) {
                if (DocumentsContract.Document.MIME_TYPE_DIR.equals(c.getString(2))) continue;
                Uri doc = DocumentsContract.buildDocumentUriUsingTree(tree, c.getString(0));
                try (InputStream in = cr.openInputStream(doc);
                     OutputStream out = new FileOutputStream(new File(dst, c.getString(1)))) {
                    int n;
                    while ((n = in.read(buf)) > 0) out.write(buf, 0, n);
                }
            }
        }
        return name;
    }

    @Override
    protected void onDestroy() {
        stop.set(true);
        worker.shutdown();
        super.onDestroy();
    }
}
