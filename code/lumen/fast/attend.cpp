// One query's attention over a KV cache, reading only the slots it may see (lumen/fast/attention.py calls
// it for a decoding step; quant.py builds it with quant.cpp, once per machine, with -march=native).
//
// For each query head i of key head g's group, over the allowed slots t:
//
//     s_t = q_i . k_gt / sqrt(hd),    a_t = exp(s_t - max s) / sum exp(s - max s),    y_i = sum_t a_t v_gt
//
// the chapter's attention for T = 1 (lumen/attention.py's plain path), without the copies of each key head
// for its group and without the slots a fixed-size cache holds past the token: a compiled step's loops run
// over every slot, so early in a long cache most of its work was masked away.
#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <vector>

namespace {

// x . y over hd numbers (hd a multiple of 8)
inline float dot(const float* x, const float* y, int64_t hd) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t j = 0; j < hd; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j), acc);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y += a x over hd numbers
inline void add_scaled(float* y, float a, const float* x, int64_t hd) {
  const __m256 av = _mm256_set1_ps(a);
  for (int64_t j = 0; j < hd; j += 8)
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
}

// q (B, h, 1, hd); k, v (B, h_kv, S, hd); allowed (1, S) bool -> (B, h, 1, hd), all float32
at::Tensor attend_one(const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_, const at::Tensor& allowed_) {
  TORCH_CHECK(q_.dim() == 4 && q_.size(2) == 1 && k_.dim() == 4 && v_.sizes() == k_.sizes(), "one query, a cache");
  TORCH_CHECK(q_.scalar_type() == at::kFloat && k_.scalar_type() == at::kFloat && v_.scalar_type() == at::kFloat,
              "float32 queries, keys and values");
  const int64_t B = q_.size(0), h = q_.size(1), hd = q_.size(3), h_kv = k_.size(1), S = k_.size(2);
  TORCH_CHECK(k_.size(0) == B && k_.size(3) == hd && hd % 8 == 0 && h % h_kv == 0, "heads and widths");
  TORCH_CHECK(allowed_.scalar_type() == at::kBool && allowed_.numel() == S, "one allowed flag per slot");
  const at::Tensor q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous(), allowed = allowed_.contiguous();
  at::Tensor y = at::zeros_like(q);
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  const int64_t group = h / h_kv;
  const bool* seen = allowed.data_ptr<bool>();
  std::vector<int64_t> slots;  // the slots the query may see
  for (int64_t t = 0; t < S; ++t)
    if (seen[t]) slots.push_back(t);
  std::vector<float> scores(slots.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < h; ++i) {
      const int64_t g = i / group;
      const float* qi = q.data_ptr<float>() + (b * h + i) * hd;
      const float* kg = k.data_ptr<float>() + (b * h_kv + g) * S * hd;
      const float* vg = v.data_ptr<float>() + (b * h_kv + g) * S * hd;
      float* yi = y.data_ptr<float>() + (b * h + i) * hd;
      float best = -INFINITY;
      for (size_t n = 0; n < slots.size(); ++n) {
        scores[n] = dot(qi, kg + slots[n] * hd, hd) * scale;
        best = std::max(best, scores[n]);
      }
      float total = 0.f;
      for (float& s : scores) total += (s = std::exp(s - best));
      for (size_t n = 0; n < slots.size(); ++n) add_scaled(yi, scores[n] / total, vg + slots[n] * hd, hd);
    }
  }
  return y;
}

}  // namespace

// the schema is attention.py's (torch.library.define); this file gives it a CPU kernel
TORCH_LIBRARY_IMPL(lumen, CPU, m) { m.impl("attend_one", &attend_one); }

// The same kernel as a C function, for an AOTInductor package (lumen/fast/aot.py), as quant.cpp's product.
extern "C" AOTITorchError aoti_torch_cpu_attend_one(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v,
                                                    AtenTensorHandle allowed, AtenTensorHandle* ret0) {
  using namespace torch::aot_inductor;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor y = attend_one(*tensor_handle_to_tensor_pointer(q), *tensor_handle_to_tensor_pointer(k),
                              *tensor_handle_to_tensor_pointer(v), *tensor_handle_to_tensor_pointer(allowed));
    *ret0 = new_tensor_handle(std::move(y));
  });
}
