package ai.dipdeploy.engine;

import java.io.Closeable;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.SeekableByteChannel;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.OpenOption;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.SecureDirectoryStream;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributeView;
import java.nio.file.attribute.BasicFileAttributes;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.function.Consumer;

/**
 * A bundle folder whose files are read only after their checks, and through what was checked: the Java
 * mirror of {@code dipdeploy/bundle/bundledir.py} (docs/decisions/0008-bundle-reads.md, section "Java").
 *
 * <p>A check by path followed by an open by path checks one file and reads another when the name changes in
 * between. Where the JVM gives a {@link SecureDirectoryStream} (Linux, Android), the folder is held open and
 * each name is looked up and opened relative to it ({@code openat}, no lookup of the folder's path again);
 * elsewhere by the folder's path. A name is checked before it is opened, without following a link: a regular
 * file (so a FIFO or a device is never opened), one hard link (the {@code unix} attribute view; where a JVM
 * lacks it the count is not judged, as Python does where a filesystem reports none), the manifest's size. It
 * is then opened with {@link LinkOption#NOFOLLOW_LINKS}, and the name must still be the file checked (its
 * file key) and the opened channel of the checked size, else the open is refused. Java cannot stat an open
 * channel, so a name swapped away and back between the check and the open is not seen; {@link #readBytes}
 * hashes exactly the bytes it returns, which closes that gap for every file read whole.
 */
final class BundleDir implements Closeable {
    /** Called with each name after its checks and before it is opened: tests swap the name there. */
    static Consumer<String> afterCheck;

    /** One file's open-time checks failed; the message is the line {@code verify} lists. */
    static final class Problem extends IOException {
        private static final long serialVersionUID = 1L;
        final String problem;

        Problem(String problem) {
            super(problem);
            this.problem = problem;
        }
    }

    final Path path;
    /** The manifest's {@code files} (name → {size, sha256}), once it is read. */
    Map<String, Object> files = new HashMap<>();
    /** name → the file key of what {@link #open} checked. */
    final Map<String, Object> checked = new HashMap<>();
    private final SecureDirectoryStream<Path> held;
    private static volatile boolean unixView = true;

    BundleDir(Path path) throws IOException {
        this.path = path;
        DirectoryStream<Path> ds = Files.newDirectoryStream(path);
        if (ds instanceof SecureDirectoryStream) held = (SecureDirectoryStream<Path>) ds;
        else {
            ds.close();
            held = null;
        }
    }

    /** Whether names are looked up in the held folder (else by the folder's path). */
    boolean holdsFolder() {
        return held != null;
    }

    @Override
    public void close() throws IOException {
        if (held != null) held.close();
    }

    @Override
    public String toString() {
        return path.toString();
    }

    /** The one line for a file that failed its checks while the bundle was read. */
    IllegalArgumentException error(String problem) {
        return new IllegalArgumentException("bundle " + path + ": " + problem + "; " + Manifest.REGENERATE
                + " (`dipdeploy inspect --verify` checks every file)");
    }

    /** What one lookup of a name found: its attributes and, from the unix view, its link count (-1: unknown). */
    private static final class Stat {
        BasicFileAttributes attrs;
        long nlink = -1;
    }

