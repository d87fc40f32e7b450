#!/usr/bin/env bash
# Checks the Android demo's engine on this machine (no Android SDK needed): android_demo/check.sh
#
# 1. Fetches the ONNX Runtime 1.29 Android AAR once from npm (com.github.asus4.onnxruntime@0.4.9, the
#    package custom_ops/build.sh uses) and keeps only its classes.jar in
#    ${DIPDEPLOY_CACHE:-~/.cache/dipdeploy}/android/ — never in the repository.
# 2. Writes the golden vectors with the project's Python code (android_demo/golden/make_golden.py, into
#    build/android-golden/), again only when an input changed.
# 3. Compiles android_demo/engine (plain Java 17, no Android imports) with javac against classes.jar.
# 4. Runs the JUnit 4 tests on the plain JVM against the golden vectors (they never touch OrtEnvironment:
#    the AAR's native libraries are Android builds and cannot load here).
#
# Installs nothing: without javac or JUnit it stops and names the Debian packages.
set -euo pipefail

ORT_NPM_PACKAGE="com.github.asus4.onnxruntime@0.4.9"
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${DIPDEPLOY_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/dipdeploy}/android"
jar="$cache/onnxruntime-1.29.0-classes.jar"
out="$root/build/android-check"
golden="${DIPDEPLOY_GOLDEN:-$root/build/android-golden}"
py="${PYTHON:-$root/.venv/bin/python}"
t0=$(date +%s)

need() { echo "android-check: $1" >&2; exit 1; }

# ---- tools (nothing is installed here; CI installs them, see .ci/run)
command -v javac >/dev/null && command -v java >/dev/null \
  || need "javac/java not found: apt-get install -y default-jdk-headless (Java 17)"
jv="$(javac -version 2>&1 | awk '{print $2}')"
[ "${jv%%.*}" -ge 17 ] 2>/dev/null || need "javac $jv is older than 17: apt-get install -y default-jdk-headless"
junit="${JUNIT_JAR:-/usr/share/java/junit4.jar}"
hamcrest=""
for h in /usr/share/java/hamcrest-core.jar /usr/share/java/hamcrest.jar /usr/share/java/hamcrest-all.jar; do
  if [ -f "$h" ]; then hamcrest="$h"; break; fi
done
[ -f "$junit" ] && [ -n "$hamcrest" ] \
  || need "JUnit 4 not found (/usr/share/java/junit4.jar and hamcrest): apt-get install -y junit4 (pulls libhamcrest-java)"
[ -x "$py" ] || need "$py not found: run 'make setup' first (the golden vectors come from the project's Python code)"

# ---- 1. the AAR's classes.jar, once
if [ ! -f "$jar" ]; then
  command -v npm >/dev/null || need "npm is needed once to fetch the ORT AAR (apt-get install -y npm)"
  mkdir -p "$cache"
  tmp="$(mktemp -d "$cache/fetch.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  echo "android-check: fetching the ORT 1.29 AAR from npm ($ORT_NPM_PACKAGE, ~150 MB, once) into $cache" >&2
  (cd "$tmp" && npm pack --silent "$ORT_NPM_PACKAGE" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/Plugins/Android/onnxruntime.aar
  python3 - "$tmp/package/Plugins/Android/onnxruntime.aar" "$tmp/classes.jar" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as f:
    f.write(z.read("classes.jar"))
PY
  python3 - "$tmp/classes.jar" <<'PY' || need "the fetched AAR's classes.jar lacks ai.onnxruntime.OrtSession"
import sys, zipfile
sys.exit(0 if "ai/onnxruntime/OrtSession.class" in zipfile.ZipFile(sys.argv[1]).namelist() else 1)
PY
  mv "$tmp/classes.jar" "$jar"
  rm -rf "$tmp"
  trap - EXIT
fi

# ---- 2. golden vectors from the Python code (regenerated when the script or the Python rules changed)
stamp="$golden/golden.ok"
inputs=("$root"/android_demo/golden/*.py "$root"/dipdeploy/bundle/*.py "$root"/dipdeploy/cache/*.py "$root"/dipdeploy/export/*.py
        "$root"/dipdeploy/trace.py "$root"/dipdeploy/runtime/*.py)
fresh=1
[ -f "$stamp" ] || fresh=0
if [ "$fresh" = 1 ]; then
  for f in "${inputs[@]}"; do [ "$f" -nt "$stamp" ] && { fresh=0; break; }; done
fi
if [ "$fresh" = 0 ]; then
  echo "android-check: writing golden vectors into $golden" >&2
  HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" nice -n 10 "$py" "$root/android_demo/golden/make_golden.py" --out "$golden" --force
fi

# Defaults.java is generated from the Python defaults: a stale copy fails here, before the compile
"$py" "$root/android_demo/make_defaults.py" --check

# ---- 3. compile
src="$root/android_demo/engine/src"
if grep -rlE '^import (android|androidx)\.' "$src/main/java" >/dev/null; then
  need "engine sources import Android classes: $(grep -rlE '^import (android|androidx)\.' "$src/main/java")"
fi
rm -rf "$out"
mkdir -p "$out/classes" "$out/test-classes"
mapfile -t main_src < <(find "$src/main/java" -name '*.java' | sort)
mapfile -t test_src < <(find "$src/test/java" -name '*.java' | sort)
nice -n 10 javac --release 17 -Xlint:all,-try -encoding UTF-8 -d "$out/classes" -cp "$jar" "${main_src[@]}"
nice -n 10 javac --release 17 -encoding UTF-8 -d "$out/test-classes" -cp "$out/classes:$jar:$junit:$hamcrest" "${test_src[@]}"
echo "android-check: compiled ${#main_src[@]} engine sources against $(basename "$jar") and ${#test_src[@]} test sources" >&2

# ---- 3b. the Activity cannot be compiled without android.jar: parse it, so syntax errors still show here
cat > "$out/ParseOnly.java" <<'JAVA'
import com.sun.source.util.JavacTask;
import javax.tools.*;
import java.util.List;
public class ParseOnly {
  public static void main(String[] files) throws Exception {
    JavaCompiler c = ToolProvider.getSystemJavaCompiler();
    DiagnosticCollector<JavaFileObject> d = new DiagnosticCollector<>();
    StandardJavaFileManager fm = c.getStandardFileManager(d, null, null);
    ((JavacTask) c.getTask(null, fm, d, List.of("--release", "17"), null, fm.getJavaFileObjects(files))).parse();
    d.getDiagnostics().forEach(System.err::println);
    if (!d.getDiagnostics().isEmpty()) System.exit(1);
  }
}
JAVA
mapfile -t app_src < <(find "$root/android_demo/app/src" -name '*.java' | sort)
java "$out/ParseOnly.java" "${app_src[@]}" || need "the app's Java sources do not parse"
echo "android-check: ${#app_src[@]} app source(s) parse (not compiled: no android.jar here)" >&2

# ---- 4. JUnit on the plain JVM (the ORT classes are on the path only so that Engine links; no test loads it)
mapfile -t tests < <(cd "$src/test/java" && find . -name '*Test.java' | sed 's|^\./||; s|\.java$||; s|/|.|g' | sort)
nice -n 10 java -Ddipdeploy.golden="$golden" -cp "$out/classes:$out/test-classes:$jar:$junit:$hamcrest" \
  org.junit.runner.JUnitCore "${tests[@]}"
echo "android-check: OK in $(( $(date +%s) - t0 )) s" >&2
