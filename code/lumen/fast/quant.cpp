// lumen's block kernels: x @ w.T for one float32 row x, computed from a GGUF matrix's own blocks
// (lumen/quant.py explains the blocks; it builds this file once per machine, with -march=native).
//
// x is rounded to 8 bits per block of 32, as llama.cpp rounds it: xq = round(x / dx), dx = max|x| / 127.
// A block's products are then integers, summed exactly, and scaled once:
//
//     Q8_0:  y_o = sum_b  d_ob dx_b (sum_j q_obj xq_bj)
//     Q4_1:  y_o = sum_b  d_ob dx_b (sum_j q_obj xq_bj)  +  m_ob (sum_j x_bj)
//
// (the minimum multiplies the exact float sum of x). quant.py's `rounded_row_product` is the same formula
// in torch: the reference these kernels are tested against, and what runs where they do not build.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "lumen's block kernels need AVX2 and FMA"
#endif

namespace {

constexpr int64_t BLOCK = 32;

// the 8-bit x of each block, its step dx and its float sum
struct RoundedRow {
  std::vector<int8_t> q;
  std::vector<float> step, sum;

  RoundedRow(const float* x, int64_t n) : q(n), step(n / BLOCK), sum(n / BLOCK) {
    for (int64_t b = 0; b < n / BLOCK; ++b) {
      const float* xb = x + b * BLOCK;
      float amax = 0.f, s = 0.f;
      for (int64_t j = 0; j < BLOCK; ++j) {
        amax = std::max(amax, std::fabs(xb[j]));
        s += xb[j];
      }
      const float d = amax / 127.f, inv = d != 0.f ? 1.f / d : 0.f;
      for (int64_t j = 0; j < BLOCK; ++j) q[b * BLOCK + j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
      step[b] = d;
      sum[b] = s;
    }
  }
};

// 32 products of unsigned and signed bytes, added four at a time into 8 integer sums
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else  // pairs into 16 bits (at most 2 x 128 x 127: no overflow), then pairs of those into 32
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

inline float sum8(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 v = _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

void check(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, int64_t n) {
  TORCH_CHECK(x.dim() == 1 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: one contiguous float32 row");
  TORCH_CHECK(x.size(0) == n && n % BLOCK == 0, "x has ", x.size(0), " numbers, the blocks ", n);
  TORCH_CHECK(codes.is_contiguous() && scale.is_contiguous() && scale.scalar_type() == at::kFloat, "blocks' layout");
  TORCH_CHECK(scale.size(0) == codes.size(0) && scale.size(1) == n / BLOCK, "one scale per block");
}

// Q8_0: signed codes, one a byte. |q| goes in as the unsigned factor, x takes q's sign.
at::Tensor q8_0(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale) {
  const int64_t out = codes.size(0), n = codes.size(1), nb = n / BLOCK;
  check(x, codes, scale, n);
  TORCH_CHECK(codes.scalar_type() == at::kChar, "Q8_0 codes are int8");
  const RoundedRow r(x.data_ptr<float>(), n);
  at::Tensor y = at::empty({out}, x.options());
  const int8_t* C = codes.data_ptr<int8_t>();
  const float* S = scale.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const int8_t* c = C + o * n;
      const float* d = S + o * nb;
      // four running sums, so that no block waits for the one before it
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int64_t b = 0; b < nb; ++b) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + b * BLOCK));
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.q.data() + b * BLOCK));
        const __m256i t = dot_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(xq, q));
        acc[b & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(d[b] * r.step[b]), acc[b & 3]);
      }
      Y[o] = sum8(acc[0], acc[1], acc[2], acc[3]);
    }
  });
  return y;
}

