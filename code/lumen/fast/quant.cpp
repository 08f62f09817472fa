// lumen's block kernels: x @ w.T for one float32 row x, computed from a GGUF matrix's own blocks
// (lumen/quant.py explains the blocks; it builds this file once per machine, with -march=native).
//
// x is rounded to 8 bits per block of 32, as llama.cpp rounds it: xq = round(x / dx), dx = max|x| / 127.
// A block's products are then integers, summed exactly, and scaled once (d and m are the file's float16):
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
// How far ahead the loops ask for memory: the codes 2 KiB ahead, the scales and minima eight rows ahead. A
// product reads each weight once, from memory; the CPU's own prefetcher, starting anew at every matrix and
// following three streams, leaves a good part of the bandwidth unused.
constexpr int64_t AHEAD_BYTES = 2048, AHEAD_ROWS = 8;

inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }

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

// the 8-bit x of each block, its step dx and its float sum (eight numbers at a time: the rounding is the
// CPU's default, to nearest, as std::nearbyint's)
struct RoundedRow {
  std::vector<int8_t> q;
  std::vector<float> step, sum;

  RoundedRow(const float* x, int64_t n) : q(n), step(n / BLOCK), sum(n / BLOCK) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the packs' lane interleaving
    for (int64_t b = 0; b < n / BLOCK; ++b) {
      const float* xb = x + b * BLOCK;
      __m256 v[4], amax = _mm256_setzero_ps(), s = _mm256_setzero_ps();
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm256_loadu_ps(xb + 8 * j);
        amax = _mm256_max_ps(amax, _mm256_and_ps(v[j], magnitude));
        s = _mm256_add_ps(s, v[j]);
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float d = _mm_cvtss_f32(m4) / 127.f, inv = d != 0.f ? 1.f / d : 0.f;
      __m256i i[4];
      for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], _mm256_set1_ps(inv)));
      const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q.data() + b * BLOCK), _mm256_permutevar8x32_epi32(bytes, order));
      step[b] = d;
      sum[b] = sum8(s, _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
    }
  }
};

inline float half(uint16_t h) { return _cvtsh_ss(h); }

void check(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, int64_t n) {
  TORCH_CHECK(x.dim() == 1 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: one contiguous float32 row");
  TORCH_CHECK(x.size(0) == n && n % BLOCK == 0, "x has ", x.size(0), " numbers, the blocks ", n);
  TORCH_CHECK(codes.is_contiguous() && scale.is_contiguous() && scale.scalar_type() == at::kHalf, "blocks' layout");
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
  const uint16_t* S = reinterpret_cast<const uint16_t*>(scale.data_ptr<at::Half>());
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const int8_t* c = C + o * n;
      const uint16_t* d = S + o * nb;
      prefetch(d + AHEAD_ROWS * nb);
      // four running sums, so that no block waits for the one before it
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int64_t b = 0; b < nb; ++b) {
        prefetch(c + b * BLOCK + AHEAD_BYTES);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + b * BLOCK));
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.q.data() + b * BLOCK));
        const __m256i t = dot_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(xq, q));
        acc[b & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(half(d[b]) * r.step[b]), acc[b & 3]);
      }
      Y[o] = sum8(acc[0], acc[1], acc[2], acc[3]);
    }
  });
  return y;
}

// x's 8-bit numbers in a Q4_1 block's byte order: for each block its numbers 0-15 (they meet the low halves
// of the block's 16 bytes) and 16-31 (the high halves); each block's step four times (its 4 integer sums)
struct NibbleOrder {
  std::vector<int8_t> low, high;
  std::vector<float> step4;

