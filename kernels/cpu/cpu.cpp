// CPU kernels for the decoder's small operations: RMSNorm (with the residual add), SiLU-and-
// multiply and the greedy argmax over logits; RoPE with the KV-pool store and paged decode
// attention are in cpu_attention.cpp.
//
// Each replaces a dozen torch ops per layer whose dispatch, OpenMP fork/join and temporary
// tensors cost more than their arithmetic at decode batch sizes. Built by kernels/cpu/bindings.py with
// the system compiler (-O3 -march=native -fopenmp -fno-trapping-math, which lets selects and
// rounding vectorize) into one library with cpu_attention.cpp, and called through ctypes; the
// twins in kernels/reference/attention.py define what they compute. Storage is float32 or bfloat16 (uint16_t
// here); arithmetic is float32, rounded to the storage type where the torch twin rounds.
// Loops over rows are parallel with OpenMP: the library links libgomp.so.1, the runtime torch
// already loaded, so both share one thread team.

#include <omp.h>

#include <cmath>
#include <cstdint>

#include "cpu_common.h"

namespace {

using namespace braid;


// One row of add_rms_norm: with x, h += x (rounded as torch's add), then
// out = weight * norm(h).
template <typename T>
void add_rms_norm_row(const T* x, T* h, const T* weight, T* out, int64_t dim, float eps) {
  if (x != nullptr) {
    for (int64_t i = 0; i < dim; ++i) h[i] = from_float<T>(to_float(h[i]) + to_float(x[i]));
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < dim; ++i) sum += to_float(h[i]) * to_float(h[i]);
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) {
    out[i] = from_float<T>(to_float(weight[i]) * to_float(from_float<T>(to_float(h[i]) * inv)));
  }
}

// One row of silu_mul: g holds the gate, then the up projection; out = silu(gate) * up.
template <typename T>
void silu_mul_row(const T* g, T* out, int64_t dim) {
  const T* u = g + dim;
#pragma omp simd
  for (int64_t i = 0; i < dim; ++i) {
    const float a = to_float(g[i]);
    const float s = to_float(from_float<T>(a / (1.0f + exp_approx(-a))));
    out[i] = from_float<T>(s * to_float(u[i]));
  }
}

#if defined(__AVX512F__)
// The same rows over whole vectors (where vector_rows says so). Against the loops above, 2
// threads: 64 x 576 norm 7.1 -> 4.4 us in bfloat16, 4.8 -> 3.4 in float32; 64 x 1536 SiLU
// 18.9 -> 14.2 us, 10.1 -> 9.0.
template <typename T>
void add_rms_norm_row_avx512(const T* x, T* h, const T* weight, T* out, int64_t dim,
                             float eps) {
  __m512 squares = _mm512_setzero_ps();
  for (int64_t i = 0; i < dim; i += 16) {
    __m512 v = load16(h + i);
    if (x != nullptr) {
      v = round16<T>(_mm512_add_ps(v, load16(x + i)));
      store16(h + i, v);
    }
    squares = _mm512_fmadd_ps(v, v, squares);
  }
  const float sum = _mm512_reduce_add_ps(squares);
  const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(sum / static_cast<float>(dim) + eps));
  for (int64_t i = 0; i < dim; i += 16) {
    const __m512 normed = round16<T>(_mm512_mul_ps(load16(h + i), inv));
    store16(out + i, _mm512_mul_ps(load16(weight + i), normed));
  }
}

template <typename T>
void silu_mul_row_avx512(const T* g, T* out, int64_t dim) {
  const T* u = g + dim;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < dim; i += 16) {
    const __m512 a = load16(g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), a));
    const __m512 s = round16<T>(_mm512_div_ps(a, _mm512_add_ps(one, e)));
    store16(out + i, _mm512_mul_ps(s, load16(u + i)));
  }
}
#endif

