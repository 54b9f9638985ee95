// Weight-only quantized linears on the CPU: out[M, N] = x[M, K] @ W[N, K]^T with W kept in
// blocks of a few bits per weight, read once per step. Twins: kernels/reference.py's
// quant_matmul and dequantize.
//
// Formats (braid's own, converted from GGUF's at load; kernels/quant.py):
//   q4: 32 weights per block: float16 scale and min, 16 bytes of nibbles; w = q * scale + min
//       with q in 0..15, weight j in the low nibble of byte j, weight j + 16 in the high one
//       (GGUF's Q4_1 block; Q4_0 maps onto it exactly, Q4_K is requantized). 20 bytes per 32
//       weights.
//   q8: 16 weights per block: float16 scale, 16 int8; w = q * scale (GGUF's Q8_0 exactly;
//       Q6_K requantized). 18 bytes per 16 weights.
//
// The kernels read them interleaved (kernels/quant.py's `interleave`): the rows in groups of
// 8, and for each group and block column the 8 rows' blocks together, their scales (and
// mins) first, then their quant bytes in 4-byte units: unit c of all 8 rows, then unit c + 1.
// One 32-byte load then holds 4 bytes of each of the 8 rows, a broadcast of 4 input bytes
// meets all 8 at once, and the sums come out one row per lane: no horizontal sums and no
// scalar scales per block, which cost as much as the multiply-adds themselves.
//
// Up to kInt8MaxRows input rows (decode steps, AVX2) the inputs are rounded to int8 blocks and
// meet the weights in integer multiply-adds (int8_matmul below). More rows (prefill): each
// thread expands a group's blocks into floats in a small buffer and then runs plain dot
// products against the input rows, two input rows by four weight rows per pass: the
// expansion is paid once per weight row whatever M is, and the inner loop is the same float32
// FMAs as a dense linear.

#include <omp.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kGroup = 8;  // rows interleaved together

// One block column of a group of 8 rows. qs[c][r] holds bytes 4c..4c+3 of row r's block.
// Scales and mins are float16 bits.
struct GroupQ4 {  // 32 weights a row: low nibbles are weights 0..15, high ones 16..31
  uint16_t scale[kGroup], min[kGroup];
  uint8_t qs[4][kGroup][4];
};
struct GroupQ8 {  // 16 weights a row
  uint16_t scale[kGroup];
  int8_t qs[4][kGroup][4];
};
static_assert(sizeof(GroupQ4) == kGroup * 20 && sizeof(GroupQ8) == kGroup * 18,
              "interleaved groups hold 8 blocks each");

