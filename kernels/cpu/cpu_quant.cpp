// Weight-only quantized linears on the CPU: out[M, N] = x[M, K] @ W[N, K]^T with W kept in
// blocks of a few bits per weight, read once per step. Twins: kernels/reference/attention.py's
// quant_matmul, quant_matmul_int8 and dequantize.
//
// Formats (braid's own, converted from GGUF's at load; kernels/cpu/quant.py says which from
// which). Every block holds one float16 scale (and a float16 min for the unsigned ones):
//   q4:  32 weights, w = q * scale + min, q in 0..15: weight j in the low nibble of byte j,
//        weight j + 16 in the high one (GGUF's Q4_1 block). 20 bytes.
//   q5:  32 weights, w = q * scale + min, q in 0..31: q4's nibbles and a fifth bit in 4 more
//        bytes, placed for the kernels (kernels/cpu/quant.py's Q5). 24 bytes.
//   q6:  16 weights, w = (q - 32) * scale, q in 0..63: nibbles and two more bits, placed for
//        the kernels (kernels/cpu/quant.py's Q6; GGUF's Q6_K sub-blocks). 14 bytes.
//   q8:  16 weights, w = q * scale, q in -128..127. 18 bytes.
//   iq4: 32 weights, w = kIq4Values[q] * scale, q a nibble as in q4 (GGUF's IQ4_NL block: a
//        non-uniform grid of 16 int8 levels). 18 bytes.
//   mxfp4: 32 weights, w = kMxfp4Values[q] * 2^(e - 128), q a nibble as in q4, e one E8M0
//        exponent byte in place of the float16 scale (GGUF's MXFP4 block, as stored). 17 bytes.
//
// The kernels read them interleaved (kernels/cpu/quant.py's `interleave`): the rows in groups of
// kGroup (16 with AVX-512, else 8), and for each group and block column the group's blocks
// together, their scales (then mins, then q5's fifth bits) first, then their quant bytes in
// 4-byte units: unit c of every row, then unit c + 1. One vector load then holds 4 bytes of
// each row, a broadcast of 4 input bytes meets all of them at once, and the sums come out one
// row per lane: no horizontal sums and no scalar scales per block.
//
// With AVX2 the inputs are rounded to int8 blocks, llama.cpp's scheme (one float scale,
// amax / 127, per input block), and meet the weights in integer multiply-adds: VNNI's dpbusd
// where the CPU has it, else maddubs. Without AVX2 each thread expands a group's blocks into
// floats in a small buffer and runs plain dot products against the input rows.

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

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define BRAID_QUANT_AVX512 1
constexpr int64_t kGroup = 16;  // rows interleaved together: one 512-bit vector of sums
#else
constexpr int64_t kGroup = 8;  // one 256-bit vector of sums
#endif

// One block column of a group. qs[c][r] holds bytes 4c..4c+3 of row r's block. Scales and
// mins are float16 bits.
struct GroupQ4 {
  uint16_t scale[kGroup], min[kGroup];
  uint8_t qs[4][kGroup][4];
};
struct GroupQ5 {
  uint16_t scale[kGroup], min[kGroup];
  // Row r's fifth bits: bit 2c of byte k is weight 4c + k's, bit 2c + 1 weight 16 + 4c + k's,
  // so that one shift and mask puts unit c's bits beside its nibbles.
  uint8_t qh[kGroup][4];
  uint8_t qs[4][kGroup][4];
};
struct GroupQ6 {
  uint16_t scale[kGroup];
  // Row r's top two bits: bits 2u, 2u + 1 of byte k are weight 4u + k's.
  uint8_t qh[kGroup][4];
  uint8_t qs[2][kGroup][4];  // low nibbles: weights 4c + k; high nibbles: 8 + 4c + k
};
struct GroupQ8 {
  uint16_t scale[kGroup];
  int8_t qs[4][kGroup][4];
};
struct GroupIQ4 {
  uint16_t scale[kGroup];
  uint8_t qs[4][kGroup][4];
};
struct GroupMXFP4 {
  uint8_t e[kGroup];  // E8M0 exponents: the block's scale is 2^(e - 128)
  uint8_t qs[4][kGroup][4];
};
static_assert(sizeof(GroupQ4) == kGroup * 20 && sizeof(GroupQ5) == kGroup * 24 &&
                  sizeof(GroupQ6) == kGroup * 14 && sizeof(GroupQ8) == kGroup * 18 &&
                  sizeof(GroupIQ4) == kGroup * 18 && sizeof(GroupMXFP4) == kGroup * 17,
              "interleaved groups hold kGroup blocks each");

