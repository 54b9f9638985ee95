// Weight-only quantized linears on the CPU: out[M, N] = x[M, K] @ W[N, K]^T with W kept in
// blocks of a few bits per weight, read once per step. Twins: kernels/reference.py's
// quant_matmul and dequantize.
//
// Formats (braid's own, converted from GGUF's at load; kernels/quant.py):
//   q4: 32 weights per block: float scale, float min, 16 bytes of nibbles; w = q * scale + min
//       with q in 0..15, weight j in the low nibble of byte j, weight j + 16 in the high one
//       (GGUF's Q4_0, Q4_1 and Q4_K map onto it exactly). 24 bytes per 32 weights.
//   q8: 16 weights per block: float scale, 16 int8; w = q * scale (GGUF's Q8_0 exactly; Q6_K
//       requantized). 20 bytes per 16 weights.
//
// Each thread takes 4 output rows at a time, expands their blocks into floats in a small
// buffer (a few KB, in L1) and then runs plain dot products against the input rows, two input
// rows by four weight rows per pass: the expansion is paid once per weight row whatever M is,
// and the inner loop is the same float32 FMAs as a dense linear.

#include <omp.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

struct BlockQ4 {
  float scale, min;
  uint8_t qs[16];
};
struct BlockQ8 {
  float scale;
  int8_t qs[16];
};
static_assert(sizeof(BlockQ4) == 24 && sizeof(BlockQ8) == 20, "packed block layouts");

constexpr int64_t kRowsPerPass = 4;  // weight rows expanded together

void expand_row(const BlockQ4* blocks, int64_t num_blocks, float* out) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    const BlockQ4& blk = blocks[b];
    float* o = out + b * 32;
#pragma omp simd
    for (int j = 0; j < 16; ++j) {
      o[j] = static_cast<float>(blk.qs[j] & 15) * blk.scale + blk.min;
      o[j + 16] = static_cast<float>(blk.qs[j] >> 4) * blk.scale + blk.min;
    }
  }
}

void expand_row(const BlockQ8* blocks, int64_t num_blocks, float* out) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    const BlockQ8& blk = blocks[b];
    float* o = out + b * 16;
#pragma omp simd
    for (int j = 0; j < 16; ++j) o[j] = static_cast<float>(blk.qs[j]) * blk.scale;
  }
}

// out[r, n0 + i] = dot(x[r], w[i]) for the `rows` expanded weight rows w (each K floats).
void dot_rows(const float* x, int64_t M, int64_t K, const float* w, int64_t rows, float* out,
              int64_t out_stride) {
  int64_t r = 0;
  if (rows == kRowsPerPass) {
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    for (; r + 2 <= M; r += 2) {
      const float *x0 = x + r * K, *x1 = x0 + K;
      float a00 = 0, a01 = 0, a02 = 0, a03 = 0, a10 = 0, a11 = 0, a12 = 0, a13 = 0;
#pragma omp simd reduction(+ : a00, a01, a02, a03, a10, a11, a12, a13)
      for (int64_t k = 0; k < K; ++k) {
        a00 += x0[k] * w0[k];
        a01 += x0[k] * w1[k];
        a02 += x0[k] * w2[k];
        a03 += x0[k] * w3[k];
        a10 += x1[k] * w0[k];
        a11 += x1[k] * w1[k];
        a12 += x1[k] * w2[k];
        a13 += x1[k] * w3[k];
      }
      float* o0 = out + r * out_stride;
      float* o1 = o0 + out_stride;
      o0[0] = a00, o0[1] = a01, o0[2] = a02, o0[3] = a03;
      o1[0] = a10, o1[1] = a11, o1[2] = a12, o1[3] = a13;
    }
  }
  for (; r < M; ++r) {  // the odd input row, or fewer than kRowsPerPass weight rows
    const float* xr = x + r * K;
    for (int64_t i = 0; i < rows; ++i) {
      const float* wi = w + i * K;
      float acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t k = 0; k < K; ++k) acc += xr[k] * wi[k];
      out[r * out_stride + i] = acc;
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// A few input rows (decode steps): each block's weights are unpacked into registers and meet
// every input row there, so a weight is read from memory once and never stored as a float.
// The expanding path below writes and rereads each weight row as floats: ~3x slower at M = 1,
// where reading the weights is all the work. Same sums as the reference twin up to the order
// of the additions: dot(w, x) over a q4 block is scale * dot(q, x) + min * sum(x).

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline __m256 bytes_to_floats(__m128i bytes) {  // the low 8 unsigned bytes
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

// Two accumulators per row, even and odd blocks: one chain of dependent FMAs would make each
// block wait for the last.
template <int R>
void fused_row(const float* x, int64_t K, const BlockQ4* blocks, const float* xsums, float* out,
               int64_t out_stride) {
  const int64_t num_blocks = K / 32;
  const __m128i nibble = _mm_set1_epi8(0x0F);
  __m256 acc[2][R];
  float mins[R];
  for (int r = 0; r < R; ++r) acc[0][r] = acc[1][r] = _mm256_setzero_ps(), mins[r] = 0;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const BlockQ4& blk = blocks[b];
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
    const __m128i lo = _mm_and_si128(bytes, nibble);  // weights 0..15
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);  // weights 16..31
    const __m256 w0 = bytes_to_floats(lo), w1 = bytes_to_floats(_mm_srli_si128(lo, 8));
    const __m256 w2 = bytes_to_floats(hi), w3 = bytes_to_floats(_mm_srli_si128(hi, 8));
    const __m256 scale = _mm256_set1_ps(blk.scale);
    for (int r = 0; r < R; ++r) {
      const float* xb = x + r * K + b * 32;
      __m256 d = _mm256_mul_ps(w0, _mm256_loadu_ps(xb));
      d = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), d);
      d = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 16), d);
      d = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 24), d);
      acc[b & 1][r] = _mm256_fmadd_ps(d, scale, acc[b & 1][r]);
    }
  }
  // The mins' term apart: a scalar chain inside the loop above would be its bottleneck.
  for (int r = 0; r < R; ++r) {
    const float* xs = xsums + r * num_blocks;
    for (int64_t b = 0; b < num_blocks; ++b) mins[r] += blocks[b].min * xs[b];
    out[r * out_stride] = hsum(_mm256_add_ps(acc[0][r], acc[1][r])) + mins[r];
  }
}

