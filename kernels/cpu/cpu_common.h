// What the CPU kernel files share: the storage types (float32, and bfloat16 as uint16_t) and
// the float32 arithmetic on them. See kernels/cpu/cpu.cpp for how the kernels are built.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace braid {

typedef uint16_t bf16;

// Parallel regions this small cost more to fork than to run on one thread.
constexpr int64_t kMinParallelWork = 1 << 14;

// One adapter's LoRA pair for one linear (kernels/cpu/cpu_lora.cpp). kernels/cpu/bindings.py packs it as
// four int64s: A's address, B's address, the rank, the spans' address.
struct LoraWeights {
  const float* a;  // A [rank, in], row-major
  const float* b;  // B [out, rank], column-major: rank r's column at b + r * out
  int64_t rank;    // 0: the adapter leaves this linear alone
  // [rank][2]: the rows of rank r's column of B outside which it is zero, [first, end). A
  // fused linear's pair (q/k/v, gate/up) puts each part's B on its own rows and columns.
  const int64_t* spans;
};
static_assert(sizeof(LoraWeights) == 4 * sizeof(int64_t), "packed as four int64s");

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

// tanh(x) to a few ulp, plain arithmetic like exp_approx (std::tanh does not vectorize): an odd
// polynomial below |x| = 0.625, where 1 - 2 / (e^2|x| + 1) would lose the low bits to
// cancellation, that form above it (Cephes' tanhf split and coefficients).
inline float tanh_approx(float x) {
  const float a = x < 0.0f ? -x : x;
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float large = 1.0f - 2.0f / (exp_approx(2.0f * a) + 1.0f);
  return a <= 0.625f ? small : (x < 0.0f ? -large : large);
}

#if defined(__AVX512F__)
// 16 lanes of float32 from float32 or bfloat16 storage.
inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const bf16* x) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// 16 lanes rounded to the storage type as from_float rounds them, kept as float32.
template <typename T>
inline __m512 round16(__m512 x);
template <>
inline __m512 round16<float>(__m512 x) {
  return x;
}
#if defined(__AVX512BF16__)
// vcvtneps2bf16 rounds to nearest even as from_float does, but reads float32 denormals
// (below 1.2e-38) as zero: there they round to 0 instead of the nearest bfloat16 denormal.
inline __m256i to_bf16_bits(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }
#else
inline __m256i to_bf16_bits(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc00000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}
#endif
template <>
inline __m512 round16<bf16>(__m512 x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16_bits(x)), 16));
}

// 16 float32 lanes stored as float32, or rounded to bfloat16 as from_float does.
inline void store16(float* out, __m512 x) { _mm512_storeu_ps(out, x); }
inline void store16(bf16* out, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), to_bf16_bits(x));
}

// Whether rows of n elements go through the explicit 16-lane paths: rows of whole vectors,
// in float32, or in bfloat16 where vcvtneps2bf16 rounds 16 lanes in one instruction (without
// it, the compiler's 8-lane loops over from_float are faster).
template <typename T>
inline bool vector_rows(int64_t n) {
#if defined(__AVX512BF16__)
  return n % 16 == 0;
#else
  return std::is_same<T, float>::value && n % 16 == 0;
#endif
}

// exp_approx over 16 lanes: the same clamps and polynomial, 2^n applied by vscalefps.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
#endif

}  // namespace braid