// GGUF's IQ4_NL / IQ4_XS levels, and them again in every 128-bit lane of a vector (byte
// shuffles look up within their lane).
#define BRAID_IQ4_VALUES -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
constexpr int8_t kIq4Values[16] = {BRAID_IQ4_VALUES};
alignas(64) constexpr int8_t kIq4Tables[64] = {BRAID_IQ4_VALUES, BRAID_IQ4_VALUES,
                                               BRAID_IQ4_VALUES, BRAID_IQ4_VALUES};
#undef BRAID_IQ4_VALUES
// The levels + 128, as unsigned bytes (the biased path below).
#define BRAID_IQ4_BIASED 1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241
alignas(64) constexpr uint8_t kIq4BiasedTables[64] = {BRAID_IQ4_BIASED, BRAID_IQ4_BIASED,
                                                      BRAID_IQ4_BIASED, BRAID_IQ4_BIASED};
#undef BRAID_IQ4_BIASED
// MXFP4's E2M1 values doubled to integers (so its exponent is halved: 2^(e - 128)), the same
// way: as int8, in every lane, and + 128.
#define BRAID_MXFP4_VALUES 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12
constexpr int8_t kMxfp4Values[16] = {BRAID_MXFP4_VALUES};
alignas(64) constexpr int8_t kMxfp4Tables[64] = {BRAID_MXFP4_VALUES, BRAID_MXFP4_VALUES,
                                                 BRAID_MXFP4_VALUES, BRAID_MXFP4_VALUES};
#undef BRAID_MXFP4_VALUES
#define BRAID_MXFP4_BIASED \
  128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116
alignas(64) constexpr uint8_t kMxfp4BiasedTables[64] = {BRAID_MXFP4_BIASED, BRAID_MXFP4_BIASED,
                                                        BRAID_MXFP4_BIASED, BRAID_MXFP4_BIASED};
#undef BRAID_MXFP4_BIASED

// What the kernels need to know of each format: weights a block; whether the weights are
// signed bytes, have a min, or an offset the stored values are above zero by.
template <int64_t Block, bool Signed, bool HasMin, int Offset>
struct FormatTraits {
  static constexpr int64_t kBlock = Block;
  static constexpr bool kSigned = Signed, kHasMin = HasMin;
  static constexpr int kOffset = Offset;
};
template <typename Group>
struct Format;
template <>
struct Format<GroupQ4> : FormatTraits<32, false, true, 0> {};
template <>
struct Format<GroupQ5> : FormatTraits<32, false, true, 0> {};
template <>
struct Format<GroupQ6> : FormatTraits<16, false, false, 32> {};
template <>
struct Format<GroupQ8> : FormatTraits<16, true, false, 0> {};
template <>
struct Format<GroupIQ4> : FormatTraits<32, true, false, 0> {};
template <>
struct Format<GroupMXFP4> : FormatTraits<32, true, false, 0> {};

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

// The float bits of 2^(e - 128) for an E8M0 byte e, as GGUF reads it (255 is 2^127, not the
// MX spec's NaN): the exponent field e - 1, or for e < 2 the denormals 2^-127 and 2^-128.
inline uint32_t e8m0_half_bits(uint32_t e) { return e < 2 ? 0x00200000u << e : (e - 1) << 23; }

inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e8m0_half_bits(e);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Weight j (0..31) of a 32-weight block's nibbles, row r.
inline int nibble(const uint8_t (*qs)[kGroup][4], int r, int j) {
  const uint8_t byte = qs[(j % 16) / 4][r][j % 4];
  return j < 16 ? byte & 15 : byte >> 4;
}

