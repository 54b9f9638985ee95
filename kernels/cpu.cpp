// CPU kernels for the decoder's small operations: RMSNorm (with the residual add), SiLU-and-
// multiply, RoPE with the KV-pool store, and paged decode attention.
//
// Each replaces a dozen torch ops per layer whose dispatch, OpenMP fork/join and temporary
// tensors cost more than their arithmetic at decode batch sizes. Built by kernels/cpu.py with
// the system compiler (-O3 -march=native -fopenmp -fno-trapping-math, which lets selects and
// rounding vectorize) and called through ctypes; the twins in
// kernels/reference.py define what they compute. Storage is float32 or bfloat16 (uint16_t
// here); arithmetic is float32, rounded to the storage type where the torch twin rounds.
// Loops over rows are parallel with OpenMP: the library links libgomp.so.1, the runtime torch
// already loaded, so both share one thread team.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

typedef uint16_t bf16;

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) {
  uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
inline T from_float(float x);
template <>
inline float from_float<float>(float x) {
  return x;
}
template <>
inline bf16 from_float<bf16>(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays a quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);                 // round to nearest, ties to even
  return static_cast<bf16>(bits >> 16);
}

// e^x to ~2 ulp (Cephes' polynomial on x - n ln2, scaled by 2^n through the exponent bits).
// Plain arithmetic, so loops calling it vectorize (libm's expf does not without -ffast-math);
// clamps as selects and rounding by the 1.5 * 2^23 shift for the same reason.
inline float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.7f ? 88.7f : x;
  const float shift = 12582912.0f;
  const float n = (x * 1.44269504088896341f + shift) - shift;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// Parallel regions this small cost more to fork than to run on one thread.
constexpr int64_t kMinParallelWork = 1 << 14;

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
void rope_store_kv(T* qkv, const int64_t* positions, const float* cos, const float* sin, T* k_cache,
                   T* v_cache, const int64_t* slots, int64_t tokens, int64_t heads,
                   int64_t kv_heads, int64_t head_dim, int threads) {
  // Rows of qkv are [q heads | k heads | v heads], each head_dim wide. q and k are rotated in
  // place (half-split layout, float32 tables [positions, head_dim / 2]); k and v are copied to their
  // slot of the pool [slots, kv_heads, head_dim].
  const int64_t half = head_dim / 2;
  const int64_t row = (heads + 2 * kv_heads) * head_dim;
  const int64_t kv_row = kv_heads * head_dim;
#pragma omp parallel for num_threads(threads) if (tokens * row >= kMinParallelWork)
  for (int64_t t = 0; t < tokens; ++t) {
    T* x = qkv + t * row;
    const float* c = cos + positions[t] * half;
    const float* s = sin + positions[t] * half;
    for (int64_t h = 0; h < heads + kv_heads; ++h) {
      T* x1 = x + h * head_dim;
      T* x2 = x1 + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        float a = to_float(x1[i]), b = to_float(x2[i]);
        x1[i] = from_float<T>(a * c[i] - b * s[i]);
        x2[i] = from_float<T>(b * c[i] + a * s[i]);
      }
    }
    std::memcpy(k_cache + slots[t] * kv_row, x + heads * head_dim, kv_row * sizeof(T));
    std::memcpy(v_cache + slots[t] * kv_row, x + (heads + kv_heads) * head_dim, kv_row * sizeof(T));
  }
}

// Dot product and y += w * x over one head. At the usual head sizes the length is a constant,
// so the loops unroll into whole vectors with one horizontal sum at the end; with a length
// known only at run time, the compiler's remainder handling and reduction cost more than the
// 64 multiply-adds themselves (with the conversions below: 1.5x faster in bfloat16).
template <int D>
inline float dot_fixed(const float* a, const float* b) {
  float part[16] = {};
  for (int d = 0; d < D; d += 16) {
#pragma omp simd
    for (int j = 0; j < 16; ++j) part[j] += a[d + j] * b[d + j];
  }
  float s = 0.0f;
  for (int j = 0; j < 16; ++j) s += part[j];
  return s;
}

inline float dot(const float* a, const float* b, int64_t n) {
  if (n == 64) return dot_fixed<64>(a, b);
  if (n == 128) return dot_fixed<128>(a, b);
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

template <int D>
inline void axpy_fixed(float w, const float* x, float* y) {
#pragma omp simd
  for (int d = 0; d < D; ++d) y[d] += w * x[d];
}

inline void axpy(float w, const float* x, float* y, int64_t n) {
  if (n == 64) return axpy_fixed<64>(w, x, y);
  if (n == 128) return axpy_fixed<128>(w, x, y);
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += w * x[d];
}

// A row of the KV pool as float32: itself, or converted into buf.
inline const float* as_float(const float* x, int64_t, float*) { return x; }
inline const float* as_float(const bf16* x, int64_t n, float* buf) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) buf[i] = to_float(x[i]);
  return buf;
}

