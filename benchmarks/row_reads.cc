// Read-bandwidth probe behind benchmarks/row_reads.py: how fast one core reads a subset of fixed-size
// rows from a DRAM-resident buffer, in order or shuffled, with or without software prefetch.
// usage: row_reads BUFFER_MB ROW_BYTES KEEP_ONE_IN PREFETCH_ROWS ORDER(sorted|shuffled|all) REPEATS
// prints: GB/s (best of REPEATS) of the bytes of the rows read.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 7) {
        std::fprintf(stderr, "usage: %s BUFFER_MB ROW_BYTES KEEP_ONE_IN PREFETCH_ROWS ORDER REPEATS\n", argv[0]);
        return 2;
    }
    const size_t n = (size_t) std::atol(argv[1]) << 20, row = std::atol(argv[2]);
    const int keep = std::atoi(argv[3]), ahead = std::atoi(argv[4]), reps = std::atoi(argv[6]);
    const char * order = argv[5];
    std::vector<uint8_t> buf(n, 1);
    std::mt19937 rng(1);
    std::vector<size_t> rows;
    for (size_t r = 0; r + row <= n; r += row) {
        if (std::strcmp(order, "all") == 0 || rng() % keep == 0) rows.push_back(r);
    }
    if (std::strcmp(order, "shuffled") == 0) std::shuffle(rows.begin(), rows.end(), rng);
    __m256i acc = _mm256_setzero_si256();
    double best = 0.0;
    for (int rep = 0; rep < reps; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < rows.size(); ++i) {
            if (ahead > 0 && i + ahead < rows.size()) {
                for (size_t l = 0; l < row; l += 64) _mm_prefetch((const char *) buf.data() + rows[i + ahead] + l, _MM_HINT_T0);
            }
            const uint8_t * p = buf.data() + rows[i];
            for (size_t j = 0; j + 32 <= row; j += 32) acc = _mm256_add_epi8(acc, _mm256_loadu_si256((const __m256i *) (p + j)));
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, (double) rows.size() * row / s / 1e9);
    }
    std::printf("%.3f %d\n", best, _mm256_extract_epi8(acc, 0) & 1);
    return 0;
}