  NibbleOrder(const RoundedRow& r, int64_t nb) : low(nb * 16 + 64), high(nb * 16 + 64), step4(nb * 4 + 16) {
    for (int64_t b = 0; b < nb; ++b) {
      std::copy_n(r.q.data() + b * BLOCK, 16, low.data() + b * 16);
      std::copy_n(r.q.data() + b * BLOCK + 16, 16, high.data() + b * 16);
      std::fill_n(step4.data() + b * 4, 4, r.step[b]);
    }
  }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define LUMEN_ROWS2 1
// two Q4_1 rows side by side (they share x's loads), four blocks (64 bytes of codes) at a time; the last
// few blocks through masks
inline void q4_1_rows2(const uint8_t* c, const uint16_t* d, const uint16_t* m, int64_t nb, const NibbleOrder& x,
                       const RoundedRow& r, float* y) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);  // block k -> lanes 4k..4k+3
  const int64_t row = nb * 16;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b += 4) {
    const int64_t k = std::min<int64_t>(4, nb - b);
    const __mmask64 bytes = k == 4 ? ~0ULL : (1ULL << (16 * k)) - 1;
    const __mmask8 four = static_cast<__mmask8>((1 << k) - 1);
    prefetch(c + b * 16 + AHEAD_BYTES);
    prefetch(c + row + b * 16 + AHEAD_BYTES);
    const __m512i xl = _mm512_loadu_si512(x.low.data() + b * 16), xh = _mm512_loadu_si512(x.high.data() + b * 16);
    const __m512 step = _mm512_loadu_ps(x.step4.data() + b * 4);
    const __m512i v0 = _mm512_maskz_loadu_epi8(bytes, c + b * 16), v1 = _mm512_maskz_loadu_epi8(bytes, c + row + b * 16);
    __m512i t0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v0, nibble), xl);
    __m512i t1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v1, nibble), xl);
    t0 = _mm512_dpbusd_epi32(t0, _mm512_and_si512(_mm512_srli_epi16(v0, 4), nibble), xh);
    t1 = _mm512_dpbusd_epi32(t1, _mm512_and_si512(_mm512_srli_epi16(v1, 4), nibble), xh);
    const __m512 d0 = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_maskz_loadu_epi16(four, d + b))));
    const __m512 d1 = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_maskz_loadu_epi16(four, d + nb + b))));
    acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t0), _mm512_mul_ps(d0, step), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1), _mm512_mul_ps(d1, step), acc1);
  }
  for (int64_t b = 0; b < nb; b += 16) {  // the minima times x's block sums, sixteen blocks at a time
    const __mmask16 k = nb - b >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (nb - b)) - 1);
    const __m512 s = _mm512_maskz_loadu_ps(k, r.sum.data() + b);
    acc0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, m + b)), s, acc0);
    acc1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, m + nb + b)), s, acc1);
  }
  y[0] = _mm512_reduce_add_ps(acc0);
  y[1] = _mm512_reduce_add_ps(acc1);
}
#endif
// one Q4_1 row, two blocks (32 bytes of codes) at a time
inline float q4_1_row(const uint8_t* c, const uint16_t* d, const uint16_t* m, int64_t nb, const NibbleOrder& x,
                      const RoundedRow& r) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    prefetch(c + b * 16 + AHEAD_BYTES);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + b * 16));
    const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    __m256i t = dot_u8s8(_mm256_setzero_si256(), lo,
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.low.data() + b * 16)));
    t = dot_u8s8(t, hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.high.data() + b * 16)));
    // sums 0-3 belong to block b, 4-7 to block b + 1
    const __m256 db = _mm256_set_m128(_mm_set1_ps(half(d[b + 1])), _mm_set1_ps(half(d[b])));
    const __m256 scaled = _mm256_mul_ps(db, _mm256_loadu_ps(x.step4.data() + b * 4));
    acc[(b / 2) & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), scaled, acc[(b / 2) & 3]);
  }
  int64_t k = 0;  // the minima, eight blocks at a time
  for (; k + 8 <= nb; k += 8) {
    const __m256 mk = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m + k)));
    acc[(k / 8) & 3] = _mm256_fmadd_ps(mk, _mm256_loadu_ps(r.sum.data() + k), acc[(k / 8) & 3]);
  }
  float total = sum8(acc[0], acc[1], acc[2], acc[3]);
  for (; k < nb; ++k) total += half(m[k]) * r.sum[k];
  for (; b < nb; ++b) {  // an odd last block
    int32_t t = 0;
    for (int64_t j = 0; j < 16; ++j) t += (c[b * 16 + j] & 15) * x.low[b * 16 + j] + (c[b * 16 + j] >> 4) * x.high[b * 16 + j];
    total += static_cast<float>(t) * (half(d[b]) * r.step[b]);
  }
  return total;
}

// Q4_1: codes 0..15, two a byte as the file packs them (a block's 16 bytes hold its numbers 0-15 in their
// low halves and 16-31 in their high halves)
at::Tensor q4_1(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& minimum) {
  const int64_t out = codes.size(0), n = codes.size(1) * 2, nb = n / BLOCK;
  check(x, codes, scale, n);
  TORCH_CHECK(codes.scalar_type() == at::kByte, "Q4_1 codes are uint8, two to a byte");
  TORCH_CHECK(minimum.sizes() == scale.sizes() && minimum.is_contiguous() && minimum.scalar_type() == at::kHalf,
              "one minimum per block");
  const RoundedRow r(x.data_ptr<float>(), n);
  const NibbleOrder xo(r, nb);
  at::Tensor y = at::empty({out}, x.options());
  const uint8_t* C = codes.data_ptr<uint8_t>();
  const uint16_t* S = reinterpret_cast<const uint16_t*>(scale.data_ptr<at::Half>());
  const uint16_t* M = reinterpret_cast<const uint16_t*>(minimum.data_ptr<at::Half>());
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, out, 16, [&](int64_t begin, int64_t end) {
    int64_t o = begin;
#ifdef LUMEN_ROWS2
    for (; o + 2 <= end; o += 2) {
      prefetch(S + (o + AHEAD_ROWS) * nb);
      prefetch(M + (o + AHEAD_ROWS) * nb);
      q4_1_rows2(C + o * (n / 2), S + o * nb, M + o * nb, nb, xo, r, Y + o);
    }
#endif
    for (; o < end; ++o) Y[o] = q4_1_row(C + o * (n / 2), S + o * nb, M + o * nb, nb, xo, r);
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
