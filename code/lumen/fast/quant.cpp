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
// How far ahead a product asks for memory: a product reads each weight once, from memory, in one stream (see
// the quads below), and the CPU's own prefetcher may not run far enough ahead of it to keep the memory busy
// (far enough: the bytes that arrive during one memory latency; docs/speed.md has the distances measured).
constexpr int64_t AHEAD_BYTES = 16384;

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

  RoundedRow(const float* x, int64_t n) : q(n + 128), step(n / BLOCK), sum(n / BLOCK) {  // (q: zeros after, for a last group's loads)
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

// The quads layout (quant.py's `pack`): four rows side by side, four blocks (a group) at a time, each
// group's bytes in one run: the four rows' codes, then the group's scales (and, for Q4_1, minima) as
// float16, block by block, the four rows' of each block together. A matrix is then one stream of bytes,
// read once from start to end (the CPU's prefetcher follows one stream well, and the three of the file's
// layout, codes, scales and minima, in two interleaved rows, badly), and one pass of x serves four rows.
// A row's last group holds its last 1-3 blocks (in / 32 need not be a multiple of 4).
constexpr int64_t ROWS = 4, GROUP = 4;

// x as the quads meet it: its 8-bit numbers (for Q4_1 split by a block's byte halves: numbers 0-15 meet the
// low halves of the block's 16 bytes, 16-31 the high halves), and per block, four times over (a block's four
// rows), its step dx, its float sum (for the minima) and 128 times its integer sum (for Q8_0's codes, read
// as unsigned q + 128).
struct QuadRow {
  std::vector<int8_t> low, high;
  std::vector<float> step4, sum4;
  std::vector<int32_t> offset4;

  QuadRow(const RoundedRow& r, int64_t nb)
      : low(nb * 16 + 64), high(nb * 16 + 64), step4(nb * 4 + 16), sum4(nb * 4 + 16), offset4(nb * 4 + 16) {
    for (int64_t b = 0; b < nb; ++b) {
      const int8_t* q = r.q.data() + b * BLOCK;
      std::copy_n(q, 16, low.data() + b * 16);
      std::copy_n(q + 16, 16, high.data() + b * 16);
      int32_t s = 0;
      for (int64_t j = 0; j < BLOCK; ++j) s += q[j];
      std::fill_n(step4.data() + b * 4, 4, r.step[b]);
      std::fill_n(sum4.data() + b * 4, 4, r.sum[b]);
      std::fill_n(offset4.data() + b * 4, 4, 128 * s);
    }
  }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// Four rows' integer sums, each in four parts per block (lanes 4j..4j+3: block j), added up per block:
// lanes 4j..4j+3 become block j's sums of rows 0, 1, 2, 3 (the order of a group's scales).
inline __m512i per_block(__m512i t0, __m512i t1, __m512i t2, __m512i t3) {
  const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(t0, t1), _mm512_unpackhi_epi32(t0, t1));
  const __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(t2, t3), _mm512_unpackhi_epi32(t2, t3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

// The four rows' y from an accumulator whose lanes 4j+r hold row r's share of block j
inline void store4(__m512 acc, float* y) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
  _mm_storeu_ps(y, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

// One quad of Q4_1 rows, a group (k blocks: 64 k bytes of codes, 4 k scales, 4 k minima) at a time
inline void q4_1_quad(const uint8_t* p, int64_t nb, const QuadRow& x, float* y) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc = _mm512_setzero_ps(), low = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b += GROUP) {
    const int64_t k = std::min<int64_t>(GROUP, nb - b), row = 16 * k;
    const __mmask64 bytes = k == GROUP ? ~0ULL : (1ULL << row) - 1;
    const __mmask16 lanes = static_cast<__mmask16>((1u << (4 * k)) - 1);
    for (int64_t a = 0; a < 80 * k; a += 64) prefetch(p + AHEAD_BYTES + a);
    const __m512i xl = _mm512_loadu_si512(x.low.data() + b * 16), xh = _mm512_loadu_si512(x.high.data() + b * 16);
    __m512i t[ROWS];
    for (int r = 0; r < ROWS; ++r) {
      const __m512i v = _mm512_maskz_loadu_epi8(bytes, p + r * row);
      t[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v, nibble), xl);
      t[r] = _mm512_dpbusd_epi32(t[r], _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble), xh);
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, p + ROWS * row));
    const __m512 m = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, p + ROWS * row + 8 * k));
    const __m512 sums = _mm512_cvtepi32_ps(per_block(t[0], t[1], t[2], t[3]));
    acc = _mm512_fmadd_ps(sums, _mm512_mul_ps(d, _mm512_loadu_ps(x.step4.data() + b * 4)), acc);
    low = _mm512_fmadd_ps(m, _mm512_loadu_ps(x.sum4.data() + b * 4), low);  // the minima times x's sums
    p += ROWS * row + 16 * k;
  }
  store4(_mm512_add_ps(acc, low), y);
}