template <int R>
void fused_row(const float* x, int64_t K, const BlockQ8* blocks, const float*, float* out,
               int64_t out_stride) {
  const int64_t num_blocks = K / 16;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const BlockQ8& blk = blocks[b];
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
    const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)));
    const __m256 scale = _mm256_set1_ps(blk.scale);
    for (int r = 0; r < R; ++r) {
      const float* xb = x + r * K + b * 16;
      __m256 d = _mm256_mul_ps(w0, _mm256_loadu_ps(xb));
      d = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), d);
      acc[r] = _mm256_fmadd_ps(d, scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r * out_stride] = hsum(acc[r]);
}

template <typename Block, int64_t kBlockSize, int R>
void fused_matmul(const float* x, int64_t K, const Block* w, int64_t N, float* out, int threads) {
  const int64_t num_blocks = K / kBlockSize;
  std::vector<float> xsums(R * num_blocks);  // each input block's sum (the q4 mins' term)
  for (int r = 0; r < R; ++r) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      float s = 0;
      for (int64_t k = 0; k < kBlockSize; ++k) s += x[r * K + b * kBlockSize + k];
      xsums[r * num_blocks + b] = s;
    }
  }
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K >= (1 << 15))
  for (int64_t n = 0; n < N; ++n) {
    fused_row<R>(x, K, w + n * num_blocks, xsums.data(), out + n, N);
  }
}

template <typename Block, int64_t kBlockSize>
bool fused_matmul(const float* x, int64_t M, int64_t K, const Block* w, int64_t N, float* out,
                  int threads) {
  switch (M) {
    case 1: fused_matmul<Block, kBlockSize, 1>(x, K, w, N, out, threads); return true;
    case 2: fused_matmul<Block, kBlockSize, 2>(x, K, w, N, out, threads); return true;
    case 3: fused_matmul<Block, kBlockSize, 3>(x, K, w, N, out, threads); return true;
    case 4: fused_matmul<Block, kBlockSize, 4>(x, K, w, N, out, threads); return true;
    default: return false;
  }
}
#else
template <typename Block, int64_t kBlockSize>
bool fused_matmul(const float*, int64_t, int64_t, const Block*, int64_t, float*, int) {
  return false;  // the expanding path serves every M
}
#endif

template <typename Block, int64_t kBlockSize>
void quant_matmul(const float* x, int64_t M, int64_t K, const Block* w, int64_t N, float* out,
                  int threads) {
  if (fused_matmul<Block, kBlockSize>(x, M, K, w, N, out, threads)) return;
  const int64_t num_blocks = K / kBlockSize;
  const int64_t passes = (N + kRowsPerPass - 1) / kRowsPerPass;
#pragma omp parallel num_threads(threads) if (passes > 1)
  {
    std::vector<float> buffer(kRowsPerPass * K);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < passes; ++p) {
      const int64_t n0 = p * kRowsPerPass;
      const int64_t rows = std::min(kRowsPerPass, N - n0);
      for (int64_t i = 0; i < rows; ++i) {
        expand_row(w + (n0 + i) * num_blocks, num_blocks, buffer.data() + i * K);
      }
      dot_rows(x, M, K, buffer.data(), rows, out + n0, N);
    }
  }
}

template <typename Block, int64_t kBlockSize>
void dequantize_rows(const Block* w, int64_t K, const int64_t* ids, int64_t count, float* out,
                     int threads) {
  const int64_t num_blocks = K / kBlockSize;
#pragma omp parallel for num_threads(threads) if (count * K >= (1 << 16))
  for (int64_t i = 0; i < count; ++i) expand_row(w + ids[i] * num_blocks, num_blocks, out + i * K);
}

}  // namespace

// C entry points. x: [M, K] float32, contiguous; w: [N, K / block size] blocks; out: [M, N].
extern "C" void quant_matmul_q4(const float* x, int64_t M, int64_t K, const void* w, int64_t N,
                                float* out, int threads) {
  quant_matmul<BlockQ4, 32>(x, M, K, static_cast<const BlockQ4*>(w), N, out, threads);
}
extern "C" void quant_matmul_q8(const float* x, int64_t M, int64_t K, const void* w, int64_t N,
                                float* out, int threads) {
  quant_matmul<BlockQ8, 16>(x, M, K, static_cast<const BlockQ8*>(w), N, out, threads);
}
// out[i] = row ids[i] of W as floats (the embedding lookup of a quantized table).
extern "C" void dequantize_rows_q4(const void* w, int64_t K, const int64_t* ids, int64_t count,
                                   float* out, int threads) {
  dequantize_rows<BlockQ4, 32>(static_cast<const BlockQ4*>(w), K, ids, count, out, threads);
}
extern "C" void dequantize_rows_q8(const void* w, int64_t K, const int64_t* ids, int64_t count,
                                   float* out, int threads) {
  dequantize_rows<BlockQ8, 16>(static_cast<const BlockQ8*>(w), K, ids, count, out, threads);
}
