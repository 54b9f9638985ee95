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
// Up to kInt8MaxRows input rows (decode steps, AVX2) the inputs are rounded to int8 blocks and
// meet the weights in integer multiply-adds (int8_matmul below). More rows (prefill): each
// thread takes 4 output rows at a time, expands their blocks into floats in a small buffer (a
// few KB, in L1) and then runs plain dot products against the input rows, two input rows by
// four weight rows per pass: the expansion is paid once per weight row whatever M is, and the
// inner loop is the same float32 FMAs as a dense linear.

#include <omp.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
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
// A few input rows (decode steps), llama.cpp's scheme: each input block is rounded to int8
// with one float scale (amax / 127), and a weight block meets it in integer multiply-adds
// (maddubs: unsigned weight bytes times signed input bytes, summed in pairs), one float FMA
// per block and row. Unpacking weights into floats instead (the previous kernel) cost ~2x
// as much per weight, and decode steps at batch 1 are all weights. The twin is
// kernels/reference.quant_matmul_int8: the same sums over the rounded inputs.

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Each row of x [R, K] in blocks of kBlock: q = round(x * 127 / amax) (to nearest even, as
// the twin), scale = amax / 127, and (q4's min term) sum = scale * sum(q).
template <int64_t kBlock>
void quantize_inputs(const float* x, int64_t rows, int64_t K, int8_t* q, float* scales,
                     float* sums) {
  for (int64_t i = 0; i < rows * K / kBlock; ++i) {
    const float* xb = x + i * kBlock;
    float amax = 0;
    for (int64_t k = 0; k < kBlock; ++k) amax = std::max(amax, std::fabs(xb[k]));
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    int32_t total = 0;
    for (int64_t k = 0; k < kBlock; ++k) {
      const int32_t v = static_cast<int32_t>(std::nearbyint(xb[k] * inv));
      q[i * kBlock + k] = static_cast<int8_t>(v);
      total += v;
    }
    scales[i] = amax / 127.0f;
    sums[i] = scales[i] * static_cast<float>(total);
  }
}

inline __m256 int_dot(__m256i unsigned_bytes, __m256i signed_bytes) {  // 8 sums of 4 products
  const __m256i pairs = _mm256_maddubs_epi16(unsigned_bytes, signed_bytes);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// out[r] = dot(w, x[r]) for one weight row; q4: w = q * scale + min per block, so the dot is
// scale * dot(q, x) + min * sum(x). Two accumulators per input row (even and odd blocks):
// one chain of dependent FMAs would make each block wait for the last.
template <int R>
void int8_row(const int8_t* xq, const float* xs, const float* xsums, int64_t K,
              const BlockQ4* blocks, float* out, int64_t out_stride) {
  const int64_t num_blocks = K / 32;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 even[R], odd[R];
  float mins[R];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps(), mins[r] = 0;
  auto block_dot = [&](int64_t b, int r) {
    const BlockQ4& blk = blocks[b];
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
    // weights 0..15 in the low nibbles, 16..31 in the high ones
    const __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), nibble);
    const int64_t i = r * num_blocks + b;
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * 32));
    return _mm256_mul_ps(int_dot(w, x), _mm256_set1_ps(blk.scale * xs[i]));
  };
  int64_t b = 0;
  for (; b + 2 <= num_blocks; b += 2) {
    for (int r = 0; r < R; ++r) {
      even[r] = _mm256_add_ps(block_dot(b, r), even[r]);
      odd[r] = _mm256_add_ps(block_dot(b + 1, r), odd[r]);
    }
  }
  for (; b < num_blocks; ++b) {
    for (int r = 0; r < R; ++r) even[r] = _mm256_add_ps(block_dot(b, r), even[r]);
  }
  // The mins' term apart: a scalar chain inside the loop above would be its bottleneck.
  for (int r = 0; r < R; ++r) {
    for (int64_t b = 0; b < num_blocks; ++b) mins[r] += blocks[b].min * xsums[r * num_blocks + b];
    out[r * out_stride] = hsum(_mm256_add_ps(even[r], odd[r])) + mins[r];
  }
}