// Q4_1: codes 0..15, two a byte as the file packs them (a block's 16 bytes hold its numbers 0-15 in their
// low halves and 16-31 in their high halves)
at::Tensor q4_1(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& minimum) {
  const int64_t out = codes.size(0), n = codes.size(1) * 2, nb = n / BLOCK;
  check(x, codes, scale, n);
  TORCH_CHECK(codes.scalar_type() == at::kByte, "Q4_1 codes are uint8, two to a byte");
  TORCH_CHECK(minimum.sizes() == scale.sizes() && minimum.is_contiguous() && minimum.scalar_type() == at::kFloat,
              "one minimum per block");
  const RoundedRow r(x.data_ptr<float>(), n);
  // x's bytes in the codes' order: for each block, its numbers 0-15 (low) and 16-31 (high)
  std::vector<int8_t> low(n / 2 + BLOCK), high(n / 2 + BLOCK);
  std::vector<float> step4(nb * 4);  // each block's step four times: the 4 integer sums a block fills
  for (int64_t b = 0; b < nb; ++b) {
    std::copy_n(r.q.data() + b * BLOCK, 16, low.data() + b * 16);
    std::copy_n(r.q.data() + b * BLOCK + 16, 16, high.data() + b * 16);
    std::fill_n(step4.data() + b * 4, 4, r.step[b]);
  }
  at::Tensor y = at::empty({out}, x.options());
  const uint8_t* C = codes.data_ptr<uint8_t>();
  const float *S = scale.data_ptr<float>(), *M = minimum.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, out, 16, [&](int64_t begin, int64_t end) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (int64_t o = begin; o < end; ++o) {
      const uint8_t* c = C + o * (n / 2);
      const float *d = S + o * nb, *m = M + o * nb;
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      int64_t b = 0;
      for (; b + 2 <= nb; b += 2) {  // two blocks: 32 bytes of codes
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + b * 16));
        const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        __m256i t = dot_u8s8(_mm256_setzero_si256(), lo,
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(low.data() + b * 16)));
        t = dot_u8s8(t, hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high.data() + b * 16)));
        // sums 0-3 belong to block b, 4-7 to block b + 1
        const __m256 db = _mm256_set_m128(_mm_set1_ps(d[b + 1]), _mm_set1_ps(d[b]));
        const __m256 scaled = _mm256_mul_ps(db, _mm256_loadu_ps(step4.data() + b * 4));
        acc[(b / 2) & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), scaled, acc[(b / 2) & 3]);
      }
      int64_t k = 0;  // the minima, eight blocks at a time
      for (; k + 8 <= nb; k += 8)
        acc[(k / 8) & 3] = _mm256_fmadd_ps(_mm256_loadu_ps(m + k), _mm256_loadu_ps(r.sum.data() + k), acc[(k / 8) & 3]);
      float total = sum8(acc[0], acc[1], acc[2], acc[3]);
      for (; k < nb; ++k) total += m[k] * r.sum[k];
      for (; b < nb; ++b) {  // an odd last block
        int32_t t = 0;
        for (int64_t j = 0; j < 16; ++j) t += (c[b * 16 + j] & 15) * low[b * 16 + j] + (c[b * 16 + j] >> 4) * high[b * 16 + j];
        total += static_cast<float>(t) * (d[b] * r.step[b]);
      }
      Y[o] = total;
    }
  });
  return y;
}

at::Tensor blocks_row(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                      const std::optional<at::Tensor>& minimum) {
  return minimum.has_value() ? q4_1(x, codes, scale, *minimum) : q8_0(x, codes, scale);
}

}  // namespace

// the schema is quant.py's (torch.library.define); this file gives it a CPU kernel
TORCH_LIBRARY_IMPL(lumen, CPU, m) { m.impl("blocks_row", &blocks_row); }

// The same kernel as a C function, the form an AOTInductor package calls directly (lumen/fast/aot.py), without
// the dispatcher's boxed call per product: tensors come as handles, the absent minimum as a null pointer.
extern "C" AOTITorchError aoti_torch_cpu_blocks_row(AtenTensorHandle x, AtenTensorHandle codes, AtenTensorHandle scale,
                                                    AtenTensorHandle* minimum, AtenTensorHandle* ret0) {
  using namespace torch::aot_inductor;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor y = blocks_row(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(codes),
                              *tensor_handle_to_tensor_pointer(scale), pointer_to_optional<at::Tensor>(minimum));
    *ret0 = new_tensor_handle(std::move(y));
  });
}
