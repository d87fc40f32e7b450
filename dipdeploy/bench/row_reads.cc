// The DRAM probe of `dipdeploy bench reads --io dram` (dipdeploy/bench/read_sources.py builds it with
// g++ -O2 -mavx2): how fast one core reads a subset of fixed-size rows from a DRAM-resident buffer, in
// address order or shuffled, with or without software prefetch, through a plain AVX2 load loop (the
// hardware's ceiling, below any reader's copy).
// usage: row_reads BUFFER_BYTES ROW_BYTES DENSITY PREFETCH_ROWS ORDER(sorted|shuffled|all) PASSES
// prints: seconds of the fastest pass, rows read, a checksum bit (keeps the loads).
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
        std::fprintf(stderr, "usage: %s BUFFER_BYTES ROW_BYTES DENSITY PREFETCH_ROWS ORDER PASSES\n", argv[0]);
        return 2;
    }
    const size_t n = (size_t) std::atoll(argv[1]), row = (size_t) std::atol(argv[2]);
    const double density = std::atof(argv[3]);
    const int ahead = std::atoi(argv[4]), passes = std::atoi(argv[6]);
    const char * order = argv[5];
    if (row == 0 || n < row || passes < 1 || density <= 0.0 || density > 1.0) {
        std::fprintf(stderr, "bad arguments\n");
        return 2;
    }
    std::vector<uint8_t> buf(n, 1);
    std::mt19937 rng(1);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    std::vector<size_t> rows;
    for (size_t r = 0; r + row <= n; r += row) {
        if (std::strcmp(order, "all") == 0 || coin(rng) < density) rows.push_back(r);
    }
    if (std::strcmp(order, "shuffled") == 0) std::shuffle(rows.begin(), rows.end(), rng);
    __m256i acc = _mm256_setzero_si256();
    double best = 1e30;
    for (int pass = 0; pass < passes; ++pass) {
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < rows.size(); ++i) {
            if (ahead > 0 && i + ahead < rows.size()) {
                for (size_t l = 0; l < row; l += 64) _mm_prefetch((const char *) buf.data() + rows[i + ahead] + l, _MM_HINT_T0);
            }
            const uint8_t * p = buf.data() + rows[i];
            for (size_t j = 0; j + 32 <= row; j += 32) acc = _mm256_add_epi8(acc, _mm256_loadu_si256((const __m256i *) (p + j)));
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("%.9f %zu %d\n", best, rows.size(), _mm256_extract_epi8(acc, 0) & 1);
    return 0;
}
