// The decoder layers of a model whose linears are all quantized (kernels/cpu/quant.py), float32
// activations, for a batch of decode rows: one call for the whole stack instead of ~10 calls
// per layer from Python. At batch 1 on the default model a step's kernels take ~8 ms and the
// Python between them (module calls, argument checks, allocations) took ~3 ms more.
//
// It calls the library's own entry points in the order runtime/models/llama.py does, so its
// output is the layer-by-layer path's bit for bit (Qwen3's per-head q/k norms excepted: there
// the Python path uses the torch twin, whose sums are ordered differently). LoRA adapters'
// updates are added after each linear as the Python path adds them, by the same kernel.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu_common.h"

extern "C" {
void add_rms_norm_f32(const float* x, float* residual, const float* weight, float* out,
                      int64_t rows, int64_t dim, float eps, int threads);
void silu_mul_f32(const float* gate_up, float* out, int64_t rows, int64_t dim, int threads);
void rope_store_attend_f32(float* qkv, const int64_t* positions, const float* cos,
                           const float* sin, float* k_cache, float* v_cache,
                           const int64_t* slots, int64_t tokens, int64_t heads, int64_t kv_heads,
                           int64_t head_dim, float* out, const int64_t* rows,
                           const int64_t* kv_starts, const int64_t* kv_lens,
                           const int64_t* kv_indices, int64_t num_rows, float scale,
                           float softcap, const float* sinks, int threads);
void quant_matmul(int64_t format, const float* x, int64_t M, int64_t K, const void* w, int64_t N,
                  float* out, int64_t ldo, int threads);
void lora_add_f32(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t tokens, int64_t in,
                  int64_t out, const int64_t* adapters, const braid::LoraWeights* weights,
                  int threads);
}

namespace {

// One quantized linear: its output rows in parts (a GGUF's q, k and v may be stored in
// different formats), each part's blocks in kernels/cpu/quant.py's layout.
struct QuantPart {
  const void* blocks;
  int64_t format;  // kernels/cpu/cpu_quant.cpp's FormatId
  int64_t rows;
};
struct QuantWeight {
  QuantPart parts[3];
  int64_t num_parts;
};

// out[M, N] = x @ w^T, each part into its columns.
void matmul(const float* x, int64_t M, int64_t K, const QuantWeight& w, int64_t N, float* out,
            int threads) {
  int64_t column = 0;
  for (int64_t p = 0; p < w.num_parts; ++p) {
    const QuantPart& part = w.parts[p];
    quant_matmul(part.format, x, M, K, part.blocks, part.rows, out + column, N, threads);
    column += part.rows;
  }
}

}  // namespace

// Mirrored by ctypes Structures in kernels/cpu/bindings.py: keep the field order.
struct QuantDecoderLayer {
  const float* input_norm;
  const float* post_attention_norm;
  const float* q_norm;  // per-head norms (Qwen3), or null
  const float* k_norm;
  QuantWeight qkv, o, gate_up, down;
  float* k_cache;  // this layer's KV pool [slots, kv_heads, head_dim]
  float* v_cache;
};

struct QuantDecoderShape {
  int64_t hidden, heads, kv_heads, head_dim, intermediate;
  float eps, scale;
};

// The decode rows' tokens: what rope_store_attend takes.
struct QuantDecoderBatch {
  int64_t tokens;
  const int64_t* positions;
  const int64_t* slots;  // where each token's K/V is stored
  const int64_t *rows, *kv_starts, *kv_lens, *kv_indices;
  int64_t num_rows;
  const float *cos, *sin;
  // LoRA, or null: token t's adapter (an index into each linear's pairs, or -1), and the
  // pairs of layer l's linear k (kLora*) at lora_weights + (l * kLoraLinears + k) * lora_count,
  // for the first lora_layers layers.
  const int64_t* lora_adapters;
  const braid::LoraWeights* lora_weights;
  int64_t lora_count, lora_layers;
  // Hidden states copied out for draft heads (EAGLE-3), or null: the residual stream
  // entering layer capture_layers[c] goes to captured[t, c, :] ([tokens, num_captures,
  // hidden]); the stream itself is untouched.
  const int64_t* capture_layers;
  int64_t num_captures;
  float* captured;
};

// The linears in the order of the LoRA pairs (kernels/cpu/bindings.py's LORA_LINEARS).
enum LoraLinear : int64_t { kLoraQkv, kLoraO, kLoraGateUp, kLoraDown, kLoraLinears };

