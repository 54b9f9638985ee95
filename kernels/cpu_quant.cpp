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

template <typename Block, int64_t kBlockSize>
void quant_matmul(const float* x, int64_t M, int64_t K, const Block* w, int64_t N, float* out,
                  int threads) {
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