// One quad of Q8_0 rows, a group (k blocks: 128 k bytes of codes, 4 k scales) at a time. A code q is read
// as the unsigned q + 128 (the instruction multiplies unsigned by signed bytes): each block's sum then
// holds 128 times x's integer sum too, taken off before scaling.
inline void q8_0_quad(const uint8_t* p, int64_t nb, const QuadRow& x, const RoundedRow& r, float* y) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b += GROUP) {
    const int64_t k = std::min<int64_t>(GROUP, nb - b), row = 32 * k;
    const __mmask64 first = k >= 2 ? ~0ULL : (1ULL << row) - 1;
    const __mmask64 second = k == GROUP ? ~0ULL : k <= 2 ? 0ULL : (1ULL << (row - 64)) - 1;
    const __mmask16 lanes = static_cast<__mmask16>((1u << (4 * k)) - 1);
    for (int64_t a = 0; a < 136 * k; a += 64) prefetch(p + AHEAD_BYTES + a);
    const __m512i x0 = _mm512_loadu_si512(r.q.data() + b * BLOCK), x1 = _mm512_loadu_si512(r.q.data() + b * BLOCK + 64);
    __m512i t[ROWS];
    for (int i = 0; i < ROWS; ++i) {  // blocks 0-1 and 2-3 of the group: eight lanes a block
      const __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                            _mm512_xor_si512(_mm512_maskz_loadu_epi8(first, p + i * row), flip), x0);
      const __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                            _mm512_xor_si512(_mm512_maskz_loadu_epi8(second, p + i * row + 64), flip), x1);
      // four lanes a block: block j's two 128-bit quarters added
      t[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(a, c, 0x88), _mm512_shuffle_i32x4(a, c, 0xDD));
    }
    const __m512i exact = _mm512_sub_epi32(per_block(t[0], t[1], t[2], t[3]),
                                           _mm512_loadu_si512(x.offset4.data() + b * 4));
    const __m512 d = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, p + ROWS * row));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(d, _mm512_loadu_ps(x.step4.data() + b * 4)), acc);
    p += ROWS * row + 8 * k;
  }
  store4(acc, y);
}
#else
// AVX2: one row of a quad at a time, a block at a time (the same sums; no AVX-512 here)
inline void quad_rows(const uint8_t* p, int64_t nb, const RoundedRow& x, bool q4_1, float* y) {
  float out[ROWS] = {0, 0, 0, 0};
  for (int64_t b = 0; b < nb; b += GROUP) {
    const int64_t k = std::min<int64_t>(GROUP, nb - b), row = (q4_1 ? 16 : 32) * k;
    for (int64_t a = 0; a < (q4_1 ? 80 : 136) * k; a += 64) prefetch(p + AHEAD_BYTES + a);
    const uint16_t* d = reinterpret_cast<const uint16_t*>(p + ROWS * row);
    for (int r = 0; r < ROWS; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        const uint8_t* c = p + r * row + j * (row / k);
        const int8_t* xq = x.q.data() + (b + j) * BLOCK;
        __m256i v, s;
        if (q4_1) {  // a block's 16 bytes: numbers 0-15 in the low halves, 16-31 in the high halves
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
          v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(h, 4), h), _mm256_set1_epi8(0x0F));
          s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
        } else {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
          v = _mm256_sign_epi8(q, q);
          s = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)), q);
        }
        const __m256i t = dot_u8s8(_mm256_setzero_si256(), v, s);
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        h = _mm_hadd_epi32(h, h);
        h = _mm_hadd_epi32(h, h);
        out[r] += static_cast<float>(_mm_cvtsi128_si32(h)) * (half(d[4 * j + r]) * x.step[b + j]);
        if (q4_1) out[r] += half(d[4 * k + 4 * j + r]) * x.sum[b + j];
      }
    }
    p += ROWS * row + (q4_1 ? 16 : 8) * k;
  }
  std::copy_n(out, ROWS, y);
}
#endif