namespace {

// out [M, out_size] += layer l's LoRA update of `linear` for x [M, in_size], where any.
void add_lora(const QuantDecoderBatch& batch, int64_t l, LoraLinear linear, const float* x,
              int64_t in_size, float* out, int64_t out_size, int threads) {
  if (batch.lora_adapters == nullptr || l >= batch.lora_layers) return;
  const braid::LoraWeights* pairs =
      batch.lora_weights + (l * kLoraLinears + linear) * batch.lora_count;
  lora_add_f32(x, in_size, out, out_size, batch.tokens, in_size, out_size, batch.lora_adapters,
               pairs, threads);
}

// Layer l's input (residual, with the previous layer's output already added in) into the
// captured columns that ask for it.
void capture_stream(const QuantDecoderBatch& batch, int64_t l, const float* residual,
                    int64_t hidden) {
  for (int64_t c = 0; c < batch.num_captures; ++c) {
    if (batch.capture_layers[c] != l) continue;
    for (int64_t t = 0; t < batch.tokens; ++t) {
      const float* src = residual + t * hidden;
      std::copy(src, src + hidden, batch.captured + (t * batch.num_captures + c) * hidden);
    }
  }
}

}  // namespace

// residual [tokens, hidden]: the embeddings, updated in place as the layers add into it.
// out [tokens, hidden]: the last layer's MLP output (which the final norm adds in).
extern "C" void quant_decode_layers(const QuantDecoderLayer* layers, int64_t num_layers,
                                    const QuantDecoderShape* shape,
                                    const QuantDecoderBatch* batch, float* residual, float* out,
                                    int threads) {
  const QuantDecoderShape& s = *shape;
  const int64_t M = batch->tokens, D = s.head_dim;
  const int64_t q_size = s.heads * D, qkv_size = (s.heads + 2 * s.kv_heads) * D;
  std::vector<float> h(M * s.hidden), qkv(M * qkv_size), attn(M * q_size), o(M * s.hidden);
  std::vector<float> gate_up(M * 2 * s.intermediate), act(M * s.intermediate);
  for (int64_t l = 0; l < num_layers; ++l) {
    const QuantDecoderLayer& L = layers[l];
    add_rms_norm_f32(l == 0 ? nullptr : out, residual, L.input_norm, h.data(), M, s.hidden,
                     s.eps, threads);
    capture_stream(*batch, l, residual, s.hidden);
    matmul(h.data(), M, s.hidden, L.qkv, qkv_size, qkv.data(), threads);
    add_lora(*batch, l, kLoraQkv, h.data(), s.hidden, qkv.data(), qkv_size, threads);
    if (L.q_norm != nullptr) {  // in place on each token's q heads, then its k heads
      for (int64_t t = 0; t < M; ++t) {
        float* q = qkv.data() + t * qkv_size;
        add_rms_norm_f32(nullptr, q, L.q_norm, q, s.heads, D, s.eps, 1);
        add_rms_norm_f32(nullptr, q + q_size, L.k_norm, q + q_size, s.kv_heads, D, s.eps, 1);
      }
    }
    rope_store_attend_f32(qkv.data(), batch->positions, batch->cos, batch->sin, L.k_cache,
                          L.v_cache, batch->slots, M, s.heads, s.kv_heads, D, attn.data(),
                          batch->rows, batch->kv_starts, batch->kv_lens, batch->kv_indices,
                          batch->num_rows, s.scale, /*softcap=*/0.0f, /*sinks=*/nullptr,
                          threads);
    matmul(attn.data(), M, q_size, L.o, s.hidden, o.data(), threads);
    add_lora(*batch, l, kLoraO, attn.data(), q_size, o.data(), s.hidden, threads);
    add_rms_norm_f32(o.data(), residual, L.post_attention_norm, h.data(), M, s.hidden, s.eps,
                     threads);
    matmul(h.data(), M, s.hidden, L.gate_up, 2 * s.intermediate, gate_up.data(), threads);
    add_lora(*batch, l, kLoraGateUp, h.data(), s.hidden, gate_up.data(), 2 * s.intermediate,
             threads);
    silu_mul_f32(gate_up.data(), act.data(), M, s.intermediate, threads);
    matmul(act.data(), M, s.intermediate, L.down, s.hidden, out, threads);
    add_lora(*batch, l, kLoraDown, act.data(), s.intermediate, out, s.hidden, threads);
  }
}