// Row r of a group's block column as floats.
inline void expand_block(const GroupQ4& g, int r, float* out) {
  const float scale = from_half(g.scale[r]), min = from_half(g.min[r]);
  for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(nibble(g.qs, r, j)) * scale + min;
}
inline void expand_block(const GroupQ5& g, int r, float* out) {
  const float scale = from_half(g.scale[r]), min = from_half(g.min[r]);
  for (int j = 0; j < 32; ++j) {
    const int bit = 2 * ((j % 16) / 4) + j / 16;
    const int q = nibble(g.qs, r, j) | (((g.qh[r][j % 4] >> bit) & 1) << 4);
    out[j] = static_cast<float>(q) * scale + min;
  }
}
inline void expand_block(const GroupQ6& g, int r, float* out) {
  const float scale = from_half(g.scale[r]);
  for (int j = 0; j < 16; ++j) {
    const uint8_t byte = g.qs[(j % 8) / 4][r][j % 4];
    const int low = j < 8 ? byte & 15 : byte >> 4;
    const int q = low | (((g.qh[r][j % 4] >> (2 * (j / 4))) & 3) << 4);
    out[j] = static_cast<float>(q - 32) * scale;
  }
}
inline void expand_block(const GroupQ8& g, int r, float* out) {
  const float scale = from_half(g.scale[r]);
  for (int j = 0; j < 16; ++j) out[j] = static_cast<float>(g.qs[j / 4][r][j % 4]) * scale;
}
inline void expand_block(const GroupIQ4& g, int r, float* out) {
  const float scale = from_half(g.scale[r]);
  for (int j = 0; j < 32; ++j) out[j] = kIq4Values[nibble(g.qs, r, j)] * scale;
}
inline void expand_block(const GroupMXFP4& g, int r, float* out) {
  const float scale = e8m0_half(g.e[r]);
  for (int j = 0; j < 32; ++j) out[j] = kMxfp4Values[nibble(g.qs, r, j)] * scale;
}

// Row r of a group (its num_blocks block columns) as K floats.
template <typename Group>
void expand_row(const Group* group, int64_t num_blocks, int r, float* out) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    expand_block(group[b], r, out + b * Format<Group>::kBlock);
  }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// ---- vectors of kGroup lanes: one lane per weight row of a group ---------------------------