template <typename T>
void decode_attention(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, T* out,
                      const int64_t* rows, const int64_t* kv_starts, const int64_t* kv_lens,
                      const int64_t* kv_indices, int64_t num_rows, int64_t heads,
                      int64_t kv_heads, int64_t head_dim, float scale, int threads) {
  // One query token per row: row rows[i] of q (stride q_stride between tokens, heads packed
  // [heads, head_dim]) attends the kv_lens[i] slots at kv_indices + kv_starts[i]. A work item
  // is a row with all its heads: each slot's K (then V) row, all KV heads side by side, is read
  // once, and the next ones are prefetched, since a sequence's slots are scattered over the
  // pool and the hardware cannot guess them. Scores are kept whole (a context fits in cache),
  // then softmax, then the weighted sum of V, all in float32. out: [tokens, heads, head_dim].
  // A bfloat16 K or V row is converted once for all the query heads that read it.
  const int64_t group = heads / kv_heads;
  const int64_t kv_row = kv_heads * head_dim;
  const int64_t line_elems = 64 / sizeof(T);
  constexpr int64_t kAhead = 16;  // slots prefetched ahead of the one being read
  auto prefetch = [&](const T* base, int64_t slot) {
    const T* row = base + slot * kv_row;
    for (int64_t j = 0; j < kv_row; j += line_elems) __builtin_prefetch(row + j);
  };
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scores, acc(heads * head_dim), qf(heads * head_dim), row_f(kv_row);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_rows; ++i) {
      const int64_t len = kv_lens[i];
      const int64_t* slot = kv_indices + kv_starts[i];
      const T* qrow = q + rows[i] * q_stride;
      for (int64_t j = 0; j < heads * head_dim; ++j) qf[j] = to_float(qrow[j]) * scale;
      scores.resize(heads * len);
      for (int64_t l = 0; l < len; ++l) {
        if (l + kAhead < len) prefetch(k_cache, slot[l + kAhead]);
        const float* k = as_float(k_cache + slot[l] * kv_row, kv_row, row_f.data());
        for (int64_t h = 0; h < heads; ++h) {
          scores[h * len + l] = dot(qf.data() + h * head_dim, k + (h / group) * head_dim, head_dim);
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* s = scores.data() + h * len;
        float top = -INFINITY;
        for (int64_t l = 0; l < len; ++l) top = s[l] > top ? s[l] : top;
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t l = 0; l < len; ++l) {
          s[l] = exp_approx(s[l] - top);
          total += s[l];
        }
        const float inv = 1.0f / total;
        for (int64_t l = 0; l < len; ++l) s[l] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t l = 0; l < len; ++l) {
        if (l + kAhead < len) prefetch(v_cache, slot[l + kAhead]);
        const float* v = as_float(v_cache + slot[l] * kv_row, kv_row, row_f.data());
        for (int64_t h = 0; h < heads; ++h) {
          axpy(scores[h * len + l], v + (h / group) * head_dim, acc.data() + h * head_dim,
               head_dim);
        }
      }
      T* o = out + rows[i] * heads * head_dim;
      for (int64_t j = 0; j < heads * head_dim; ++j) o[j] = from_float<T>(acc[j]);
    }
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
  extern "C" void rope_store_kv_##SUFFIX(T* qkv, const int64_t* positions, const float* cos,  \
                                         const float* sin, T* k_cache, T* v_cache,             \
                                         const int64_t* slots, int64_t tokens, int64_t heads,  \
                                         int64_t kv_heads, int64_t head_dim, int threads) {    \
    rope_store_kv<T>(qkv, positions, cos, sin, k_cache, v_cache, slots, tokens, heads,         \
                     kv_heads, head_dim, threads);                                             \
  }                                                                                            \
  extern "C" void decode_attention_##SUFFIX(                                                   \
      const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, T* out,                \
      const int64_t* rows, const int64_t* kv_starts, const int64_t* kv_lens,                   \
      const int64_t* kv_indices, int64_t num_rows, int64_t heads, int64_t kv_heads,            \
      int64_t head_dim, float scale, int threads) {                                            \
    decode_attention<T>(q, q_stride, k_cache, v_cache, out, rows, kv_starts, kv_lens, kv_indices, \
                        num_rows, heads, kv_heads, head_dim, scale, threads);                  \
  }

BRAID_CPU_KERNELS(f32, float)
BRAID_CPU_KERNELS(bf16, bf16)