inline float from_half(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  const uint32_t bits = sign | (exponent == 31 ? 0x7F800000u : (exponent + 112) << 23) |
                        (mantissa << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Row r of a group's block column as floats (32 or 16 of them).
inline void expand_block(const GroupQ4& g, int r, float* out) {
  const float scale = from_half(g.scale[r]), min = from_half(g.min[r]);
  for (int j = 0; j < 16; ++j) {
    const uint8_t byte = g.qs[j / 4][r][j % 4];
    out[j] = static_cast<float>(byte & 15) * scale + min;
    out[j + 16] = static_cast<float>(byte >> 4) * scale + min;
  }
}
inline void expand_block(const GroupQ8& g, int r, float* out) {
  const float scale = from_half(g.scale[r]);
  for (int j = 0; j < 16; ++j) out[j] = static_cast<float>(g.qs[j / 4][r][j % 4]) * scale;
}

template <typename Group>
constexpr int64_t kBlock = std::is_same<Group, GroupQ4>::value ? 32 : 16;

// Row r of a group (its num_blocks block columns) as K floats.
template <typename Group>
void expand_row(const Group* group, int64_t num_blocks, int r, float* out) {
  for (int64_t b = 0; b < num_blocks; ++b) expand_block(group[b], r, out + b * kBlock<Group>);
}

// out[r, n0 + i] = dot(x[r], w[i]) for 4 expanded weight rows w (each K floats); `rows` of
// them are stored (the last group of an N that is not a multiple of 8 has fewer).
void dot_rows(const float* x, int64_t M, int64_t K, const float* w, int64_t rows, float* out,
              int64_t out_stride) {
  const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
  for (int64_t r = 0; r < M; r += 2) {
    const float *x0 = x + r * K, *x1 = r + 1 < M ? x0 + K : x0;
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
    const float sums[2][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}};
    for (int64_t s = 0; s < 2 && r + s < M; ++s) {
      for (int64_t i = 0; i < rows; ++i) out[(r + s) * out_stride + i] = sums[s][i];
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// A few input rows (decode steps), llama.cpp's scheme: each input block is rounded to int8
// with one float scale (amax / 127), and the weights meet it in integer multiply-adds
// (maddubs: unsigned bytes times signed bytes, summed in pairs), one float FMA per block
// column and row for a whole group. The twin is kernels/reference.quant_matmul_int8: the
// same sums over the rounded inputs.

// Each row of x [R, K] in blocks of kBlock: q = round(x * 127 / amax) (to nearest even, as
// the twin), scale = amax / 127, and (q4's min term) sum = scale * sum(q).
template <int64_t kBlockSize>
void quantize_inputs(const float* x, int64_t rows, int64_t K, int8_t* q, float* scales,
                     float* sums) {
  for (int64_t i = 0; i < rows * K / kBlockSize; ++i) {
    const float* xb = x + i * kBlockSize;
    float amax = 0;
    for (int64_t k = 0; k < kBlockSize; ++k) amax = std::max(amax, std::fabs(xb[k]));
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    int32_t total = 0;
    for (int64_t k = 0; k < kBlockSize; ++k) {
      const int32_t v = static_cast<int32_t>(std::nearbyint(xb[k] * inv));
      q[i * kBlockSize + k] = static_cast<int8_t>(v);
      total += v;
    }
    scales[i] = amax / 127.0f;
    sums[i] = scales[i] * static_cast<float>(total);
  }
}

inline __m256 load_halves(const uint16_t* h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

inline __m256i broadcast4(const int8_t* bytes) {  // 4 input bytes into every 32-bit lane
  int32_t v;
  std::memcpy(&v, bytes, 4);
  return _mm256_set1_epi32(v);
}

// The 8 rows of one group against R input rows: sums[r] lane i = dot(w[i], x[r]). q4: w = q *
// scale + min per block, so a block's dot is scale * dot(q, x) + min * sum(x). The integer
// products of a block stay in 16-bit lanes: 8 multiply-adds of at most 2 * 15 * 127 each fit.
template <int R>
void int8_group(const int8_t* xq, const float* xs, const float* xsums, int64_t num_blocks,
                const GroupQ4* group, __m256* sums) {
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 mins[R];
  for (int r = 0; r < R; ++r) sums[r] = mins[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const GroupQ4& g = group[b];
    __m256i low[4], high[4];
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.qs[c]));
      low[c] = _mm256_and_si256(v, nibble);
      high[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    }
    const __m256 scale = load_halves(g.scale), min = load_halves(g.min);
    for (int r = 0; r < R; ++r) {
      const int64_t i = r * num_blocks + b;
      const int8_t* xb = xq + i * 32;
      __m256i dot16 = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        dot16 = _mm256_add_epi16(dot16, _mm256_maddubs_epi16(low[c], broadcast4(xb + 4 * c)));
        dot16 = _mm256_add_epi16(dot16,
                                 _mm256_maddubs_epi16(high[c], broadcast4(xb + 16 + 4 * c)));
      }
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(dot16, ones));
      sums[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(scale, _mm256_set1_ps(xs[i])), sums[r]);
      mins[r] = _mm256_fmadd_ps(min, _mm256_set1_ps(xsums[i]), mins[r]);
    }
  }
  for (int r = 0; r < R; ++r) sums[r] = _mm256_add_ps(sums[r], mins[r]);
}

// q8: signed weights, so |w| meets x with w's sign (maddubs takes one unsigned operand). A
// product pair can reach 2 * 128 * 127, so each multiply-add widens to 32 bits at once.
template <int R>
void int8_group(const int8_t* xq, const float* xs, const float*, int64_t num_blocks,
                const GroupQ8* group, __m256* sums) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) sums[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const GroupQ8& g = group[b];
    __m256i w[4], magnitude[4];
    for (int c = 0; c < 4; ++c) {
      w[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.qs[c]));
      magnitude[c] = _mm256_sign_epi8(w[c], w[c]);
    }
    const __m256 scale = load_halves(g.scale);
    for (int r = 0; r < R; ++r) {
      const int64_t i = r * num_blocks + b;
      const int8_t* xb = xq + i * 16;
      __m256i dot32 = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i signed_x = _mm256_sign_epi8(broadcast4(xb + 4 * c), w[c]);
        dot32 = _mm256_add_epi32(
            dot32, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude[c], signed_x), ones));
      }
      sums[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32),
                                _mm256_mul_ps(scale, _mm256_set1_ps(xs[i])), sums[r]);
    }
  }
}

