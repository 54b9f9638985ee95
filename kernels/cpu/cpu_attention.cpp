// The attention half of a decoder layer on the CPU: RoPE with the KV-pool store (as
// kernels.reference.rope_store_kv), and paged decode attention (as
// kernels.reference.decode_attention), one query token per row over its sequence's slots of
// the KV pool [slots, kv_heads, head_dim]; or both in one parallel region, which saves a
// call and a fork per layer. Built into one library with cpu.cpp (see there).
//
// The attention contract, for both implementations below: row rows[i] of q (stride q_stride between
// tokens, heads packed [heads, head_dim]) attends the kv_lens[i] slots at kv_indices +
// kv_starts[i], and the result goes to row rows[i] of out [tokens, heads, head_dim]. A row's
// result depends on its q and its slots only, never on the other rows of the call. A work
// item is one KV head of one chunk of 256 slots (kChunk) of a row, or of a group of rows
// that read the same slots (AVX-512); the chunks' softmaxes are merged after. A chunk's
// scores are kept whole (they fit in cache); softmax and sums are float32. A sequence's
// slots are scattered over the pool, where the hardware cannot guess them, so the rows about
// to be read are prefetched.
//
// Two options change the softmax: `softcap` > 0 caps each scaled score as
// softcap * tanh(score / softcap) first (Gemma 2), and `sinks`, when not null, holds a logit
// per query head that joins the denominator with no value (GPT-OSS):
// out = sum_l e^s_l v_l / (sum_l e^s_l + e^sink).

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include "cpu_common.h"

namespace {

using namespace braid;

// Softmax numerators exp(s - top) of s[0, len), in place (-inf scores, padding, give 0), top
// the max of s and `sink`; returns 1 / (their sum + exp(sink - top)), and top in *max_out if
// given. A sink of -inf is none.
inline float softmax_numerators(float* s, int64_t len, float* max_out = nullptr,
                                float sink = -INFINITY) {
  float top = sink;
#pragma omp simd reduction(max : top)
  for (int64_t l = 0; l < len; ++l) top = s[l] > top ? s[l] : top;
  if (max_out != nullptr) *max_out = top;
  float total = sink == -INFINITY ? 0.0f : exp_approx(sink - top);
#pragma omp simd reduction(+ : total)
  for (int64_t l = 0; l < len; ++l) {
    s[l] = s[l] == -INFINITY ? 0.0f : exp_approx(s[l] - top);
    total += s[l];
  }
  return 1.0f / total;
}

// Scores capped in place as cap * tanh(s / cap); -inf (padding) stays -inf.
inline void soft_cap(float* s, int64_t len, float cap) {
  const float inv = 1.0f / cap;
#pragma omp simd
  for (int64_t l = 0; l < len; ++l) {
    s[l] = s[l] == -INFINITY ? s[l] : cap * tanh_approx(s[l] * inv);
  }
}

template <typename T>
inline void prefetch_bytes(const T* p, int64_t bytes, bool to_l1) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) {
    if (to_l1) {
      __builtin_prefetch(c + b, 0, 3);
    } else {
      __builtin_prefetch(c + b, 0, 2);
    }
  }
}

// RoPE and the KV store of `tokens` new tokens. Rows of qkv are [q heads | k heads | v heads],
// each head_dim wide. q and k are rotated in place (half-split layout, float32 tables
// [positions, head_dim / 2]); k and v are copied to their slot of the pool.
template <typename T>
struct RopeStore {
  T* qkv;
  const int64_t* positions;
  const float* cos;
  const float* sin;
  T* k_cache;
  T* v_cache;
  const int64_t* slots;
  int64_t tokens, heads, kv_heads, head_dim;
};

struct RowChunks;

// The work of one decode attention call (the contract above).
template <typename T>
struct DecodeRows {
  const T* q;
  int64_t q_stride;
  const T* k_cache;
  const T* v_cache;
  T* out;
  const int64_t* rows;
  const int64_t* kv_starts;
  const int64_t* kv_lens;
  const int64_t* kv_indices;
  int64_t num_rows, heads, kv_heads, head_dim;
  float scale;
  float softcap;       // > 0: scores capped (the options above)
  const float* sinks;  // [heads] float32, or null
  RowChunks* chunks;   // the portable path's plan (below)

  float sink(int64_t head) const { return sinks == nullptr ? -INFINITY : sinks[head]; }
};