template <typename T>
void add_rms_norm(const T* x, T* residual, const T* weight, T* out, int64_t rows, int64_t dim,
                  float eps, int threads) {
#pragma omp parallel for num_threads(threads) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x == nullptr ? nullptr : x + r * dim;
#if defined(__AVX512F__)
    if (vector_rows<T>(dim)) {
      add_rms_norm_row_avx512(xr, residual + r * dim, weight, out + r * dim, dim, eps);
      continue;
    }
#endif
    add_rms_norm_row(xr, residual + r * dim, weight, out + r * dim, dim, eps);
  }
}

template <typename T>
void silu_mul(const T* gate_up, T* out, int64_t rows, int64_t dim, int threads) {
#pragma omp parallel for num_threads(threads) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
#if defined(__AVX512F__)
    if (vector_rows<T>(dim)) {
      silu_mul_row_avx512(gate_up + r * 2 * dim, out + r * dim, dim);
      continue;
    }
#endif
    silu_mul_row(gate_up + r * 2 * dim, out + r * dim, dim);
  }
}

// Index of the largest of v[0, n) (n >= 1), the first one on ties, or of the first NaN (as
// torch.argmax).
template <typename T>
int64_t argmax_row(const T* v, int64_t n) {
  int64_t at = 0;
  for (int64_t c = 1; c < n; ++c) {
    const float f = to_float(v[c]), top = to_float(v[at]);
    if (top == top && (f > top || f != f)) at = c;
  }
  return at;
}

// The end of an argmax kept per lane: the lanes' maxima merged (ties to the lowest index),
// then the tail v[whole, n), which comes after every lane, so only a strict > takes it; a
// NaN in the tail hands the row to argmax_row.
template <typename T>
int64_t merge_lanes(const float* best, const int32_t* index, int lanes, const T* v,
                    int64_t whole, int64_t n) {
  float top = best[0];
  int64_t top_at = index[0];
  for (int j = 1; j < lanes; ++j) {
    if (best[j] > top || (best[j] == top && index[j] < top_at)) top = best[j], top_at = index[j];
  }
  for (int64_t c = whole; c < n; ++c) {
    const float f = to_float(v[c]);
    if (f != f) return argmax_row(v, n);
    if (f > top) top = f, top_at = c;
  }
  return top_at;
}

// argmax_row, portably: the best value and its index per lane of 16, kept in arrays the
// compiler vectorizes the loop over.
template <typename T>
int64_t argmax_row_lanes(const T* v, int64_t n) {
  constexpr int64_t W = 16;
  if (n < W) return argmax_row(v, n);
  float best[W];
  int32_t index[W];  // 32 bits, as wide as the values: the loop vectorizes
  int nan = 0;
  for (int64_t j = 0; j < W; ++j) {
    best[j] = to_float(v[j]);
    index[j] = static_cast<int32_t>(j);
    nan |= best[j] != best[j];
  }
  const int64_t whole = n / W * W;
  for (int64_t c0 = W; c0 < whole; c0 += W) {
#pragma omp simd reduction(| : nan)
    for (int64_t j = 0; j < W; ++j) {
      const float f = to_float(v[c0 + j]);
      const bool take = f > best[j];
      best[j] = take ? f : best[j];
      index[j] = take ? static_cast<int32_t>(c0 + j) : index[j];
      nan |= f != f;
    }
  }
  if (nan) return argmax_row(v, n);
  return merge_lanes(best, index, W, v, whole, n);
}

