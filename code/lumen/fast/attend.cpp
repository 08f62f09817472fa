// One query's attention over a KV cache, reading only the slots it may see (lumen/fast/attention.py calls
// it for a decoding step; quant.py builds it with quant.cpp, once per machine, with -march=native; the
// arithmetic, and the instructions each CPU gets, are attend.h's).
//
// For each query head i of key head g's group, over the allowed slots t:
//
//     s_t = q_i . k_gt / sqrt(hd),    a_t = exp(s_t - max s) / sum exp(s - max s),    y_i = sum_t a_t v_gt
//
// the chapter's attention for T = 1 (lumen/attention.py's plain path), without the copies of each key head
// for its group and without the slots a fixed-size cache holds past the token: a compiled step's loops run
// over every slot, so early in a long cache most of its work was masked away.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attend.h"

namespace {

using namespace lumen_attend;

// A cache of at least this many visible slots is read in two halves, each with a softmax of its own, joined
// after (a half's sums scaled by e^(its largest score - the largest of both)): the halves run on two threads
// where torch has two. Whether the slots are halved follows from their number only, so a token's numbers are
// the same at every thread count.
constexpr int64_t HALVES_FROM = 64;

// q (B, h, 1, hd); k, v (B, h_kv, S, hd); allowed (1, S) bool -> (B, h, 1, hd), all float32
at::Tensor attend_one(const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_, const at::Tensor& allowed_) {
  TORCH_CHECK(q_.dim() == 4 && q_.size(2) == 1 && k_.dim() == 4 && v_.sizes() == k_.sizes(), "one query, a cache");
  TORCH_CHECK(q_.scalar_type() == at::kFloat && k_.scalar_type() == at::kFloat && v_.scalar_type() == at::kFloat,
              "float32 queries, keys and values");
  const int64_t B = q_.size(0), h = q_.size(1), hd = q_.size(3), h_kv = k_.size(1), S = k_.size(2);
  TORCH_CHECK(k_.size(0) == B && k_.size(3) == hd && hd % 8 == 0 && h % h_kv == 0, "heads and widths");
  TORCH_CHECK(allowed_.scalar_type() == at::kBool && allowed_.numel() == S, "one allowed flag per slot");
  const at::Tensor q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous(), allowed = allowed_.contiguous();
  at::Tensor y = at::empty_like(q);
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  const int64_t group = h / h_kv;
  const bool* seen = allowed.data_ptr<bool>();
  std::vector<int64_t> slots;  // the slots the query may see
  for (int64_t t = 0; t < S; ++t)
    if (seen[t]) slots.push_back(t);
  const int64_t n = static_cast<int64_t>(slots.size()), halves = n >= HALVES_FROM ? 2 : 1, items = B * h_kv * halves;
  // for each item (row b, key head g, half): its group's scores, and each head's top, total and y
  std::vector<float> scores(B * h * n), ys(items * group * hd, 0.f), tops(items * group), totals(items * group);
  const float *Q = q.data_ptr<float>(), *K = k.data_ptr<float>(), *V = v.data_ptr<float>();
  const auto run = [&](int64_t item) {
    const int64_t b = item / (h_kv * halves), g = item / halves % h_kv, half = item % halves;
    const int64_t lo = half * (n / 2), count = halves == 1 ? n : half == 0 ? n / 2 : n - n / 2;
    const float* qg = Q + (b * h + g * group) * hd;
    const float *kg = K + (b * h_kv + g) * S * hd, *vg = V + (b * h_kv + g) * S * hd;
    float* sc = scores.data() + (b * h + g * group) * n + group * lo;
    float *yp = ys.data() + item * group * hd, *top = tops.data() + item * group, *total = totals.data() + item * group;
    // (the common head widths with their loops unrolled as the code is built)
    if (hd == 64) attend_part<64>(qg, kg, vg, group, hd, slots.data() + lo, count, scale, sc, yp, top, total);
    else if (hd == 128) attend_part<128>(qg, kg, vg, group, hd, slots.data() + lo, count, scale, sc, yp, top, total);
    else attend_part<0>(qg, kg, vg, group, hd, slots.data() + lo, count, scale, sc, yp, top, total);
  };
  if (halves == 2 && at::get_num_threads() > 1 && !at::in_parallel_region()) {
#pragma omp parallel for num_threads(2)
    for (int64_t item = 0; item < items; ++item) run(item);
  } else {
    for (int64_t item = 0; item < items; ++item) run(item);
  }
  // the halves joined: each one's sums scaled by e^(its top - the top of both)
  float* Y = y.data_ptr<float>();
  for (int64_t bg = 0; bg < B * h_kv; ++bg)
    for (int64_t i = 0; i < group; ++i) {
      const int64_t first = bg * halves * group + i;  // (item bg * halves + j holds head i at first + j * group)
      float best = -INFINITY, w[2], sum = 0.f;
      for (int64_t j = 0; j < halves; ++j) best = std::max(best, tops[first + j * group]);
      for (int64_t j = 0; j < halves; ++j)
        sum += (w[j] = std::exp(tops[first + j * group] - best)) * totals[first + j * group];
      const float *y0 = ys.data() + first * hd, *y1 = y0 + group * hd;
      float* yi = Y + (bg * group + i) * hd;
      for (int64_t d = 0; d < hd; ++d) yi[d] = (halves == 1 ? w[0] * y0[d] : w[0] * y0[d] + w[1] * y1[d]) / sum;
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