// Contexts longer than this are cut into chunks, one work item each, whose partial softmaxes
// are merged: at batch 1 a row's few KV heads alone leave threads idle (SmolLM2's 3 on 2
// threads). A row's chunks follow from its own length only, so its result does not depend on
// the rest of the batch (a decode row and a verification row over the same slots come out
// the same), and rows up to this length are attended exactly as without chunks.
constexpr int64_t kChunk = 256;

inline int64_t num_chunks(int64_t len) { return len <= kChunk ? 1 : (len + kChunk - 1) / kChunk; }

// Whether attend_rows takes the portable path for heads of this size.
inline bool portable_heads(int64_t head_dim) {
#if defined(__AVX512F__)
  return head_dim != 64 && head_dim != 128;
#else
  return head_dim > 0;
#endif
}

// Consecutive rows whose slot lists start at the same slot (a draft tree's nodes over their
// prefix, a prefill chunk's rows over the run before them), at most kGroupRows of them: the
// AVX-512 path attends a group together, each block of K and V read once for all its rows.
constexpr int64_t kGroupRows = 8;

std::vector<int64_t> row_groups(const int64_t* kv_starts, const int64_t* kv_lens,
                                const int64_t* kv_indices, int64_t num_rows) {
  std::vector<int64_t> first{0};
  for (int64_t i = 1; i < num_rows; ++i) {
    const bool same = kv_lens[i] > 0 && kv_lens[i - 1] > 0 &&
                      kv_indices[kv_starts[i]] == kv_indices[kv_starts[i - 1]];
    if (!same || i - first.back() == kGroupRows) first.push_back(i);
  }
  first.push_back(num_rows);
  return first;
}

// One call's plan, built before its parallel region. Work items: on the portable path row
// i's start at first[i]; on the AVX-512 path `groups` holds the row groups' bounds and group
// j's items start at first[j] (one per chunk of its longest row and KV head). Row i's
// partials start at split[i] (long rows only): per chunk and KV head, each query head's max,
// sum and weighted V.
struct RowChunks {
  std::vector<int64_t> groups, first, split;
  std::vector<float> partials;

  RowChunks(const int64_t* kv_starts, const int64_t* kv_lens, const int64_t* kv_indices,
            int64_t num_rows, int64_t heads, int64_t kv_heads, int64_t head_dim)
      : split(num_rows + 1, 0) {
    if (portable_heads(head_dim)) {
      first.assign(num_rows + 1, 0);
      for (int64_t i = 0; i < num_rows; ++i) {
        first[i + 1] = first[i] + num_chunks(kv_lens[i]) * kv_heads;
      }
    } else {
      groups = row_groups(kv_starts, kv_lens, kv_indices, num_rows);
      first.assign(groups.size(), 0);
      for (size_t j = 0; j + 1 < groups.size(); ++j) {
        int64_t longest = 0;
        for (int64_t i = groups[j]; i < groups[j + 1]; ++i) longest = std::max(longest, kv_lens[i]);
        first[j + 1] = first[j] + num_chunks(longest) * kv_heads;
      }
    }
    for (int64_t i = 0; i < num_rows; ++i) {
      const int64_t chunks = num_chunks(kv_lens[i]);
      split[i + 1] = split[i] + (chunks > 1 ? chunks * kv_heads : 0);
    }
    partials.resize(split[num_rows] * (heads / kv_heads) * (head_dim + 2));
  }
  int64_t num_items() const { return first.back(); }
};

// The functions named *_rows share out their loop among the threads of the parallel region
// they are called in (an orphaned omp for, with its barrier at the end).