// q8: signed weights, so |w| meets x with w's sign (maddubs takes one unsigned operand). Two
// 16-weight blocks per 256-bit pass, each with its own scale in its half of the lanes.
template <int R>
void int8_row(const int8_t* xq, const float* xs, const float*, int64_t K, const BlockQ8* blocks,
              float* out, int64_t out_stride) {
  const int64_t num_blocks = K / 16;
  __m256 acc[R];
  float tail[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), tail[r] = 0;
  int64_t b = 0;
  for (; b + 2 <= num_blocks; b += 2) {
    const __m128i w0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b].qs));
    const __m128i w1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b + 1].qs));
    const __m256i w = _mm256_set_m128i(w1, w0);
    const __m256i magnitude = _mm256_sign_epi8(w, w);
    for (int r = 0; r < R; ++r) {
      const int64_t i = r * num_blocks + b;
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * 16));
      const __m256 scale = _mm256_set_m128(_mm_set1_ps(blocks[b + 1].scale * xs[i + 1]),
                                           _mm_set1_ps(blocks[b].scale * xs[i]));
      acc[r] = _mm256_fmadd_ps(int_dot(magnitude, _mm256_sign_epi8(x, w)), scale, acc[r]);
    }
  }
  for (; b < num_blocks; ++b) {  // an odd last block
    for (int r = 0; r < R; ++r) {
      const int64_t i = r * num_blocks + b;
      int32_t dot = 0;
      for (int k = 0; k < 16; ++k) dot += int32_t(blocks[b].qs[k]) * xq[i * 16 + k];
      tail[r] += blocks[b].scale * xs[i] * static_cast<float>(dot);
    }
  }
  for (int r = 0; r < R; ++r) out[r * out_stride] = hsum(acc[r]) + tail[r];
}

template <typename Block, int64_t kBlockSize, int R>
void int8_matmul(const float* x, int64_t K, const Block* w, int64_t N, float* out, int threads) {
  const int64_t num_blocks = R * K / kBlockSize;
  std::vector<int8_t> xq(R * K);
  std::vector<float> xs(num_blocks), xsums(num_blocks);
  quantize_inputs<kBlockSize>(x, R, K, xq.data(), xs.data(), xsums.data());
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K >= (1 << 15))
  for (int64_t n = 0; n < N; ++n) {
    int8_row<R>(xq.data(), xs.data(), xsums.data(), K, w + n * (K / kBlockSize), out + n, N);
  }
}

template <typename Block, int64_t kBlockSize>
bool int8_matmul(const float* x, int64_t M, int64_t K, const Block* w, int64_t N, float* out,
                 int threads) {
  switch (M) {
    case 1: int8_matmul<Block, kBlockSize, 1>(x, K, w, N, out, threads); return true;
    case 2: int8_matmul<Block, kBlockSize, 2>(x, K, w, N, out, threads); return true;
    case 3: int8_matmul<Block, kBlockSize, 3>(x, K, w, N, out, threads); return true;
    case 4: int8_matmul<Block, kBlockSize, 4>(x, K, w, N, out, threads); return true;
    default: return false;
  }
}
constexpr int64_t kInt8MaxRows = 4;
#else
template <typename Block, int64_t kBlockSize>
bool int8_matmul(const float*, int64_t, int64_t, const Block*, int64_t, float*, int) {
  return false;  // the expanding path serves every M
}
constexpr int64_t kInt8MaxRows = 0;
#endif

template <typename Block, int64_t kBlockSize>
void quant_matmul(const float* x, int64_t M, int64_t K, const Block* w, int64_t N, float* out,
                  int threads) {
  if (int8_matmul<Block, kBlockSize>(x, M, K, w, N, out, threads)) return;
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

// C entry points. Inputs of up to this many rows are rounded to int8 (twin:
// reference.quant_matmul_int8), more are not (twin: reference.quant_matmul).
extern "C" int64_t quant_int8_max_rows() { return kInt8MaxRows; }
// x: [M, K] float32, contiguous; w: [N, K / block size] blocks; out: [M, N].
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