template <typename Group, int R>
void int8_matmul(const float* x, int64_t K, const Group* w, int64_t N, float* out, int threads) {
  const int64_t num_blocks = K / kBlock<Group>, groups = (N + kGroup - 1) / kGroup;
  std::vector<int8_t> xq(R * K);
  std::vector<float> xs(R * num_blocks), xsums(R * num_blocks);
  quantize_inputs<kBlock<Group>>(x, R, K, xq.data(), xs.data(), xsums.data());
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K >= (1 << 15))
  for (int64_t g = 0; g < groups; ++g) {
    __m256 sums[R];
    int8_group<R>(xq.data(), xs.data(), xsums.data(), num_blocks, w + g * num_blocks, sums);
    const int64_t n0 = g * kGroup, valid = std::min(kGroup, N - n0);
    for (int r = 0; r < R; ++r) {
      if (valid == kGroup) {
        _mm256_storeu_ps(out + r * N + n0, sums[r]);
      } else {
        float lanes[kGroup];
        _mm256_storeu_ps(lanes, sums[r]);
        std::copy(lanes, lanes + valid, out + r * N + n0);
      }
    }
  }
}

template <typename Group>
bool int8_matmul(const float* x, int64_t M, int64_t K, const Group* w, int64_t N, float* out,
                 int threads) {
  switch (M) {
    case 1: int8_matmul<Group, 1>(x, K, w, N, out, threads); return true;
    case 2: int8_matmul<Group, 2>(x, K, w, N, out, threads); return true;
    case 3: int8_matmul<Group, 3>(x, K, w, N, out, threads); return true;
    case 4: int8_matmul<Group, 4>(x, K, w, N, out, threads); return true;
    default: return false;
  }
}
constexpr int64_t kInt8MaxRows = 4;
#else
template <typename Group>
bool int8_matmul(const float*, int64_t, int64_t, const Group*, int64_t, float*, int) {
  return false;  // the expanding path serves every M
}
constexpr int64_t kInt8MaxRows = 0;
#endif

// All 8 rows of a group as floats: row r at out + r * K, two rows at a time in the blocks'
// own order. Expanding row by row (expand_row: scalar, strided bytes) made a whole 3,072 x
// 576 q4 call at 64 rows 5.8 ms instead of 3.2, at 512 rows 44 instead of 25.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// Two rows' units at a time: their 8 bytes widened to 8 lanes, scaled with each row's scale.
inline __m256 pair_lanes(__m256 per_row, int r) {  // lanes 0-3: row r's value, 4-7: r + 1's
  return _mm256_permutevar8x32_ps(per_row, _mm256_setr_epi32(r, r, r, r, r + 1, r + 1, r + 1,
                                                             r + 1));
}
inline void store_pair(float* row, int64_t K, __m256 v) {
  _mm_storeu_ps(row, _mm256_castps256_ps128(v));
  _mm_storeu_ps(row + K, _mm256_extractf128_ps(v, 1));
}

