package ai.dipdeploy.engine;

import java.io.Closeable;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;

/**
 * The bundle's MLP file ({@code mlp.bin}, Flash layout) read row by row with positioned reads
 * ({@link FileChannel#read(ByteBuffer, long)}: pread), every byte and request counted — the Java mirror of
 * {@code dipdeploy/runtime/flash.py}'s pread path.
 *
 * <p>A row of an array is {@code rowBytes} bytes at {@code offset + row × rowBytes}. Rows adjacent in the file
 * coalesce into one request: straight into the slab when their slots are adjacent too, otherwise through a
 * direct bounce buffer and copied to each slot (Java has no positioned scattering read). Counting follows
 * the Python store: per array, {@code bytes += rows × rowBytes} and {@code requests += runs}.
 */
public final class FlashStore implements Closeable {
    /** One per-row array of a group: {@code rows} rows of {@code rowBytes} at {@code offset}. */
    public static final class RowArray {
        public final String name;
        public final long offset;
        public final int rows, rowBytes;

        public RowArray(String name, long offset, int rows, int rowBytes) {
            this.name = name;
            this.offset = offset;
            this.rows = rows;
            this.rowBytes = rowBytes;
        }
    }

    private final Path path;
    private final FileChannel ch;
    private ByteBuffer bounce = ByteBuffer.allocateDirect(1 << 16);
    public long bytes, requests, rows, ioNanos;

    public FlashStore(Path path) throws IOException {
        this(path, FileChannel.open(path, StandardOpenOption.READ));
    }

    /** Reads through {@code ch}, a channel of {@code path} already opened and checked (the engine's BundleDir). */
    FlashStore(Path path, FileChannel ch) {
        this.path = path;
        this.ch = ch;
    }

    public long size() throws IOException {
        return ch.size();
    }

    @Override
    public void close() throws IOException {
        ch.close();
    }

    /** Start positions of runs of consecutive rows in ascending {@code rows}, plus rows.length at the end. */
    public static int[] runs(long[] rows) {
        int n = 1;
        for (int j = 1; j < rows.length; j++) if (rows[j] - rows[j - 1] != 1) n++;
        int[] starts = new int[rows.length == 0 ? 1 : n + 1];
        int k = 0;
        if (rows.length > 0) starts[k++] = 0;
        for (int j = 1; j < rows.length; j++) if (rows[j] - rows[j - 1] != 1) starts[k++] = j;
        starts[k] = rows.length;
        return starts;
    }

    /** Copies {@code rows} (ascending) of every array into {@code slabs[a]} at {@code slots}. */
    public void read(List<RowArray> arrays, List<ByteBuffer> slabs, long[] rowsToRead, long[] slots)
            throws IOException {
        if (rowsToRead.length == 0) return;
        long t0 = System.nanoTime();
        int[] starts = runs(rowsToRead);
        for (int a = 0; a < arrays.size(); a++) {
            RowArray arr = arrays.get(a);
            ByteBuffer slab = slabs.get(a);
            int rb = arr.rowBytes;
            for (int q = 0; q + 1 < starts.length; q++) {
                int lo = starts[q], hi = starts[q + 1], n = hi - lo;
                long first = slots[lo];
                boolean contiguous = true;
                for (int j = lo + 1; j < hi; j++) if (slots[j] != slots[j - 1] + 1) { contiguous = false; break; }
                long offset = arr.offset + rowsToRead[lo] * (long) rb;
                if (rowsToRead[hi - 1] >= arr.rows || rowsToRead[lo] < 0)
                    throw new IndexOutOfBoundsException(arr.name + ": row " + rowsToRead[hi - 1] + " outside [0, "
                            + arr.rows + ")");
                if (contiguous) {
                    ByteBuffer dst = slab.duplicate();
                    dst.limit(Math.toIntExact((first + n) * rb)).position(Math.toIntExact(first * rb));
                    readFully(dst, offset);
                } else {
                    int len = n * rb;
                    if (bounce.capacity() < len) bounce = ByteBuffer.allocateDirect(Integer.highestOneBit(len) << 1);
                    ByteBuffer b = bounce.duplicate();
                    b.clear().limit(len);
                    readFully(b, offset);
                    for (int j = 0; j < n; j++) {
                        ByteBuffer src = bounce.duplicate();
                        src.limit((j + 1) * rb).position(j * rb);
                        ByteBuffer dst = slab.duplicate();
                        dst.position(Math.toIntExact(slots[lo + j] * rb));
                        dst.put(src);
                    }
                }
            }
            bytes += (long) rowsToRead.length * rb;
            requests += starts.length - 1;
        }
        rows += rowsToRead.length;
        ioNanos += System.nanoTime() - t0;
    }

    private void readFully(ByteBuffer dst, long offset) throws IOException {
        int want = dst.remaining();
        long pos = offset;
        while (dst.hasRemaining()) {
            int got = ch.read(dst, pos);
            if (got < 0)
                throw new IOException(path + ": short read of " + (pos - offset) + " of " + want + " bytes at offset "
                        + offset + ": the bundle's MLP file is truncated; re-export it or run "
                        + "`dipdeploy inspect --verify`");
            pos += got;
        }
    }

    /** The DRAM copies of {@link SlotTable#finish}: row {@code from[j]} → row {@code to[j]} of a slab. */
    public static void moveRows(ByteBuffer slab, int rowBytes, long[] from, long[] to) {
        for (int j = 0; j < from.length; j++) {
            ByteBuffer src = slab.duplicate();
            src.limit(Math.toIntExact((from[j] + 1) * rowBytes)).position(Math.toIntExact(from[j] * rowBytes));
            ByteBuffer dst = slab.duplicate();
            dst.position(Math.toIntExact(to[j] * rowBytes));
            dst.put(src);
        }
    }

    /** Reads bytes [offset, offset+length) whole (shared tables such as VQ3 codebooks), not counted as Flash rows. */
    public ByteBuffer readWhole(long offset, int length) throws IOException {
        ByteBuffer b = ByteBuffer.allocateDirect(length);
        readFully(b, offset);
        b.flip();
        return b;
    }
}