template <typename T>
void rope_store_rows(const RopeStore<T>& r) {
  const int64_t half = r.head_dim / 2;
  const int64_t row = (r.heads + 2 * r.kv_heads) * r.head_dim;
  const int64_t kv_row = r.kv_heads * r.head_dim;
#pragma omp for
  for (int64_t t = 0; t < r.tokens; ++t) {
    T* x = r.qkv + t * row;
    const float* c = r.cos + r.positions[t] * half;
    const float* s = r.sin + r.positions[t] * half;
    for (int64_t h = 0; h < r.heads + r.kv_heads; ++h) {
      T* x1 = x + h * r.head_dim;
      T* x2 = x1 + half;
#if defined(__AVX512F__)
      // bfloat16's rounding is what costs: 64 tokens of SmolLM2's 12 q/k heads, with the
      // store, 15.6 -> 7.5 us on one thread. In float32 the loop below is as fast.
      if (std::is_same<T, bf16>::value && vector_rows<T>(half)) {
        for (int64_t i = 0; i < half; i += 16) {
          const __m512 a = load16(x1 + i), b = load16(x2 + i);
          const __m512 ci = _mm512_loadu_ps(c + i), si = _mm512_loadu_ps(s + i);
          store16(x1 + i, _mm512_fmsub_ps(a, ci, _mm512_mul_ps(b, si)));
          store16(x2 + i, _mm512_fmadd_ps(b, ci, _mm512_mul_ps(a, si)));
        }
        continue;
      }
#endif
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        float a = to_float(x1[i]), b = to_float(x2[i]);
        x1[i] = from_float<T>(a * c[i] - b * s[i]);
        x2[i] = from_float<T>(b * c[i] + a * s[i]);
      }
    }
    std::memcpy(r.k_cache + r.slots[t] * kv_row, x + r.heads * r.head_dim, kv_row * sizeof(T));
    std::memcpy(r.v_cache + r.slots[t] * kv_row, x + (r.heads + r.kv_heads) * r.head_dim,
                kv_row * sizeof(T));
  }
}

// ---- portable: any head size, any x86 or ARM vector unit the compiler targets -----------------

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
  if (n == 256) return dot_fixed<256>(a, b);
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
  if (n == 256) return axpy_fixed<256>(w, x, y);
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

// Long rows (more than one chunk): their chunks' softmaxes rescaled to the largest max and
// summed, in chunk order. Called past the barrier of the loop that wrote the partials.
template <typename T>
void merge_chunks(const DecodeRows<T>& a) {
  const int64_t head_dim = a.head_dim, kv_heads = a.kv_heads;
  const int64_t group = a.heads / kv_heads;
  const int64_t partial_size = group * (head_dim + 2);
  const std::vector<int64_t>& split = a.chunks->split;
  const float* partials = a.chunks->partials.data();
  std::vector<float> acc(head_dim);
#pragma omp for schedule(dynamic, 1)
  for (int64_t pair = 0; pair < a.num_rows * kv_heads; ++pair) {
    const int64_t i = pair / kv_heads, kvh = pair % kv_heads;
    const int64_t chunks = num_chunks(a.kv_lens[i]);
    if (chunks == 1) continue;
    const float* base = partials + split[i] * partial_size;
    T* o = a.out + (a.rows[i] * a.heads + kvh * group) * head_dim;
    for (int64_t g = 0; g < group; ++g) {
      const float sink = a.sink(kvh * group + g);
      float top = sink, total = 0.0f;
      for (int64_t c = 0; c < chunks; ++c) {
        top = std::max(top, base[(c * kv_heads + kvh) * partial_size + g]);
      }
      if (sink != -INFINITY) total = exp_approx(sink - top);
      std::fill(acc.begin(), acc.begin() + head_dim, 0.0f);
      for (int64_t c = 0; c < chunks; ++c) {
        const float* p = base + (c * kv_heads + kvh) * partial_size;
        const float w = exp_approx(p[g] - top);
        total += w * p[group + g];
        axpy(w, p + 2 * group + g * head_dim, acc.data(), head_dim);
      }
      for (int64_t d = 0; d < head_dim; ++d) {
        o[g * head_dim + d] = from_float<T>(acc[d] / total);
      }
    }
  }
}