#if defined(BRAID_QUANT_AVX512)
typedef __m512 VF;
typedef __m512i VI;
inline VI load_units(const void* p) { return _mm512_loadu_si512(p); }
inline VF load_halves(const uint16_t* h) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
}
// The scales 2^(e - 128) of kGroup E8M0 bytes (e8m0_half_bits, a lane each).
inline VF load_exponents(const uint8_t* e) {
  const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e)));
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(x, _mm512_set1_epi32(1)), 23);
  const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), x);
  const __mmask16 below_two = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32(2));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(normal, below_two, tiny));
}
inline VI splat_i32(int32_t v) { return _mm512_set1_epi32(v); }
inline VI splat_i8(int8_t v) { return _mm512_set1_epi8(v); }
inline VF splat(float v) { return _mm512_set1_ps(v); }
inline VF zero_f() { return _mm512_setzero_ps(); }
inline VI zero_i() { return _mm512_setzero_si512(); }
inline VI and_i(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI or_i(VI a, VI b) { return _mm512_or_si512(a, b); }
inline VI xor_i(VI a, VI b) { return _mm512_xor_si512(a, b); }
template <int S>
inline VI shift_left16(VI a) { return _mm512_slli_epi16(a, S); }
template <int S>
inline VI shift_right16(VI a) { return _mm512_srli_epi16(a, S); }
inline VI lookup(VI table, VI index) { return _mm512_shuffle_epi8(table, index); }
inline VI magnitude(VI w) { return _mm512_abs_epi8(w); }
inline VI with_sign_of(VI x, VI w) {  // x where w > 0, -x where w < 0 (w = 0: |w| is 0 anyway)
  return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), zero_i(), x);
}
inline VF fmadd(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF add(VF a, VF b) { return _mm512_add_ps(a, b); }
inline void store(float* out, VF v, int64_t valid) {
  _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << valid) - 1), v);
}
#else
typedef __m256 VF;
typedef __m256i VI;
inline VI load_units(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline VF load_halves(const uint16_t* h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}
// The scales 2^(e - 128) of kGroup E8M0 bytes (e8m0_half_bits, a lane each).
inline VF load_exponents(const uint8_t* e) {
  const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(e)));
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(x, _mm256_set1_epi32(1)), 23);
  const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), x);
  const __m256i below_two = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), x);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, below_two));
}
inline VI splat_i32(int32_t v) { return _mm256_set1_epi32(v); }
inline VI splat_i8(int8_t v) { return _mm256_set1_epi8(v); }
inline VF splat(float v) { return _mm256_set1_ps(v); }
inline VF zero_f() { return _mm256_setzero_ps(); }
inline VI zero_i() { return _mm256_setzero_si256(); }
inline VI and_i(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI or_i(VI a, VI b) { return _mm256_or_si256(a, b); }
inline VI xor_i(VI a, VI b) { return _mm256_xor_si256(a, b); }
template <int S>
inline VI shift_left16(VI a) { return _mm256_slli_epi16(a, S); }
template <int S>
inline VI shift_right16(VI a) { return _mm256_srli_epi16(a, S); }
inline VI lookup(VI table, VI index) { return _mm256_shuffle_epi8(table, index); }
inline VI magnitude(VI w) { return _mm256_sign_epi8(w, w); }
inline VI with_sign_of(VI x, VI w) { return _mm256_sign_epi8(x, w); }
inline VF fmadd(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF add(VF a, VF b) { return _mm256_add_ps(a, b); }
inline void store(float* out, VF v, int64_t valid) {
  if (valid == kGroup) {
    _mm256_storeu_ps(out, v);
  } else {
    float lanes[kGroup];
    _mm256_storeu_ps(lanes, v);
    std::copy(lanes, lanes + valid, out);
  }
}
#endif

// The integer dot products of one block, per 32-bit lane: unsigned weight bytes times signed
// input bytes, 4 to a lane. With VNNI, one instruction a vector; without, maddubs sums pairs
// into 16 bits and madd widens them. kWide16: the 16-bit pair sums of a whole block fit
// (q4: 8 of at most 2 * 15 * 127), so they widen once at the end.
#if defined(BRAID_QUANT_AVX512)
constexpr bool kVnni = true;
template <bool kWide16>
struct BlockDot {
  VI acc = zero_i();
  void add(VI u, VI s) { acc = _mm512_dpbusd_epi32(acc, u, s); }
  VF total() const { return _mm512_cvtepi32_ps(acc); }
  VF total_less(int32_t v) const { return _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, splat_i32(v))); }
};
#elif defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
constexpr bool kVnni = true;
template <bool kWide16>
struct BlockDot {
  VI acc = zero_i();
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  void add(VI u, VI s) { acc = _mm256_dpbusd_epi32(acc, u, s); }
#else
  void add(VI u, VI s) { acc = _mm256_dpbusd_avx_epi32(acc, u, s); }
#endif
  VF total() const { return _mm256_cvtepi32_ps(acc); }
  VF total_less(int32_t v) const { return _mm256_cvtepi32_ps(_mm256_sub_epi32(acc, splat_i32(v))); }
};
#else
constexpr bool kVnni = false;
template <bool kWide16>
struct BlockDot {
  VI acc = zero_i();
  void add(VI u, VI s) {
    const VI pairs = _mm256_maddubs_epi16(u, s);
    acc = kWide16 ? _mm256_add_epi16(acc, pairs)
                  : _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  __m256i widened() const { return kWide16 ? _mm256_madd_epi16(acc, _mm256_set1_epi16(1)) : acc; }
  VF total() const { return _mm256_cvtepi32_ps(widened()); }
  VF total_less(int32_t v) const {
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(widened(), splat_i32(v)));
  }
};
#endif

// ---- a block column of a group as weight-byte vectors, one per 4-byte input unit ----------
// Units 0..3 meet input bytes 4c..4c+3, units 4..7 (32-weight blocks) bytes 16 + 4c...
inline void unpack_nibbles(const uint8_t (*qs)[kGroup][4], VI* units) {
  const VI low = splat_i8(0x0F);
  for (int c = 0; c < 4; ++c) {
    const VI v = load_units(qs[c]);
    units[c] = and_i(v, low);
    units[c + 4] = and_i(shift_right16<4>(v), low);
  }
}

// Bit `From` of every byte of h, moved to bit 4 (the 16-bit shifts carry nothing across
// bytes into bit 4 for shifts of up to 4).
template <int From>
inline VI bit_to_4(VI h) {
  const VI bit4 = splat_i8(0x10);
  if constexpr (From < 4) return and_i(shift_left16<4 - From>(h), bit4);
  if constexpr (From == 4) return and_i(h, bit4);
  if constexpr (From > 4) return and_i(shift_right16<From - 4>(h), bit4);
}