void expand_group(const GroupQ4* group, int64_t num_blocks, int64_t K, float* out) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    const GroupQ4& g = group[b];
    const __m256 scale = load_halves(g.scale), min = load_halves(g.min);
    for (int r = 0; r < kGroup; r += 2) {
      const __m256 s = pair_lanes(scale, r), m = pair_lanes(min, r);
      float* o = out + r * K + b * 32;
      for (int c = 0; c < 4; ++c) {
        const __m256i bytes = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(g.qs[c][r])));
        const __m256 low = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(15)));
        const __m256 high = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
        store_pair(o + 4 * c, K, _mm256_fmadd_ps(low, s, m));
        store_pair(o + 16 + 4 * c, K, _mm256_fmadd_ps(high, s, m));
      }
    }
  }
}

void expand_group(const GroupQ8* group, int64_t num_blocks, int64_t K, float* out) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    const GroupQ8& g = group[b];
    const __m256 scale = load_halves(g.scale);
    for (int r = 0; r < kGroup; r += 2) {
      const __m256 s = pair_lanes(scale, r);
      float* o = out + r * K + b * 16;
      for (int c = 0; c < 4; ++c) {
        const __m256i q = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(g.qs[c][r])));
        store_pair(o + 4 * c, K, _mm256_mul_ps(_mm256_cvtepi32_ps(q), s));
      }
    }
  }
}
#else
template <typename Group>
void expand_group(const Group* group, int64_t num_blocks, int64_t K, float* out) {
  for (int r = 0; r < kGroup; ++r) expand_row(group, num_blocks, r, out + r * K);
}
#endif

template <typename Group>
void quant_matmul(const float* x, int64_t M, int64_t K, const Group* w, int64_t N, float* out,
                  int threads) {
  if (int8_matmul<Group>(x, M, K, w, N, out, threads)) return;
  const int64_t num_blocks = K / kBlock<Group>, groups = (N + kGroup - 1) / kGroup;
#pragma omp parallel num_threads(threads) if (groups > 1)
  {
    std::vector<float> buffer(kGroup * K);
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      expand_group(w + g * num_blocks, num_blocks, K, buffer.data());
      for (int64_t half = 0; half < kGroup; half += 4) {
        const int64_t n0 = g * kGroup + half;
        if (n0 >= N) break;
        dot_rows(x, M, K, buffer.data() + half * K, std::min<int64_t>(4, N - n0), out + n0, N);
      }
    }
  }
}

template <typename Group>
void dequantize_rows(const Group* w, int64_t K, const int64_t* ids, int64_t count, float* out,
                     int threads) {
  const int64_t num_blocks = K / kBlock<Group>;
#pragma omp parallel for num_threads(threads) if (count * K >= (1 << 16))
  for (int64_t i = 0; i < count; ++i) {
    const Group* group = w + ids[i] / kGroup * num_blocks;
    expand_row(group, num_blocks, static_cast<int>(ids[i] % kGroup), out + i * K);
  }
}

}  // namespace

// C entry points. Inputs of up to this many rows are rounded to int8 (twin:
// reference.quant_matmul_int8), more are not (twin: reference.quant_matmul).
extern "C" int64_t quant_int8_max_rows() { return kInt8MaxRows; }
// x: [M, K] float32, contiguous; w: the interleaved blocks of [N, K] (N rounded up to groups
// of 8 rows); out: [M, N].
extern "C" void quant_matmul_q4(const float* x, int64_t M, int64_t K, const void* w, int64_t N,
                                float* out, int threads) {
  quant_matmul(x, M, K, static_cast<const GroupQ4*>(w), N, out, threads);
}
extern "C" void quant_matmul_q8(const float* x, int64_t M, int64_t K, const void* w, int64_t N,
                                float* out, int threads) {
  quant_matmul(x, M, K, static_cast<const GroupQ8*>(w), N, out, threads);
}
// out[i] = row ids[i] of W as floats (the embedding lookup of a quantized table).
extern "C" void dequantize_rows_q4(const void* w, int64_t K, const int64_t* ids, int64_t count,
                                   float* out, int threads) {
  dequantize_rows(static_cast<const GroupQ4*>(w), K, ids, count, out, threads);
}
extern "C" void dequantize_rows_q8(const void* w, int64_t K, const int64_t* ids, int64_t count,
                                   float* out, int threads) {
  dequantize_rows(static_cast<const GroupQ8*>(w), K, ids, count, out, threads);
}