// y (4 x quads) = x @ w.T from a matrix in quads (quant.py's layout), Q4_1 or Q8_0; the quads split between
// the threads (each thread reads one stretch of the stream)
at::Tensor quads_row(const at::Tensor& x, const at::Tensor& packed, bool q4_1) {
  const int64_t n = x.size(0), nb = n / BLOCK, quads = packed.size(0);
  TORCH_CHECK(x.dim() == 1 && x.scalar_type() == at::kFloat && x.is_contiguous() && n % BLOCK == 0,
              "x: one contiguous float32 row of whole blocks");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous(), "quads: uint8 rows");
  TORCH_CHECK(packed.size(1) == nb * ROWS * (q4_1 ? 20 : 34), "quads of ", packed.size(1), " bytes for x of ", n);
  const RoundedRow r(x.data_ptr<float>(), n);
  at::Tensor y = at::empty({quads * ROWS}, x.options());
  const uint8_t* P = packed.data_ptr<uint8_t>();
  float* Y = y.data_ptr<float>();
  const int64_t stride = packed.size(1);
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  const QuadRow xq(r, nb);
  at::parallel_for(0, quads, 4, [&](int64_t begin, int64_t end) {
    // (the stretch's first bytes asked for at once; then each group asks for the bytes AHEAD_BYTES after it)
    for (int64_t a = 0; a < std::min(AHEAD_BYTES, (end - begin) * stride); a += 64) prefetch(P + begin * stride + a);
    for (int64_t i = begin; i < end; ++i) {
      if (q4_1) q4_1_quad(P + i * stride, nb, xq, Y + i * ROWS);
      else q8_0_quad(P + i * stride, nb, xq, r, Y + i * ROWS);
    }
  });
#else
  at::parallel_for(0, quads, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) quad_rows(P + i * stride, nb, r, q4_1, Y + i * ROWS);
  });
#endif
  return y;
}

at::Tensor q4_1_row(const at::Tensor& x, const at::Tensor& packed) { return quads_row(x, packed, true); }
at::Tensor q8_0_row(const at::Tensor& x, const at::Tensor& packed) { return quads_row(x, packed, false); }

}  // namespace

// the schemas are quant.py's (torch.library.define); this file gives them CPU kernels
TORCH_LIBRARY_IMPL(lumen, CPU, m) {
  m.impl("q4_1_row", &q4_1_row);
  m.impl("q8_0_row", &q8_0_row);
}

// The same kernels as C functions, the form an AOTInductor package calls directly (lumen/fast/aot.py), without
// the dispatcher's boxed call per product: tensors come as handles.
extern "C" AOTITorchError aoti_torch_cpu_q4_1_row(AtenTensorHandle x, AtenTensorHandle packed, AtenTensorHandle* ret0) {
  using namespace torch::aot_inductor;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *ret0 = new_tensor_handle(q4_1_row(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(packed)));
  });
}

extern "C" AOTITorchError aoti_torch_cpu_q8_0_row(AtenTensorHandle x, AtenTensorHandle packed, AtenTensorHandle* ret0) {
  using namespace torch::aot_inductor;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *ret0 = new_tensor_handle(q8_0_row(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(packed)));
  });
}