inline void unpack(const GroupQ4& g, VI* units) { unpack_nibbles(g.qs, units); }
inline void unpack(const GroupQ5& g, VI* units) {
  unpack_nibbles(g.qs, units);
  const VI h = load_units(g.qh);
  units[0] = or_i(units[0], bit_to_4<0>(h));
  units[4] = or_i(units[4], bit_to_4<1>(h));
  units[1] = or_i(units[1], bit_to_4<2>(h));
  units[5] = or_i(units[5], bit_to_4<3>(h));
  units[2] = or_i(units[2], bit_to_4<4>(h));
  units[6] = or_i(units[6], bit_to_4<5>(h));
  units[3] = or_i(units[3], bit_to_4<6>(h));
  units[7] = or_i(units[7], bit_to_4<7>(h));
}
// Bits From and From + 1 of every byte of h, moved to bits 4 and 5 (as bit_to_4).
template <int From>
inline VI bits_to_45(VI h) {
  const VI bits = splat_i8(0x30);
  if constexpr (From < 4) return and_i(shift_left16<4 - From>(h), bits);
  if constexpr (From == 4) return and_i(h, bits);
  if constexpr (From > 4) return and_i(shift_right16<From - 4>(h), bits);
}

inline void unpack(const GroupQ6& g, VI* units) {
  const VI low = splat_i8(0x0F);
  for (int c = 0; c < 2; ++c) {
    const VI v = load_units(g.qs[c]);
    units[c] = and_i(v, low);
    units[c + 2] = and_i(shift_right16<4>(v), low);
  }
  const VI h = load_units(g.qh);
  units[0] = or_i(units[0], bits_to_45<0>(h));
  units[1] = or_i(units[1], bits_to_45<2>(h));
  units[2] = or_i(units[2], bits_to_45<4>(h));
  units[3] = or_i(units[3], bits_to_45<6>(h));
}
inline void unpack(const GroupQ8& g, VI* units) {
  for (int c = 0; c < 4; ++c) units[c] = load_units(g.qs[c]);
}
// The 16-level formats: the nibbles looked up in a table of int8 levels.
inline void unpack_levels(const uint8_t (*qs)[kGroup][4], const void* tables, VI* units) {
  unpack_nibbles(qs, units);
  VI table;
  std::memcpy(&table, tables, sizeof(VI));
  for (int u = 0; u < 8; ++u) units[u] = lookup(table, units[u]);
}
inline void unpack(const GroupIQ4& g, VI* units) { unpack_levels(g.qs, kIq4Tables, units); }
inline void unpack(const GroupMXFP4& g, VI* units) { unpack_levels(g.qs, kMxfp4Tables, units); }

// The signed formats' weights + 128, as unsigned bytes (see int8_group).
inline void unpack_biased(const GroupQ8& g, VI* units) {
  const VI flip = splat_i8(static_cast<int8_t>(0x80));
  for (int c = 0; c < 4; ++c) units[c] = xor_i(load_units(g.qs[c]), flip);
}
inline void unpack_biased(const GroupIQ4& g, VI* units) {
  unpack_levels(g.qs, kIq4BiasedTables, units);
}
inline void unpack_biased(const GroupMXFP4& g, VI* units) {
  unpack_levels(g.qs, kMxfp4BiasedTables, units);
}

// A block column's kGroup scales: float16, or MXFP4's exponents.
template <typename Group>
inline VF block_scales(const Group& g) {
  return load_halves(g.scale);
}
inline VF block_scales(const GroupMXFP4& g) { return load_exponents(g.e); }

