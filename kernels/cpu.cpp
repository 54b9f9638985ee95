// CPU kernels for the decoder's small operations: RMSNorm (with the residual add), SiLU-and-
// multiply and the greedy argmax over logits; RoPE with the KV-pool store and paged decode
// attention are in cpu_attention.cpp.
//
// Each replaces a dozen torch ops per layer whose dispatch, OpenMP fork/join and temporary
// tensors cost more than their arithmetic at decode batch sizes. Built by kernels/cpu.py with
// the system compiler (-O3 -march=native -fopenmp -fno-trapping-math, which lets selects and
// rounding vectorize) into one library with cpu_attention.cpp, and called through ctypes; the
// twins in kernels/reference.py define what they compute. Storage is float32 or bfloat16 (uint16_t
// here); arithmetic is float32, rounded to the storage type where the torch twin rounds.
// Loops over rows are parallel with OpenMP: the library links libgomp.so.1, the runtime torch
// already loaded, so both share one thread team.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_common.h"

namespace {

using namespace braid;


template <typename T>
void add_rms_norm(const T* x, T* residual, const T* weight, T* out, int64_t rows, int64_t dim,
                  float eps, int threads) {
  // With x: residual += x (rounded as torch's add), then out = weight * norm(residual).
#pragma omp parallel for num_threads(threads) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    T* h = residual + r * dim;
    if (x != nullptr) {
      const T* xr = x + r * dim;
      for (int64_t i = 0; i < dim; ++i) h[i] = from_float<T>(to_float(h[i]) + to_float(xr[i]));
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < dim; ++i) sum += to_float(h[i]) * to_float(h[i]);
    float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    T* o = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) {
      o[i] = from_float<T>(to_float(weight[i]) * to_float(from_float<T>(to_float(h[i]) * inv)));
    }
  }
}

template <typename T>
void silu_mul(const T* gate_up, T* out, int64_t rows, int64_t dim, int threads) {
  // gate_up rows are [gate (dim) | up (dim)]; out = silu(gate) * up.
#pragma omp parallel for num_threads(threads) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * 2 * dim;
    const T* u = g + dim;
    T* o = out + r * dim;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) {
      float a = to_float(g[i]);
      float s = to_float(from_float<T>(a / (1.0f + exp_approx(-a))));
      o[i] = from_float<T>(s * to_float(u[i]));
    }
  }
}

template <typename T>
void argmax_rows(const T* x, int64_t row_stride, int64_t rows, int64_t cols, int64_t* out,
                 int threads) {
  // out[r]: the index of row r's largest value, the first one on ties, or of its first NaN
  // (as torch.argmax). One pass finds the maximum and one finds where it is, both vectorized:
  // torch's argmax over a vocabulary is not, and takes ~6x longer.
  constexpr int64_t kChunk = 64;
#pragma omp parallel for num_threads(threads) if (rows * cols >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* v = x + r * row_stride;
    float top = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : top) reduction(| : nan)
    for (int64_t c = 0; c < cols; ++c) {
      const float f = to_float(v[c]);
      top = f > top ? f : top;
      nan |= f != f;
    }
    auto is_target = [&](int64_t c) {
      const float f = to_float(v[c]);
      return nan ? f != f : f == top;
    };
    int64_t at = 0;
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t end = std::min(c0 + kChunk, cols);
      int hit = 0;
#pragma omp simd reduction(| : hit)
      for (int64_t c = c0; c < end; ++c) hit |= is_target(c);
      if (hit) {
        at = c0;
        while (!is_target(at)) ++at;
        break;
      }
    }
    out[r] = at;
  }
}

}  // namespace

// C entry points, one per storage type: _f32 (float) and _bf16 (bfloat16 as uint16_t).
#define BRAID_CPU_KERNELS(SUFFIX, T)                                                          \
  extern "C" void add_rms_norm_##SUFFIX(const T* x, T* residual, const T* weight, T* out,     \
                                        int64_t rows, int64_t dim, float eps, int threads) {  \
    add_rms_norm<T>(x, residual, weight, out, rows, dim, eps, threads);                        \
  }                                                                                            \
  extern "C" void silu_mul_##SUFFIX(const T* gate_up, T* out, int64_t rows, int64_t dim,      \
                                    int threads) {                                             \
    silu_mul<T>(gate_up, out, rows, dim, threads);                                             \
  }                                                                                            \
  extern "C" void argmax_rows_##SUFFIX(const T* x, int64_t row_stride, int64_t rows,          \
                                       int64_t cols, int64_t* out, int threads) {              \
    argmax_rows<T>(x, row_stride, rows, cols, out, threads);                                   \
  }

BRAID_CPU_KERNELS(f32, float)
BRAID_CPU_KERNELS(bf16, bf16)