template <typename T>
void attend_rows_portable(const DecodeRows<T>& a) {
  // A work item is one chunk of a row's slots for the query heads of one KV head: at batch 1
  // a row alone would leave every thread but one idle. Each slot's K (then V) row of that head
  // is read once and converted once for all the query heads that read it.
  const int64_t head_dim = a.head_dim, kv_heads = a.kv_heads;
  const int64_t group = a.heads / kv_heads;
  const int64_t kv_row = kv_heads * head_dim;
  const int64_t partial_size = group * (head_dim + 2);  // per item: maxes, sums, weighted V
  constexpr int64_t kAhead = 16;  // slots prefetched ahead of the one being read
  auto prefetch = [&](const T* base, int64_t slot) {
    prefetch_bytes(base + slot * kv_row, head_dim * sizeof(T), true);
  };
  const std::vector<int64_t>&first = a.chunks->first, &split = a.chunks->split;
  float* partials = a.chunks->partials.data();  // each item writes only its own
  std::vector<float> scores, acc(group * head_dim), qf(group * head_dim), row_f(head_dim);
#pragma omp for schedule(dynamic, 1)
  for (int64_t item = 0; item < a.chunks->num_items(); ++item) {
    const int64_t i = std::upper_bound(first.begin(), first.end(), item) - first.begin() - 1;
    const int64_t local = item - first[i], kvh = local % kv_heads, chunk = local / kv_heads;
    const int64_t len = a.kv_lens[i], chunks = num_chunks(len);
    const int64_t l0 = chunk * kChunk, n = std::min(len, l0 + kChunk) - l0;
    const int64_t* slot = a.kv_indices + a.kv_starts[i] + l0;
    const T* q_heads = a.q + a.rows[i] * a.q_stride + kvh * group * head_dim;
    const T* k_head = a.k_cache + kvh * head_dim;
    const T* v_head = a.v_cache + kvh * head_dim;
    for (int64_t j = 0; j < group * head_dim; ++j) qf[j] = to_float(q_heads[j]) * a.scale;
    scores.resize(group * n);
    for (int64_t l = 0; l < n; ++l) {
      if (l + kAhead < n) prefetch(k_head, slot[l + kAhead]);
      const float* k = as_float(k_head + slot[l] * kv_row, head_dim, row_f.data());
      for (int64_t g = 0; g < group; ++g) {
        scores[g * n + l] = dot(qf.data() + g * head_dim, k, head_dim);
      }
    }
    float* partial = chunks > 1 ? partials + (split[i] + local) * partial_size : nullptr;
    for (int64_t g = 0; g < group; ++g) {
      float* s = scores.data() + g * n;
      if (a.softcap > 0.0f) soft_cap(s, n, a.softcap);
      float top;
      // A long row's sink joins once, where its chunks are merged.
      const float sink = partial == nullptr ? a.sink(kvh * group + g) : -INFINITY;
      const float inv = softmax_numerators(s, n, &top, sink);
      if (partial == nullptr) {  // the whole row: normalise now
        for (int64_t l = 0; l < n; ++l) s[l] *= inv;
      } else {
        partial[g] = top, partial[group + g] = 1.0f / inv;
      }
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t l = 0; l < n; ++l) {
      if (l + kAhead < n) prefetch(v_head, slot[l + kAhead]);
      const float* v = as_float(v_head + slot[l] * kv_row, head_dim, row_f.data());
      for (int64_t g = 0; g < group; ++g) {
        axpy(scores[g * n + l], v, acc.data() + g * head_dim, head_dim);
      }
    }
    if (partial != nullptr) {
      std::copy(acc.begin(), acc.end(), partial + 2 * group);
      continue;
    }
    T* o = a.out + (a.rows[i] * a.heads + kvh * group) * head_dim;
    for (int64_t j = 0; j < group * head_dim; ++j) o[j] = from_float<T>(acc[j]);
  }
  merge_chunks(a);  // past the loop's barrier: every chunk is done
}

// ---- AVX-512, heads of 64 or 128 -------------------------------------------------------------
// The portable path spends most of its time on horizontal sums (one per slot and query head)
// and on reloading its float32 accumulators. Here the dot products of 16 slots are summed out
// of their vectors together, and each KV head's weighted sum of V keeps the accumulators of
// its query heads in registers.
#if defined(__AVX512F__)

// Lane j of the result is the sum of v[j]'s 16 lanes: a tree of shuffles and adds, three
// instructions per sum where summing each vector alone takes eight.
inline __m512 sum_lanes16(const __m512* v) {
  __m512 a[8], b[4], c[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // a[i]: [v[2i] folded to 8 lanes | v[2i + 1] folded to 8]
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // quarter k of b[i]: v[4i + k] folded to 4 lanes
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {  // quarter k of c[i]: v[8i + k], then v[8i + 4 + k], 2 lanes each
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
  }
  // Lane 4k + j: the sum of v[k + 4j]; the permutation puts the sum of v[m] in lane m.
  const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88),
                                 _mm512_shuffle_ps(c[0], c[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, d);
}

// A query head held in registers; dot(k) is a vector whose lanes sum to q . k.
template <typename T, int D>
struct QueryHead {
  __m512 q[D / 16];
  explicit QueryHead(const T* x) {
#pragma GCC unroll 8
    for (int i = 0; i < D / 16; ++i) q[i] = load16(x + 16 * i);
  }
  __m512 dot(const T* k) const {
    __m512 s = _mm512_mul_ps(q[0], load16(k));
#pragma GCC unroll 8
    for (int i = 1; i < D / 16; ++i) s = _mm512_fmadd_ps(q[i], load16(k + 16 * i), s);
    return s;
  }
};

#if defined(__AVX512BF16__)
// bfloat16 pairs multiplied and added into float32 lanes by one instruction (vdpbf16ps). The
// product of two bfloat16 is exact in float32, as after converting them.
template <int D>
struct QueryHead<bf16, D> {
  __m512bh q[D / 32];
  explicit QueryHead(const bf16* x) {
#pragma GCC unroll 4
    for (int i = 0; i < D / 32; ++i) q[i] = (__m512bh)_mm512_loadu_si512(x + 32 * i);
  }
  __m512 dot(const bf16* k) const {
    __m512 s = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < D / 32; ++i) {
      s = _mm512_dpbf16_ps(s, q[i], (__m512bh)_mm512_loadu_si512(k + 32 * i));
    }
    return s;
  }
};
#endif