// ---- the inputs, rounded to int8 blocks ----------------------------------------------------
// q = round(x * 127 / amax) (to nearest even, as the twin), scale = amax / 127, qsum = sum(q)
// and (for the min term) sum = scale * qsum.
template <int64_t kBlockSize>
void quantize_block(const float* x, int8_t* q, float* scale, float* sum, int32_t* qsum) {
  constexpr int kVectors = kBlockSize / 8;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[kVectors], amax = _mm256_setzero_ps();
  for (int i = 0; i < kVectors; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float top = _mm_cvtss_f32(m);
  const __m256 inv = _mm256_set1_ps(top > 0 ? 127.0f / top : 0.0f);
  __m256i total = _mm256_setzero_si256();
  for (int i = 0; i < kVectors; i += 2) {
    // Rounded to nearest even (the default rounding mode), then packed to bytes in order.
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(v[i + 1], inv));
    total = _mm256_add_epi32(total, _mm256_add_epi32(a, b));
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(words),
                                          _mm256_extracti128_si256(words, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 8 * i), bytes);
  }
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  *qsum = _mm_cvtsi128_si32(t);
  *scale = top / 127.0f;
  *sum = *scale * static_cast<float>(*qsum);
}

// The inputs rounded, in per-block arrays.
struct RoundedInputs {
  const int8_t* q;
  const float *scales, *sums;
  const int32_t* qsums;
  RoundedInputs rows_from(int64_t r, int64_t K, int64_t num_blocks) const {
    const int64_t b = r * num_blocks;
    return {q + r * K, scales + b, sums + b, qsums + b};
  }
};

template <int64_t kBlockSize>
RoundedInputs quantize_inputs(const float* x, int64_t rows, int64_t K, int threads) {
  // Reused across calls: a prefill chunk's rounded inputs are megabytes.
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> scales, sums;
  thread_local std::vector<int32_t> qsums;
  const int64_t blocks = rows * K / kBlockSize;
  if (static_cast<int64_t>(q.size()) < rows * K) q.resize(rows * K);
  if (static_cast<int64_t>(scales.size()) < blocks) {
    scales.resize(blocks);
    sums.resize(blocks);
    qsums.resize(blocks);
  }
  // Plain pointers into the parallel region: there, `q` would name each thread's own copy.
  const RoundedInputs out = {q.data(), scales.data(), sums.data(), qsums.data()};
  int8_t* q_out = q.data();
  float *scales_out = scales.data(), *sums_out = sums.data();
  int32_t* qsums_out = qsums.data();
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * K >= (1 << 16))
  for (int64_t i = 0; i < blocks; ++i) {
    quantize_block<kBlockSize>(x + i * kBlockSize, q_out + i * kBlockSize, scales_out + i,
                               sums_out + i, qsums_out + i);
  }
  return out;
}

inline VI broadcast4(const int8_t* bytes) {  // 4 input bytes into every 32-bit lane
  int32_t v;
  std::memcpy(&v, bytes, 4);
  return splat_i32(v);
}

// Input rows meet a group's weights R at a time: a block's weights are unpacked once for all
// R rows. AVX-512 has the registers for 8 rows' accumulators beside them, AVX2 for 4.
#if defined(__AVX512VL__)
constexpr int kRowTile = 8;
#else
constexpr int kRowTile = 4;
#endif

// The rows of one group against R input rows: sums[r] lane i = dot(w[i], x[r]). Input row r's
// block b is at xq + (r * num_blocks + b) * block. A block's dot is scale * dot(q, x), plus
// min * sum(x) for the formats with a min. The multiply-adds take one unsigned operand (the
// weights; x is never -128), so signed weights (q8, iq4) meet x as w + 128 with VNNI, whose
// products never saturate, and the block gives back 128 * scale * sum(x) like a min; without
// VNNI, as |w| against x with w's sign (maddubs' 16-bit pair sums would saturate at w + 128).
template <typename Group, int R>
void int8_group(const RoundedInputs& x, int64_t num_blocks, const Group* group, VF* sums) {
  using F = Format<Group>;
  constexpr int kUnits = F::kBlock / 4;
  constexpr bool kBiased = F::kSigned && kVnni, kSignFix = F::kSigned && !kVnni;
  constexpr int kOffset = kBiased ? 128 : F::kOffset;
  // Without VNNI only q4's and mxfp4's pair sums (at most 2 * 15 * 127, 2 * 12 * 127) fit 16
  // bits for a whole block.
  constexpr bool kWide16 =
      std::is_same<Group, GroupQ4>::value || std::is_same<Group, GroupMXFP4>::value;
  VF mins[R];
  for (int r = 0; r < R; ++r) sums[r] = mins[r] = zero_f();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const Group& g = group[b];
    VI units[8], magnitudes[8];
    if constexpr (kBiased) {
      unpack_biased(g, units);
    } else {
      unpack(g, units);
    }
    if constexpr (kSignFix) {
      for (int u = 0; u < kUnits; ++u) magnitudes[u] = magnitude(units[u]);
    }
    const VF scale = block_scales(g);
    VF min = zero_f();
    if constexpr (F::kHasMin) min = load_halves(g.min);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const int64_t i = r * num_blocks + b;
      const int8_t* xb = x.q + i * F::kBlock;
      BlockDot<kWide16> dot;
      for (int u = 0; u < kUnits; ++u) {
        const VI xu = broadcast4(xb + (u & 3) * 4 + (u >> 2) * 16);
        if constexpr (kSignFix) {
          dot.add(magnitudes[u], with_sign_of(xu, units[u]));
        } else {
          dot.add(units[u], xu);
        }
      }
      VF total;
      if constexpr (kOffset != 0) {  // the offset * sum(q) the stored weights add, exactly
        total = dot.total_less(kOffset * x.qsums[i]);
      } else {
        total = dot.total();
      }
      sums[r] = fmadd(total, mul(scale, splat(x.scales[i])), sums[r]);
      if constexpr (F::kHasMin) mins[r] = fmadd(min, splat(x.sums[i]), mins[r]);
    }
  }
  if constexpr (F::kHasMin) {
    for (int r = 0; r < R; ++r) sums[r] = add(sums[r], mins[r]);
  }
}

