// LoRA updates on the CPU, float32: y[t] += B_i (A_i x[t]) for each token t under an adapter
// i, each token its own (twin: kernels/reference/attention.py's lora_rows). One call per linear
// replaces a gather, two matmuls and a scatter per adapter in torch, whose cost grew with the
// number of adapters a decode batch interleaves; runtime/lora/adapter.py calls it for the
// layer-by-layer path, kernels/cpu/cpu_decoder.cpp after each of its linears.
//
// The tokens are grouped by adapter (a decode batch interleaves them) and taken in tiles of
// up to kTile, so that each load of a pair's weights serves a tile, not a token. Two phases
// in one parallel region: the shrink h = A_i x (rank dot products of the input width a
// token), then the expand y += B_i h, an update of each output column from the rank columns
// of B. B is read column-major (rank r's column of out floats
// contiguous) so that the expand runs along y's rows in whole vectors, and only where a rank
// column is not zero: a fused linear's pair is two thirds zeros for q/k/v, half for gate/up.

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu_common.h"

namespace {

using braid::LoraWeights;

// Tokens of one adapter a work item takes together.
constexpr int64_t kTile = 4;
// Rows of A a shrink item dots with its tokens' inputs, and columns of y an expand item
// updates: with kTile tokens, 16 vectors of sums either way.
constexpr int64_t kRanks = 4;
constexpr int64_t kColumns = 64;
// Partial sums a dot product keeps, one vector's worth (fewer lanes with fewer registers).
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif

// fn(std::integral_constant<int64_t, n>()) for 1 <= n <= Max: a run-time count as a constant.
template <int64_t Max, typename Fn>
inline void with_count(int64_t n, Fn&& fn) {
  if constexpr (Max > 1) {
    if (n < Max) return with_count<Max - 1>(n, fn);
  }
  fn(std::integral_constant<int64_t, Max>());
}

// h[i * ldh + q] = dot(a[q], x[i]) for Tk tokens' inputs x[i] and R rows q of a ([R, n]
// row-major). Lane-wise partial sums over whole vectors, then the tail.
template <int64_t Tk, int64_t R>
void shrink(const float* const* x, const float* a, int64_t n, float* h, int64_t ldh) {
  float part[Tk][R][kLanes] = {};
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t k = 0; k < whole; k += kLanes) {
    for (int64_t i = 0; i < Tk; ++i) {
      for (int64_t q = 0; q < R; ++q) {
#pragma omp simd
        for (int64_t l = 0; l < kLanes; ++l) part[i][q][l] += a[q * n + k + l] * x[i][k + l];
      }
    }
  }
  for (int64_t i = 0; i < Tk; ++i) {
    for (int64_t q = 0; q < R; ++q) {
      float s = 0.0f;
      for (int64_t l = 0; l < kLanes; ++l) s += part[i][q][l];
      for (int64_t k = whole; k < n; ++k) s += a[q * n + k] * x[i][k];
      h[i * ldh + q] = s;
    }
  }
}

// y[i][j] += sum over r < w.rank of h[i * ldh + r] * B[j0 + j, r] for Tk tokens' outputs
// y[i] (at column j0) and j < n; rank columns zero there are skipped. The sums stay in `acc`
// while the ranks pass over them; with n a constant (N) the loops unroll into whole vectors
// and `acc` into registers.
template <int64_t Tk, int64_t N>
void expand(const float* h, int64_t ldh, const LoraWeights& w, int64_t ld, int64_t j0,
            float* const* y, int64_t n = N) {
  const int64_t count = N > 0 ? N : n;
  float acc[Tk][kColumns];
  for (int64_t i = 0; i < Tk; ++i) {
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) acc[i][j] = y[i][j];
  }
  for (int64_t r = 0; r < w.rank; ++r) {
    if (w.spans[2 * r + 1] <= j0 || w.spans[2 * r] >= j0 + count) continue;
    const float* br = w.b + r * ld + j0;
    for (int64_t i = 0; i < Tk; ++i) {
      const float hr = h[i * ldh + r];
#pragma omp simd
      for (int64_t j = 0; j < count; ++j) acc[i][j] += hr * br[j];
    }
  }
  for (int64_t i = 0; i < Tk; ++i) {
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) y[i][j] = acc[i][j];
  }
}

// Up to kTile tokens under one adapter: order[first .. first + count) (token indices), whose
// A x are rows first .. first + count of h.
struct Tile {
  int64_t first, count;
  const LoraWeights* pair;
};