// scale * (q . K) for the head at `offset` of 16 K rows into out[a]: -inf for a >= n (those
// rows repeat row n - 1), so that the softmax runs over whole vectors.
template <typename T, int D>
inline void score16(const QueryHead<T, D>& q, const T* const* rows, int64_t offset, int n,
                    float scale, float* out) {
  __m512 dots[16];
#pragma GCC unroll 16
  for (int a = 0; a < 16; ++a) dots[a] = q.dot(rows[a] + offset);
  const __m512 s = _mm512_mul_ps(sum_lanes16(dots), _mm512_set1_ps(scale));
  const __mmask16 real = static_cast<__mmask16>((1u << n) - 1);
  _mm512_storeu_ps(out, _mm512_mask_blend_ps(real, _mm512_set1_ps(-INFINITY), s));
}

// out[g] += sum over l in [l0, l1) of p[g * p_stride + l] * V row l, for G query heads of
// one KV head. Summing a row's slots in pieces (out kept between them) adds the same products
// in the same order as one pass: a row's result does not depend on how its slots were cut.
template <typename T, int D, int G>
void weighted_v(const float* p, int64_t p_stride, const T* v_head, const int64_t* slot,
                int64_t l0, int64_t l1, int64_t kv_row, float* out) {
  __m512 acc[G][D / 16];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
    for (int i = 0; i < D / 16; ++i) acc[g][i] = _mm512_loadu_ps(out + g * D + 16 * i);
  }
  for (int64_t l = l0; l < l1; ++l) {
    const T* v = v_head + slot[l] * kv_row;
    __m512 x[D / 16];
#pragma GCC unroll 8
    for (int i = 0; i < D / 16; ++i) x[i] = load16(v + 16 * i);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * p_stride + l]);
#pragma GCC unroll 8
      for (int i = 0; i < D / 16; ++i) acc[g][i] = _mm512_fmadd_ps(w, x[i], acc[g][i]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
    for (int i = 0; i < D / 16; ++i) _mm512_storeu_ps(out + g * D + 16 * i, acc[g][i]);
  }
}

// weighted_v for g query heads, g <= G: G heads' accumulators fill 16 registers.
template <typename T, int D, int G = 256 / D>
void weighted_v_heads(int g, const float* p, int64_t p_stride, const T* v_head,
                      const int64_t* slot, int64_t l0, int64_t l1, int64_t kv_row, float* out) {
  if (g == G) return weighted_v<T, D, G>(p, p_stride, v_head, slot, l0, l1, kv_row, out);
  if constexpr (G > 1) {
    weighted_v_heads<T, D, G - 1>(g, p, p_stride, v_head, slot, l0, l1, kv_row, out);
  }
}

// A group's rows (RowChunks) are attended together, slot block by slot block, so each block
// of K and V is read from memory once for all of them instead of once per row; a row's own
// arithmetic (its scores, softmax and sums) is the same whichever rows it is grouped with.
constexpr int64_t kBlock = 64;  // slots of V summed per row before the next row's turn