// Rows r0 .. r0 + R of the rounded input against the group whose first row is n0:
// out[r * ldo + n0 ...].
template <typename Group, int R>
void int8_tile(const RoundedInputs& x, int64_t num_blocks, const Group* group, int64_t n0,
               int64_t N, float* out, int64_t ldo) {
  VF sums[R];
  int8_group<Group, R>(x, num_blocks, group, sums);
  const int64_t valid = std::min(kGroup, N - n0);
  for (int r = 0; r < R; ++r) store(out + r * ldo + n0, sums[r], valid);
}

template <typename Group, int R = kRowTile>
void int8_rows(const RoundedInputs& x, int64_t rows, int64_t num_blocks, const Group* group,
               int64_t n0, int64_t N, float* out, int64_t ldo) {
  if constexpr (R > 0) {
    if (rows == R) {
      int8_tile<Group, R>(x, num_blocks, group, n0, N, out, ldo);
    } else {
      int8_rows<Group, R - 1>(x, rows, num_blocks, group, n0, N, out, ldo);
    }
  }
}

// A tile of groups stays in this much cache while every input row passes over it (the
// inputs are read once per tile, from the next level up).
constexpr int64_t kTileBytes = 256 << 10;

template <typename Group>
void qmatmul(const float* x, int64_t M, int64_t K, const Group* w, int64_t N, float* out,
             int64_t ldo, int threads) {
  constexpr int64_t kBlockSize = Format<Group>::kBlock;
  const int64_t num_blocks = K / kBlockSize, groups = (N + kGroup - 1) / kGroup;
  const RoundedInputs rounded = quantize_inputs<kBlockSize>(x, M, K, threads);
  // Tiles of at most kTileBytes, as many as a multiple of the threads (each gets its share).
  const int64_t team = std::max(threads, 1);
  const int64_t fit = std::max<int64_t>(1, kTileBytes / (num_blocks * sizeof(Group)));
  int64_t tiles = (groups + fit - 1) / fit;
  tiles = std::min(groups, (tiles + team - 1) / team * team);
  const int64_t per_tile = (groups + tiles - 1) / tiles;
  tiles = (groups + per_tile - 1) / per_tile;
#pragma omp parallel for num_threads(threads) schedule(static) if (M * N * K >= (1 << 15))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t first = t * per_tile, last = std::min(groups, first + per_tile);
    for (int64_t r0 = 0; r0 < M; r0 += kRowTile) {
      const int64_t rows = std::min<int64_t>(kRowTile, M - r0);
      const RoundedInputs x_rows = rounded.rows_from(r0, K, num_blocks);
      for (int64_t g = first; g < last; ++g) {
        int8_rows<Group>(x_rows, rows, num_blocks, w + g * num_blocks, g * kGroup, N,
                         out + r0 * ldo, ldo);
      }
    }
  }
}
constexpr bool kRoundsInputs = true;
#else
// out[r * ldo + i] = dot(x[r], w[i]) for `rows` (up to 4) expanded weight rows w, K floats
// each.
void dot_rows(const float* x, int64_t M, int64_t K, const float* w, int64_t rows, float* out,
              int64_t ldo) {
  for (int64_t r = 0; r < M; ++r) {
    const float* xr = x + r * K;
    for (int64_t i = 0; i < rows; ++i) {
      const float* wi = w + i * K;
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t k = 0; k < K; ++k) sum += xr[k] * wi[k];
      out[r * ldo + i] = sum;
    }
  }
}