    private Stat stat(String name) throws IOException {
        Stat s = new Stat();
        Path p = path.resolve(name);
        s.attrs = held != null
                ? held.getFileAttributeView(Paths.get(name), BasicFileAttributeView.class, LinkOption.NOFOLLOW_LINKS)
                        .readAttributes()
                : Files.readAttributes(p, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
        if (unixView) {
            try {
                Map<String, Object> u = Files.readAttributes(p, "unix:nlink", LinkOption.NOFOLLOW_LINKS);
                // the count is the folder path's name: it must be the file the held folder holds
                if (Objects.equals(Files.readAttributes(p, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS)
                        .fileKey(), s.attrs.fileKey()))
                    s.nlink = ((Number) u.get("nlink")).longValue();
                else s.nlink = -2;
            } catch (UnsupportedOperationException | IllegalArgumentException ex) {
                unixView = false; // this JVM has no "unix" view: link counts are not judged
            } catch (NoSuchFileException ex) {
                s.nlink = -2;
            }
        }
        return s;
    }

    /** Python's {@code kind_problem}: a regular file of its own, not a link, a FIFO or a device, one link. */
    private static String kindProblem(String name, Stat st) {
        if (st.attrs.isSymbolicLink()) return name + ": a symbolic link (a bundle holds plain files)";
        if (!st.attrs.isRegularFile()) return name + ": not a regular file (a bundle holds plain files)";
        if (st.nlink > 1)
            return name + ": " + st.nlink + " hard links to the same bytes (a bundle file must be its own copy; a link "
                    + "may be a file outside the bundle)";
        return null;
    }

    private String changed(String name) {
        return name + ": not the file that was checked (replaced, or a link put in its place)";
    }

    private Long listedSize(String name) {
        Object rec = files.get(name);
        Object size = rec instanceof Map ? ((Map<?, ?>) rec).get("size") : null;
        return size instanceof Long ? (Long) size : null;
    }

    /**
     * A read-only channel of {@code name} (the caller closes it), checked as the class comment says. Throws
     * {@link Problem} (missing, a link, another kind, a second link, another size, changed while opened).
     */
    SeekableByteChannel open(String name) throws IOException {
        String bad = BundleCheck.nameProblem(name);
        if (bad != null) throw new Problem("files: " + bad);
        Stat st;
        try {
            st = stat(name);
        } catch (NoSuchFileException ex) {
            throw new Problem(name + ": missing");
        }
        String problem = kindProblem(name, st);
        Long size = listedSize(name);
        if (problem == null && st.nlink == -2) problem = changed(name);
        if (problem == null && size != null && st.attrs.size() != size)
            problem = name + ": size " + st.attrs.size() + " != " + size;
        if (problem != null) throw new Problem(problem);
        if (afterCheck != null) afterCheck.accept(name);
        SeekableByteChannel ch;
        try {
            Set<OpenOption> how = new HashSet<>();
            how.add(StandardOpenOption.READ);
            how.add(LinkOption.NOFOLLOW_LINKS);
            ch = held != null ? held.newByteChannel(Paths.get(name), how) : Files.newByteChannel(path.resolve(name), how);
        } catch (NoSuchFileException ex) {
            throw new Problem(name + ": missing");
        } catch (IOException ex) {
            String why = String.valueOf(ex.getMessage());
            if (why.contains("symbolic link")) throw new Problem(name + ": a symbolic link (a bundle holds plain files)");
            throw new Problem(name + ": cannot be read (" + why + ")");
        }
        try {
            Stat now = stat(name);
            if (!Objects.equals(now.attrs.fileKey(), st.attrs.fileKey()) || !now.attrs.isRegularFile()
                    || ch.size() != st.attrs.size())
                throw new Problem(changed(name));
        } catch (IOException ex) {
            ch.close();
            throw ex instanceof Problem ? ex : new Problem(changed(name));
        }
        checked.put(name, st.attrs.fileKey());
        return ch;
    }

    /** {@link #open} as a {@link FileChannel} (positioned reads), which every JVM's file channels are. */
    FileChannel openChannel(String name) throws IOException {
        SeekableByteChannel ch = open(name);
        if (ch instanceof FileChannel) return (FileChannel) ch;
        ch.close();
        throw new Problem(name + ": cannot be read (not a file channel)");
    }

    /**
     * The bytes of {@code name}, read through the channel {@link #open} checked and, where the manifest lists
     * a sha256 (and {@code hash}), compared with the sha256 of exactly these bytes. {@code cap}: the most
     * bytes a file the manifest does not size may hold. Throws {@link Problem}.
     */
    byte[] readBytes(String name, long cap, boolean hash) throws IOException {
        Long size = listedSize(name);
        long limit = size != null ? size : cap;
        if (limit < 0) throw new Problem(name + ": not one of the bundle's files");
        byte[] data;
        try (SeekableByteChannel ch = open(name)) {
            ByteBuffer buf = ByteBuffer.allocate(Math.toIntExact(Math.min(limit + 1, Integer.MAX_VALUE - 8)));
            while (buf.hasRemaining() && ch.read(buf) > 0) {
                // the limit holds even if the file grows after the check
            }
            data = new byte[buf.position()];
            buf.flip();
            buf.get(data);
        }
        if (data.length > limit || (size != null && data.length != size)) {
            String what = data.length > limit ? "over " + limit + " bytes" : data.length + " bytes read";
            throw new Problem(name + ": " + what + " where " + limit + " were checked (changed while read)");
        }
        Object rec = files.get(name);
        Object want = rec instanceof Map ? ((Map<?, ?>) rec).get("sha256") : null;
        if (hash && want instanceof String && !Manifest.hex(digest().digest(data)).equals(want))
            throw new Problem(name + ": sha256 mismatch");
        return data;
    }

    /** {@link #readBytes} of a listed file. */
    byte[] readBytes(String name, boolean hash) throws IOException {
        return readBytes(name, -1, hash);
    }

    /** The sha256 of {@code name}, read through one checked channel (a data file: never held whole). */
    String sha256(String name) throws IOException {
        MessageDigest md = digest();
        ByteBuffer buf = ByteBuffer.allocate(1 << 20);
        try (SeekableByteChannel ch = open(name)) {
            while (ch.read(buf) > 0) {
                buf.flip();
                md.update(buf);
                buf.clear();
            }
        }
        return Manifest.hex(md.digest());
    }

    /**
     * The names among {@code names} that no longer hold the file {@link #open} checked (another file, a link,
     * gone): what a reader that opened them by name (ONNX Runtime's external data) may have read instead.
     */
    List<String> unchanged(List<String> names) {
        List<String> out = new ArrayList<>();
        for (String name : names) {
            boolean same;
            try {
                Stat st = stat(name);
                same = kindProblem(name, st) == null && st.nlink != -2 && checked.containsKey(name)
                        && Objects.equals(st.attrs.fileKey(), checked.get(name));
            } catch (IOException ex) {
                same = false;
            }
            if (!same) out.add(name);
        }
        return out;
    }

    static MessageDigest digest() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (java.security.NoSuchAlgorithmException ex) {
            throw new IllegalStateException(ex);
        }
    }
}