// The tokens with an update, grouped by adapter (in token order within one), and their tiles.
struct Tiles {
  std::vector<int64_t> order;
  std::vector<Tile> tiles;
  int64_t max_rank = 0, work = 0;

  Tiles(int64_t tokens, const int64_t* adapters, const LoraWeights* weights, int64_t width) {
    int64_t num_adapters = 0;
    for (int64_t t = 0; t < tokens; ++t) num_adapters = std::max(num_adapters, adapters[t] + 1);
    std::vector<int64_t> starts(num_adapters + 1, 0);  // a counting sort by adapter
    for (int64_t t = 0; t < tokens; ++t) {
      if (adapters[t] >= 0 && weights[adapters[t]].rank > 0) ++starts[adapters[t] + 1];
    }
    for (int64_t i = 0; i < num_adapters; ++i) starts[i + 1] += starts[i];
    order.resize(starts[num_adapters]);
    std::vector<int64_t> next(starts.begin(), starts.end() - 1);
    for (int64_t t = 0; t < tokens; ++t) {
      if (adapters[t] >= 0 && weights[adapters[t]].rank > 0) order[next[adapters[t]]++] = t;
    }
    for (int64_t i = 0; i < num_adapters; ++i) {
      const int64_t rank = weights[i].rank;
      for (int64_t first = starts[i]; first < starts[i + 1]; first += kTile) {
        tiles.push_back({first, std::min(kTile, starts[i + 1] - first), &weights[i]});
      }
      if (starts[i + 1] > starts[i]) max_rank = std::max(max_rank, rank);
      work += (starts[i + 1] - starts[i]) * rank * width;
    }
  }
};

}  // namespace

// x [tokens, in] with rows ldx floats apart, y [tokens, out] with rows ldy apart; adapters
// [tokens]: each token's index into `weights` (one linear's pair for each adapter), or -1.
// Tokens whose adapter has rank 0 there (it leaves this linear alone) are skipped.
extern "C" void lora_add_f32(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t tokens,
                             int64_t in, int64_t out, const int64_t* adapters,
                             const LoraWeights* weights, int threads) {
  const Tiles grouped(tokens, adapters, weights, in + out);
  if (grouped.tiles.empty()) return;
  const Tile* tiles = grouped.tiles.data();
  const int64_t* order = grouped.order.data();
  const int64_t num_tiles = grouped.tiles.size(), max_rank = grouped.max_rank;
  std::vector<float> hidden(grouped.order.size() * max_rank);
  float* h = hidden.data();  // A x of order[k] at h + k * max_rank
  const int64_t rank_blocks = (max_rank + kRanks - 1) / kRanks;
  const int64_t chunks = (out + kColumns - 1) / kColumns;
  // Work items flattened with a static schedule: the expand's are column chunks first, so a
  // thread updates its own columns of every token and reads only its part of each B (a
  // decode batch has more columns than threads); a chunk's tiles are shared out only where
  // the chunks are fewer than the threads.
#pragma omp parallel num_threads(threads) if (grouped.work >= braid::kMinParallelWork)
  {
#pragma omp for collapse(2) schedule(static)
    for (int64_t k = 0; k < num_tiles; ++k) {
      for (int64_t block = 0; block < rank_blocks; ++block) {
        const Tile& tile = tiles[k];
        const int64_t r0 = block * kRanks, ranks = std::min(kRanks, tile.pair->rank - r0);
        if (ranks <= 0) continue;
        const float* xs[kTile];
        for (int64_t i = 0; i < tile.count; ++i) xs[i] = x + order[tile.first + i] * ldx;
        with_count<kTile>(tile.count, [&](auto tk) {
          with_count<kRanks>(ranks, [&](auto r) {
            shrink<tk, r>(xs, tile.pair->a + r0 * in, in, h + tile.first * max_rank + r0,
                          max_rank);
          });
        });
      }
    }
#pragma omp for collapse(2) schedule(static)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      for (int64_t k = 0; k < num_tiles; ++k) {
        const Tile& tile = tiles[k];
        const int64_t j0 = chunk * kColumns, columns = std::min(kColumns, out - j0);
        float* ys[kTile];
        for (int64_t i = 0; i < tile.count; ++i) ys[i] = y + order[tile.first + i] * ldy + j0;
        const float* ht = h + tile.first * max_rank;
        with_count<kTile>(tile.count, [&](auto tk) {
          if (columns == kColumns) {
            expand<tk, kColumns>(ht, max_rank, *tile.pair, out, j0, ys);
          } else {
            expand<tk, 0>(ht, max_rank, *tile.pair, out, j0, ys, columns);
          }
        });
      }
    }
  }
}