template <typename Group>
void qmatmul(const float* x, int64_t M, int64_t K, const Group* w, int64_t N, float* out,
             int64_t ldo, int threads) {
  const int64_t num_blocks = K / Format<Group>::kBlock, groups = (N + kGroup - 1) / kGroup;
#pragma omp parallel num_threads(threads) if (groups > 1)
  {
    std::vector<float> buffer(kGroup * K);
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t n0 = g * kGroup, rows = std::min(kGroup, N - n0);
      for (int r = 0; r < rows; ++r) expand_row(w + g * num_blocks, num_blocks, r, &buffer[r * K]);
      dot_rows(x, M, K, buffer.data(), rows, out + n0, ldo);
    }
  }
}
constexpr bool kRoundsInputs = false;
#endif

template <typename Group>
void qexpand_rows(const Group* w, int64_t K, const int64_t* ids, int64_t count, float* out,
                     int threads) {
  const int64_t num_blocks = K / Format<Group>::kBlock;
#pragma omp parallel for num_threads(threads) if (count * K >= (1 << 16))
  for (int64_t i = 0; i < count; ++i) {
    const Group* group = w + ids[i] / kGroup * num_blocks;
    expand_row(group, num_blocks, static_cast<int>(ids[i] % kGroup), out + i * K);
  }
}

// Format ids, in kernels/cpu/bindings.py's order.
enum FormatId : int64_t { kQ4 = 0, kQ5 = 1, kQ8 = 2, kIQ4 = 3, kQ6 = 4, kMXFP4 = 5 };

template <typename Fn>
void with_format(int64_t format, Fn&& fn) {
  switch (format) {
    case kQ4: fn(static_cast<const GroupQ4*>(nullptr)); break;
    case kQ5: fn(static_cast<const GroupQ5*>(nullptr)); break;
    case kQ8: fn(static_cast<const GroupQ8*>(nullptr)); break;
    case kIQ4: fn(static_cast<const GroupIQ4*>(nullptr)); break;
    case kQ6: fn(static_cast<const GroupQ6*>(nullptr)); break;
    case kMXFP4: fn(static_cast<const GroupMXFP4*>(nullptr)); break;
  }
}

}  // namespace

// C entry points. Whether quant_matmul rounds its inputs to int8 blocks (twin:
// reference.quant_matmul_int8; AVX2 and up) or not (twin: reference.quant_matmul), and how
// many rows the blocks are interleaved by.
extern "C" int64_t quant_rounds_inputs() { return kRoundsInputs; }
extern "C" int64_t quant_group_rows() { return kGroup; }

// x: [M, K] float32, contiguous; w: the interleaved blocks of [N, K] in `format` (N rounded
// up to whole groups); out: [M, N] with rows ldo floats apart.
extern "C" void quant_matmul(int64_t format, const float* x, int64_t M, int64_t K, const void* w,
                             int64_t N, float* out, int64_t ldo, int threads) {
  with_format(format, [&](auto kind) {
    using Group = std::remove_const_t<std::remove_pointer_t<decltype(kind)>>;
    qmatmul(x, M, K, static_cast<const Group*>(w), N, out, ldo, threads);
  });
}

// out[i] = row ids[i] of W as floats (the embedding lookup of a quantized table).
extern "C" void dequantize_rows(int64_t format, const void* w, int64_t K, const int64_t* ids,
                                int64_t count, float* out, int threads) {
  with_format(format, [&](auto kind) {
    using Group = std::remove_const_t<std::remove_pointer_t<decltype(kind)>>;
    qexpand_rows(static_cast<const Group*>(w), K, ids, count, out, threads);
  });
}