template <typename T, int D>
void attend_rows_avx512(const DecodeRows<T>& a) {
  const int64_t heads = a.heads, kv_heads = a.kv_heads;
  const int64_t group = heads / kv_heads;
  const int64_t kv_row = kv_heads * D;
  const int64_t partial_size = group * (D + 2);
  constexpr int kHeadsPerCall = 256 / D;  // query heads per weighted_v call
  const std::vector<int64_t>&groups = a.chunks->groups, &first = a.chunks->first;
  const std::vector<int64_t>& split = a.chunks->split;
  float* partials = a.chunks->partials.data();  // each item writes only its own
  std::vector<float> scores, acc, inv;
  // A work item is one chunk of a group's slots for the query heads of one KV head: a lone
  // row (batch-1 decoding) still spreads over the threads.
#pragma omp for schedule(dynamic, 1)
  for (int64_t item = 0; item < a.chunks->num_items(); ++item) {
    const int64_t j = std::upper_bound(first.begin(), first.end(), item) - first.begin() - 1;
    const int64_t local = item - first[j], kvh = local % kv_heads, chunk = local / kv_heads;
    const int64_t row0 = groups[j], rows = groups[j + 1] - row0, c0 = chunk * kChunk;
    int64_t longest = 0;  // of the rows' slots in this chunk
    std::vector<int64_t> n(rows), offset(rows + 1, 0);  // each row's scores: `group` runs
    for (int64_t r = 0; r < rows; ++r) {
      n[r] = std::max<int64_t>(0, std::min(a.kv_lens[row0 + r], c0 + kChunk) - c0);
      longest = std::max(longest, n[r]);
      offset[r + 1] = offset[r] + group * ((n[r] + 15) / 16 * 16);
    }
    scores.resize(offset[rows]);
    acc.assign(rows * group * D, 0.0f);
    inv.resize(rows * group);
    for (int64_t l0 = 0; l0 < longest; l0 += 16) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = row0 + r, len = n[r];
        if (l0 >= len) continue;
        const int m = static_cast<int>(std::min<int64_t>(16, len - l0));
        const int64_t* slot = a.kv_indices + a.kv_starts[i] + c0;
        for (int64_t l = l0 + 16; l < std::min(l0 + 32, len); ++l) {  // the next block's K
          prefetch_bytes(a.k_cache + slot[l] * kv_row + kvh * D, D * sizeof(T), true);
        }
        const T* k[16];
        for (int x = 0; x < 16; ++x) k[x] = a.k_cache + slot[l0 + std::min(x, m - 1)] * kv_row;
        const int64_t padded = (len + 15) / 16 * 16;
        const T* q_row = a.q + a.rows[i] * a.q_stride;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          score16(QueryHead<T, D>(q_row + h * D), k, kvh * D, m, a.scale,
                  scores.data() + offset[r] + g * padded + l0);
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (n[r] == 0) continue;
      const int64_t i = row0 + r, padded = (n[r] + 15) / 16 * 16;
      // A long row's sink joins once, where its chunks are merged.
      float* partial = num_chunks(a.kv_lens[i]) > 1
                           ? partials + (split[i] + local) * partial_size
                           : nullptr;
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + offset[r] + g * padded;
        if (a.softcap > 0.0f) soft_cap(s, padded, a.softcap);
        float top;
        const float sink = partial == nullptr ? a.sink(kvh * group + g) : -INFINITY;
        inv[r * group + g] = softmax_numerators(s, padded, &top, sink);
        if (partial != nullptr) partial[g] = top, partial[group + g] = 1.0f / inv[r * group + g];
      }
    }
    for (int64_t l0 = 0; l0 < longest; l0 += kBlock) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = row0 + r, len = n[r];
        if (l0 >= len) continue;
        const int64_t l1 = std::min(len, l0 + kBlock), padded = (len + 15) / 16 * 16;
        const int64_t* slot = a.kv_indices + a.kv_starts[i] + c0;
        for (int64_t l = l0; l < l1; ++l) {
          prefetch_bytes(a.v_cache + slot[l] * kv_row + kvh * D, D * sizeof(T), false);
        }
        for (int64_t g = 0; g < group; g += kHeadsPerCall) {
          const int c = static_cast<int>(std::min<int64_t>(kHeadsPerCall, group - g));
          weighted_v_heads<T, D>(c, scores.data() + offset[r] + g * padded, padded,
                                 a.v_cache + kvh * D, slot, l0, l1, kv_row,
                                 acc.data() + (r * group + g) * D);
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (n[r] == 0) continue;
      const int64_t i = row0 + r;
      const float* x = acc.data() + r * group * D;
      if (num_chunks(a.kv_lens[i]) > 1) {  // its weighted V joins the partial
        std::copy(x, x + group * D, partials + (split[i] + local) * partial_size + 2 * group);
        continue;
      }
      T* o = a.out + (a.rows[i] * heads + kvh * group) * D;
      for (int64_t g = 0; g < group; ++g) {
        const __m512 w = _mm512_set1_ps(inv[r * group + g]);
        for (int64_t d = 0; d < D; d += 16) {
          store16(o + g * D + d, _mm512_mul_ps(w, _mm512_loadu_ps(x + g * D + d)));
        }
      }
    }
  }
  merge_chunks(a);  // past the loop's barrier: every chunk is done
}