#if defined(__AVX512F__)
// argmax_row over whole vectors: K running maxima and their indices, each fed every K-th
// vector, so that the compare-and-keep chains run side by side; a strict > keeps each
// lane's first. Merged at the end (ties to the lowest index); a NaN anywhere hands the row
// to argmax_row, which finds the first.
template <typename T>
int64_t argmax_row_avx512(const T* v, int64_t n) {
  constexpr int K = 4;
  if (n < 16 * K) return argmax_row(v, n);
  __m512 best[K];
  __m512i index[K];
  __mmask16 nan = 0;
  for (int k = 0; k < K; ++k) {
    best[k] = load16(v + 16 * k);
    index[k] = _mm512_add_epi32(
        _mm512_set1_epi32(16 * k),
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    nan |= _mm512_cmp_ps_mask(best[k], best[k], _CMP_UNORD_Q);
  }
  const int64_t whole = n / (16 * K) * (16 * K);
  __m512i at = index[0];
  for (int64_t c0 = 16 * K; c0 < whole; c0 += 16 * K) {
    at = _mm512_add_epi32(at, _mm512_set1_epi32(16 * K));
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) {
      const __m512 f = load16(v + c0 + 16 * k);
      const __mmask16 take = _mm512_cmp_ps_mask(f, best[k], _CMP_GT_OQ);
      best[k] = _mm512_mask_mov_ps(best[k], take, f);
      index[k] = _mm512_mask_mov_epi32(index[k], take,
                                       _mm512_add_epi32(at, _mm512_set1_epi32(16 * k)));
      nan |= _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    }
  }
  if (nan) return argmax_row(v, n);
  float values[16 * K];
  int32_t indices[16 * K];
  for (int k = 0; k < K; ++k) {
    _mm512_storeu_ps(values + 16 * k, best[k]);
    _mm512_storeu_si512(indices + 16 * k, index[k]);
  }
  return merge_lanes(values, indices, 16 * K, v, whole, n);
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
inline __m256 load8(const float* v) { return _mm256_loadu_ps(v); }
inline __m256 load8(const bf16* v) {  // bfloat16 bits are float32's upper half
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// argmax_row_avx512's scheme on 8-lane vectors (the portable loop above does not keep its
// maxima in registers: ~1 ns a logit, as slow as torch's argmax).
template <typename T>
int64_t argmax_row_avx2(const T* v, int64_t n) {
  constexpr int K = 4;
  if (n < 8 * K) return argmax_row(v, n);
  __m256 best[K], nan = _mm256_setzero_ps();
  __m256i index[K];
  for (int k = 0; k < K; ++k) {
    best[k] = load8(v + 8 * k);
    index[k] = _mm256_add_epi32(_mm256_set1_epi32(8 * k),
                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(best[k], best[k], _CMP_UNORD_Q));
  }
  const int64_t whole = n / (8 * K) * (8 * K);
  __m256i at = index[0];
  for (int64_t c0 = 8 * K; c0 < whole; c0 += 8 * K) {
    at = _mm256_add_epi32(at, _mm256_set1_epi32(8 * K));
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) {
      const __m256 f = load8(v + c0 + 8 * k);
      const __m256 take = _mm256_cmp_ps(f, best[k], _CMP_GT_OQ);
      best[k] = _mm256_blendv_ps(best[k], f, take);
      index[k] = _mm256_blendv_epi8(index[k], _mm256_add_epi32(at, _mm256_set1_epi32(8 * k)),
                                    _mm256_castps_si256(take));
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    }
  }
  if (_mm256_movemask_ps(nan)) return argmax_row(v, n);
  float values[8 * K];
  int32_t indices[8 * K];
  for (int k = 0; k < K; ++k) {
    _mm256_storeu_ps(values + 8 * k, best[k]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(indices + 8 * k), index[k]);
  }
  return merge_lanes(values, indices, 8 * K, v, whole, n);
}
#endif

template <typename T>
void argmax_rows(const T* x, int64_t row_stride, int64_t rows, int64_t cols, int64_t* out,
                 int threads) {
  // out[r]: argmax_row of row r. Over 64 x 49,152 float32 logits torch's argmax took 816 us,
  // the AVX-512 path 73 us.
#pragma omp parallel for num_threads(threads) if (rows * cols >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
#if defined(__AVX512F__)
    out[r] = argmax_row_avx512(x + r * row_stride, cols);
#elif defined(__AVX2__)
    out[r] = argmax_row_avx2(x + r * row_stride, cols);
#else
    out[r] = argmax_row_lanes(x + r * row_stride, cols);
#endif
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