#endif  // __AVX512F__

template <typename T>
void attend_rows(const DecodeRows<T>& a) {
#if defined(__AVX512F__)
  if (a.head_dim == 64 || a.head_dim == 128) {
    if (a.head_dim == 64) return attend_rows_avx512<T, 64>(a);
    return attend_rows_avx512<T, 128>(a);
  }
#endif
  attend_rows_portable(a);  // portable_heads(a.head_dim)
}

}  // namespace

// C entry points, one per storage type: _f32 (float) and _bf16 (bfloat16 as uint16_t). With
// the last two groups of arguments of rope_store_attend: RoPE and the store of every token
// first, then (past the barrier that ends the first loop) the decode rows' attention, which
// reads the slots just stored. softcap 0 and sinks null: neither option.
#define BRAID_ROPE_ARGS(T)                                                                    \
  T *qkv, const int64_t *positions, const float *cos, const float *sin, T *k_cache,          \
      T *v_cache, const int64_t *slots, int64_t tokens, int64_t heads, int64_t kv_heads,     \
      int64_t head_dim
#define BRAID_ROWS_ARGS                                                                        \
  const int64_t *rows, const int64_t *kv_starts, const int64_t *kv_lens,                     \
      const int64_t *kv_indices, int64_t num_rows
#define BRAID_ATTENTION_ENTRIES(SUFFIX, T)                                                     \
  extern "C" void rope_store_kv_##SUFFIX(BRAID_ROPE_ARGS(T), int threads) {                  \
    const RopeStore<T> r{qkv,    positions, cos,      sin,     k_cache, v_cache,              \
                         slots,  tokens,    heads,    kv_heads, head_dim};                     \
    const int64_t work = tokens * (heads + 2 * kv_heads) * head_dim;                           \
    _Pragma("omp parallel num_threads(threads) if (work >= kMinParallelWork)")                \
    rope_store_rows(r);                                                                        \
  }                                                                                            \
  extern "C" void decode_attention_##SUFFIX(                                                   \
      const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, T* out,                \
      BRAID_ROWS_ARGS, int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,         \
      float softcap, const float* sinks, int threads) {                                        \
    RowChunks chunks(kv_starts, kv_lens, kv_indices, num_rows, heads, kv_heads, head_dim);     \
    const DecodeRows<T> a{q,         q_stride,   k_cache, v_cache, out,      rows,             \
                          kv_starts, kv_lens,    kv_indices, num_rows, heads, kv_heads,        \
                          head_dim,  scale,      softcap, sinks,   &chunks};                   \
    _Pragma("omp parallel num_threads(threads)") attend_rows(a);                              \
  }                                                                                            \
  extern "C" void rope_store_attend_##SUFFIX(BRAID_ROPE_ARGS(T), T* out, BRAID_ROWS_ARGS,     \
                                             float scale, float softcap, const float* sinks,  \
                                             int threads) {                                   \
    const RopeStore<T> r{qkv,    positions, cos,      sin,     k_cache, v_cache,              \
                         slots,  tokens,    heads,    kv_heads, head_dim};                     \
    RowChunks chunks(kv_starts, kv_lens, kv_indices, num_rows, heads, kv_heads, head_dim);     \
    const DecodeRows<T> a{qkv,       (heads + 2 * kv_heads) * head_dim, k_cache, v_cache,     \
                          out,       rows, kv_starts, kv_lens, kv_indices, num_rows, heads,    \
                          kv_heads,  head_dim, scale, softcap, sinks, &chunks};                \
    _Pragma("omp parallel num_threads(threads)") {                                            \
      rope_store_rows(r);                                                                      \
      attend_rows(a);                                                                          \
    }                                                                                          \
  }

BRAID_ATTENTION_ENTRIES(f32, float)
BRAID_ATTENTION_ENTRIES(bf16, bf16)
