// lumen's block kernels, the arithmetic alone (no torch: quant.cpp wraps them for torch, and a test builds them
// for ARM64 and runs them under emulation): x @ w.T for one float32 row x, computed from a GGUF matrix's own
// blocks, four rows at a time (lumen/quant.py explains the blocks; it builds quant.cpp once per machine, with
// -march=native: the instructions below are chosen as it builds, for the CPU it builds on).
//
// x is rounded to 8 bits per block of 32, as llama.cpp rounds it: xq = round(x / dx), dx = max|x| / 127.
// A block's products are then integers, summed exactly, and scaled once (d and m are the file's float16):
//
//     Q8_0:  y_o = sum_b  d_ob dx_b (sum_j q_obj xq_bj)
//     Q4_1:  y_o = sum_b  d_ob dx_b (sum_j q_obj xq_bj)  +  m_ob (sum_j x_bj)
//
// (the minimum multiplies the exact float sum of x). quant.py's `rounded_row_product` is the same formula
// in torch: what runs where these do not build; the tests hold both to the formula in float64.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#if !defined(__AVX2__) || !defined(__FMA__)
#error "lumen's block kernels need AVX2 and FMA on x86-64"
#endif
#elif defined(__aarch64__)
#include <arm_neon.h>
#else
#error "lumen's block kernels are written for x86-64 (AVX2) and ARM64 (NEON)"
#endif

namespace lumen_quads {

constexpr int64_t BLOCK = 32;
// How far ahead a product asks for memory: a product reads each weight once, from memory, in one stream (see
// the quads below), and the CPU's own prefetcher may not run far enough ahead of it to keep the memory busy
// (far enough: the bytes that arrive during one memory latency). The best distance is the CPU's: quant.py
// builds with the one measured for its maker (docs/speed.md has the distances measured: 16 KiB on AMD's Zen 5,
// 2 KiB on Intel's Sapphire Rapids, where 16 KiB evicts from L1 what the product has yet to read).
#ifndef LUMEN_AHEAD_BYTES
#define LUMEN_AHEAD_BYTES 16384
#endif
constexpr int64_t AHEAD_BYTES = LUMEN_AHEAD_BYTES;

#if defined(__x86_64__)
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

  RoundedRow() = default;
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
#else
inline void prefetch(const void* p) { __builtin_prefetch(p); }

// the 8-bit x of each block, its step dx and its float sum (rounding to nearest, ties to even, as the x86
// path's conversion and std::nearbyint in the default rounding mode)
struct RoundedRow {
  std::vector<int8_t> q;
  std::vector<float> step, sum;

  RoundedRow() = default;
  RoundedRow(const float* x, int64_t n) : q(n + 128), step(n / BLOCK), sum(n / BLOCK) {  // (q: zeros after)
    for (int64_t b = 0; b < n / BLOCK; ++b) {
      const float* xb = x + b * BLOCK;
      float amax = 0.f, s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t j = 0; j < BLOCK; ++j) {
        amax = std::max(amax, std::fabs(xb[j]));
        s[j % 8] += xb[j];  // (eight running sums added as the x86 path adds its lanes)
      }
      const float d = amax / 127.f, inv = d != 0.f ? 1.f / d : 0.f;
      for (int64_t j = 0; j < BLOCK; ++j) q[b * BLOCK + j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
      step[b] = d;
      sum[b] = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    }
  }
};
#endif

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

  QuadRow() = default;
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
#elif defined(__x86_64__)
// AVX2: four rows at a time, two blocks at a time, with 256-bit registers (as the AVX-512 path does four blocks
// with 512). Q8_0's eight integer sums of 32 products each (one row and one block each), added up per
// register: [v0 .. v7], in the order of a group's scales when v holds block j's rows 0-3, then block j+1's.
inline __m256i sums8(const __m256i* v) {
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// eight float16 numbers, or four (a group's odd last block: the four after it are not the group's)
inline __m256 halves(const uint8_t* p, bool eight) {
  const __m128i h = eight ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                          : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtph_ps(h);
}

// The four rows' y from an accumulator whose lanes r and 4 + r hold row r's shares
inline void store4(__m256 acc, float* y) {
  _mm_storeu_ps(y, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
}

// Four rows' integer sums of two blocks, each in four parts per block (lanes 0-3: block j, 4-7: block j + 1),
// added up per block: [block j's rows 0-3, block j + 1's rows 0-3], the order of a group's scales (the
// AVX-512 path's per_block, in each 128-bit half)
inline __m256i per_block(__m256i t0, __m256i t1, __m256i t2, __m256i t3) {
  const __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(t0, t1), _mm256_unpackhi_epi32(t0, t1));
  const __m256i b = _mm256_add_epi32(_mm256_unpacklo_epi32(t2, t3), _mm256_unpackhi_epi32(t2, t3));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

// 4-bit codes (two registers: low and high halves) by x's bytes, added four at a time into 8 integer sums.
// Without VNNI by pairs into 16 bits, both registers' pairs added there (at most 4 x 15 x 127: no overflow).
inline __m256i dot_nibbles(__m256i low, __m256i xl, __m256i high, __m256i xh) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), low, xl), high, xh);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), low, xl), high, xh);
#else
  const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low, xl), _mm256_maddubs_epi16(high, xh));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

// One quad of Q4_1 rows, a group (k blocks: 64 k bytes of codes, 4 k scales, 4 k minima) at a time, two
// blocks at a time: a row's two blocks are one register of codes, their low halves meeting x's numbers 0-15
// of each block, their high halves 16-31 (QuadRow's low and high). A group's odd last block reads 16 bytes
// past it (the next row's codes, or the group's scales): they meet x's zeros past its last block.
inline void q4_1_quad(const uint8_t* p, int64_t nb, const QuadRow& x, float* y) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps(), low = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b += GROUP) {
    const int64_t k = std::min<int64_t>(GROUP, nb - b), row = 16 * k;
    for (int64_t a = 0; a < 80 * k; a += 64) prefetch(p + AHEAD_BYTES + a);
    for (int64_t j = 0; j < k; j += 2) {
      const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.low.data() + (b + j) * 16));
      const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.high.data() + (b + j) * 16));
      __m256i t[ROWS];
      for (int i = 0; i < ROWS; ++i) {
        const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * row + 16 * j));
        t[i] = dot_nibbles(_mm256_and_si256(c, nibble), xl, _mm256_and_si256(_mm256_srli_epi16(c, 4), nibble), xh);
      }
      const bool two = j + 1 < k;
      const __m256 d = halves(p + ROWS * row + 8 * j, two), m = halves(p + ROWS * row + 8 * k + 8 * j, two);
      const __m256 step = _mm256_loadu_ps(x.step4.data() + (b + j) * 4), sum = _mm256_loadu_ps(x.sum4.data() + (b + j) * 4);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(per_block(t[0], t[1], t[2], t[3])), _mm256_mul_ps(d, step), acc);
      low = _mm256_fmadd_ps(m, sum, low);  // the minima times x's sums (an odd last block: m's upper half is 0)
    }
    p += ROWS * row + 16 * k;
  }
  store4(_mm256_add_ps(acc, low), y);
}

// One quad of Q8_0 rows, a group (k blocks: 128 k bytes of codes, 4 k scales) at a time, two blocks at a time:
// the instruction multiplies unsigned by signed bytes, so each code meets x with the code's sign moved onto x
// (|q| (sign q) x = q x)
inline void q8_0_quad(const uint8_t* p, int64_t nb, const QuadRow& x, const RoundedRow& r, float* y) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b += GROUP) {
    const int64_t k = std::min<int64_t>(GROUP, nb - b), row = 32 * k;
    for (int64_t a = 0; a < 136 * k; a += 64) prefetch(p + AHEAD_BYTES + a);
    for (int64_t j = 0; j < k; j += 2) {
      const bool two = j + 1 < k;
      __m256i v[8];
      for (int h = 0; h < (two ? 2 : 1); ++h) {
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.q.data() + (b + j + h) * BLOCK));
        for (int i = 0; i < ROWS; ++i) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * row + 32 * (j + h)));
          v[4 * h + i] = dot_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(xq, q));
        }
      }
      if (!two) std::fill_n(v + 4, 4, _mm256_setzero_si256());
      const __m256 d = halves(p + ROWS * row + 8 * j, two);
      const __m256 step = _mm256_loadu_ps(x.step4.data() + (b + j) * 4);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums8(v)), _mm256_mul_ps(d, step), acc);
    }
    p += ROWS * row + 8 * k;
  }
  store4(acc, y);
}
#else
// ARM64: four rows a block at a time in 128-bit registers; a block's 32 products of signed bytes by the
// dot-product instruction where the CPU has it (ARMv8.2's SDOT), else widened to 16 bits in pairs (at most
// 2 x 128 x 127: no overflow) and added pairwise into 32
inline int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
  p = vmlal_s8(p, vget_high_s8(a), vget_high_s8(b));
  return vpadalq_s16(acc, p);
#endif
}

// four rows' sums, each in four parts: [row 0, row 1, row 2, row 3]
inline float32x4_t sums4(int32x4_t t0, int32x4_t t1, int32x4_t t2, int32x4_t t3) {
  return vcvtq_f32_s32(vpaddq_s32(vpaddq_s32(t0, t1), vpaddq_s32(t2, t3)));
}

inline float32x4_t halves4(const uint8_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
}

// One quad of Q4_1 rows: a block's 16 bytes hold its numbers 0-15 in their low halves, 16-31 in their high
inline void q4_1_quad(const uint8_t* p, int64_t nb, const QuadRow& x, const RoundedRow& r, float* y) {
  const uint8x16_t nibble = vdupq_n_u8(0x0F);
  float32x4_t acc = vdupq_n_f32(0.f), low = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < nb; b += GROUP) {
    const int64_t k = std::min<int64_t>(GROUP, nb - b), row = 16 * k;
    for (int64_t a = 0; a < 80 * k; a += 64) prefetch(p + AHEAD_BYTES + a);
    for (int64_t j = 0; j < k; ++j) {
      const int8x16_t xl = vld1q_s8(r.q.data() + (b + j) * BLOCK), xh = vld1q_s8(r.q.data() + (b + j) * BLOCK + 16);
      int32x4_t t[ROWS];
      for (int i = 0; i < ROWS; ++i) {
        const uint8x16_t c = vld1q_u8(p + i * row + 16 * j);
        t[i] = dot_s8(vdupq_n_s32(0), vreinterpretq_s8_u8(vandq_u8(c, nibble)), xl);
        t[i] = dot_s8(t[i], vreinterpretq_s8_u8(vshrq_n_u8(c, 4)), xh);
      }
      const float32x4_t d = halves4(p + ROWS * row + 8 * j), m = halves4(p + ROWS * row + 8 * k + 8 * j);
      acc = vfmaq_f32(acc, sums4(t[0], t[1], t[2], t[3]), vmulq_f32(d, vld1q_f32(x.step4.data() + (b + j) * 4)));
      low = vfmaq_f32(low, m, vld1q_f32(x.sum4.data() + (b + j) * 4));  // the minima times x's sums
    }
    p += ROWS * row + 16 * k;
  }
  vst1q_f32(y, vaddq_f32(acc, low));
}

// One quad of Q8_0 rows: signed codes by signed x, 32 at a time
inline void q8_0_quad(const uint8_t* p, int64_t nb, const QuadRow& x, const RoundedRow& r, float* y) {
  float32x4_t acc = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < nb; b += GROUP) {
    const int64_t k = std::min<int64_t>(GROUP, nb - b), row = 32 * k;
    for (int64_t a = 0; a < 136 * k; a += 64) prefetch(p + AHEAD_BYTES + a);
    for (int64_t j = 0; j < k; ++j) {
      const int8x16_t x0 = vld1q_s8(r.q.data() + (b + j) * BLOCK), x1 = vld1q_s8(r.q.data() + (b + j) * BLOCK + 16);
      int32x4_t t[ROWS];
      for (int i = 0; i < ROWS; ++i) {
        const int8_t* c = reinterpret_cast<const int8_t*>(p + i * row + 32 * j);
        t[i] = dot_s8(dot_s8(vdupq_n_s32(0), vld1q_s8(c), x0), vld1q_s8(c + 16), x1);
      }
      const float32x4_t d = halves4(p + ROWS * row + 8 * j);
      acc = vfmaq_f32(acc, sums4(t[0], t[1], t[2], t[3]), vmulq_f32(d, vld1q_f32(x.step4.data() + (b + j) * 4)));
    }
    p += ROWS * row + 8 * k;
  }
  vst1q_f32(y, acc);
}
#endif

// One quad's four outputs (y[0..3]) from its bytes p: Q4_1 or Q8_0
inline void quad_product(const uint8_t* p, int64_t nb, const QuadRow& x, const RoundedRow& r, bool q4_1, float* y) {
#if defined(__x86_64__)
  if (q4_1) q4_1_quad(p, nb, x, y);
#else
  if (q4_1) q4_1_quad(p, nb, x, r, y);
#endif
  else q8_0_quad(p, nb, x, r, y);
}

// ---------------------------------------------------------------------------------------------------------------
// A prompt: many rows of x, each rounded as a decoded token's row is, each row's products bit for bit the ones
// `quad_product` gives it alone (the same integer sums, scaled and added in the same order). A prompt's product
// is arithmetic, not memory: each weight meets every row.

struct RoundedRows {
  std::vector<RoundedRow> r;
  std::vector<QuadRow> x;

  explicit RoundedRows(int64_t m) : r(m), x(m) {}

  // rows [begin, end) of xs (m rows of n): threads may round stretches of their own at once
  void round(const float* xs, int64_t n, int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      r[t] = RoundedRow(xs + t * n, n);
      x[t] = QuadRow(r[t], n / BLOCK);
    }
  }
};

#if defined(__x86_64__)
// A panel: LANES rows (LANES / 4 quads) copied, block by block, into the layout of a byte product against four
// numbers of x at a time: a block's 8 registers of LANES x 4 bytes, lane r of register c holding row r's
// numbers 4c..4c+3 (Q4_1's codes 0..15; Q8_0's q, or q + 128 where the instruction wants unsigned bytes), so
// that one instruction adds 4 products to each row's sum, x's four numbers broadcast to every lane. No sums
// across lanes are left to do: a block's 8 instructions leave each row's integer sum in its own lane. The
// scales and minima as float32, LANES a block. One thread's panel, made once for a stretch of rows and kept in
// L1 while they pass.
template <int LANES>
struct Panel {
  std::vector<int32_t> codes;
  std::vector<float> d, m;

  explicit Panel(int64_t nb) : codes(nb * 8 * LANES), d(nb * LANES), m(nb * LANES) {}

  // quads [first, first + count) (count <= LANES / 4) of a matrix whose quads lie `stride` bytes apart
  void fill(const uint8_t* P, int64_t stride, int64_t nb, bool q4_1, bool unsigned_q8, int64_t first, int64_t count) {
    std::fill(codes.begin(), codes.end(), 0);
    std::fill(d.begin(), d.end(), 0.f);
    std::fill(m.begin(), m.end(), 0.f);
    const int64_t per = q4_1 ? 16 : 32;  // code bytes a block
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(unsigned_q8 ? 0x80 : 0));
    for (int64_t qi = 0; qi < count; ++qi) {
      const uint8_t* p = P + (first + qi) * stride;
      for (int64_t b = 0; b < nb; b += GROUP) {
        const int64_t k = std::min<int64_t>(GROUP, nb - b), row = per * k;
        for (int64_t j = 0; j < k; ++j) {
          for (int64_t i = 0; i < ROWS; ++i) {
            const int64_t lane = ROWS * qi + i, at = (b + j) * 8 * LANES + lane;
            const uint8_t* c = p + i * row + per * j;
            alignas(32) uint32_t u[8];  // the block's numbers 0-31, four to an entry
            if (q4_1) {
              const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c)), nibble = _mm_set1_epi8(0x0F);
              _mm_store_si128(reinterpret_cast<__m128i*>(u), _mm_and_si128(v, nibble));
              _mm_store_si128(reinterpret_cast<__m128i*>(u + 4), _mm_and_si128(_mm_srli_epi16(v, 4), nibble));
            } else {
              const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
              _mm256_store_si256(reinterpret_cast<__m256i*>(u), _mm256_xor_si256(v, flip));
            }
            for (int64_t reg = 0; reg < 8; ++reg) codes[at + reg * LANES] = static_cast<int32_t>(u[reg]);
            d[(b + j) * LANES + lane] = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(p + ROWS * row + 8 * j + 2 * i));
            if (q4_1)
              m[(b + j) * LANES + lane] = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(p + ROWS * row + 8 * k + 8 * j + 2 * i));
          }
        }
        p += ROWS * row + (q4_1 ? 16 : 8) * k;
      }
    }
  }
};

// x's numbers 4c..4c+3 of block b, as one 32-bit number (to broadcast)
inline int32_t four_of(const RoundedRow& r, int64_t b, int c) {
  int32_t four;
  std::memcpy(&four, r.q.data() + b * BLOCK + 4 * c, 4);
  return four;
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr int LANES = 16;  // a panel's rows: four quads, one 512-bit register of 32-bit sums

// T rows of x against a panel: row t's 16 outputs to y[t]. Each row keeps a block's scaled sums in four
// accumulators by the block's place in its group (and, for Q4_1, the minima's in four more), added up at the
// end as the one-row kernel adds its lanes: ((0 + 2) + (1 + 3)), so that the numbers are its, bit for bit.
// Q8_0's codes are read as q + 128 (the instruction multiplies unsigned by signed bytes), 128 times x's
// integer sum taken off before scaling, as the one-row kernel does.
template <int T, bool Q4_1>
inline void panel_rows(const Panel<LANES>& pn, int64_t nb, const RoundedRow* const* r, const QuadRow* const* x,
                       float* const* y) {
  __m512 acc[T][GROUP], low[T][GROUP];
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < GROUP; ++j) acc[t][j] = low[t][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < nb; g += GROUP) {
#pragma GCC unroll 4
    for (int j = 0; j < GROUP; ++j) {  // (unrolled: each accumulator a register of its own)
      const int64_t b = g + j;
      if (b >= nb) break;
      const int32_t* w = pn.codes.data() + b * 8 * LANES;
      __m512i s[T];  // each row's 16 integer sums of the block
      for (int t = 0; t < T; ++t) s[t] = _mm512_setzero_si512();
      for (int c = 0; c < 8; ++c) {
        const __m512i wc = _mm512_loadu_si512(w + LANES * c);
        for (int t = 0; t < T; ++t) s[t] = _mm512_dpbusd_epi32(s[t], wc, _mm512_set1_epi32(four_of(*r[t], b, c)));
      }
      const __m512 d = _mm512_loadu_ps(pn.d.data() + b * LANES);
      for (int t = 0; t < T; ++t) {
        const __m512i exact = Q4_1 ? s[t] : _mm512_sub_epi32(s[t], _mm512_set1_epi32(x[t]->offset4[b * 4]));
        acc[t][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(d, _mm512_set1_ps(r[t]->step[b])), acc[t][j]);
        if (Q4_1) low[t][j] = _mm512_fmadd_ps(_mm512_loadu_ps(pn.m.data() + b * LANES), _mm512_set1_ps(r[t]->sum[b]), low[t][j]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    const __m512 v0 = _mm512_add_ps(acc[t][0], low[t][0]), v1 = _mm512_add_ps(acc[t][1], low[t][1]);
    const __m512 v2 = _mm512_add_ps(acc[t][2], low[t][2]), v3 = _mm512_add_ps(acc[t][3], low[t][3]);
    _mm512_storeu_ps(y[t], _mm512_add_ps(_mm512_add_ps(v0, v2), _mm512_add_ps(v1, v3)));
  }
}

// rows at a time: 4 accumulators each (Q4_1: 8), within the 32 registers (measured on a Sapphire Rapids: 3 and
// 4 ~10% faster than 2, which is ~20% faster than 1)
constexpr int T4_1 = 3, T8_0 = 4;
constexpr bool UNSIGNED_Q8 = true;
#elif defined(__x86_64__)
constexpr int LANES = 8;  // a panel's rows: two quads, one 256-bit register of 32-bit sums

// T rows of x against a panel: row t's 8 outputs to y[t]. The one-row kernel takes two blocks at a time, the
// even one's sums in its lanes 0-3, the odd one's in 4-7, added up at the end: each row here keeps the even
// blocks' scaled sums in one accumulator and the odd blocks' in another (for Q4_1 the minima's in two more),
// added up as those lanes are, so that the numbers are its, bit for bit. Q8_0's codes meet x with their sign
// moved onto x (|q| (sign q) x = q x), as the one-row kernel's do.
template <int T, bool Q4_1>
inline void panel_rows(const Panel<LANES>& pn, int64_t nb, const RoundedRow* const* r, const QuadRow* const*,
                       float* const* y) {
  __m256 acc[T][2], low[T][2];
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < 2; ++h) acc[t][h] = low[t][h] = _mm256_setzero_ps();
  for (int64_t e = 0; e < nb; e += 2) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {  // (unrolled: each accumulator a register of its own)
      const int64_t b = e + h;
      if (b >= nb) break;
      const int32_t* w = pn.codes.data() + b * 8 * LANES;
      __m256i s[T];
      for (int t = 0; t < T; ++t) s[t] = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {
        const __m256i wc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + LANES * c));
        for (int t = 0; t < T; ++t) {
          const __m256i xb = _mm256_set1_epi32(four_of(*r[t], b, c));
          s[t] = Q4_1 ? dot_u8s8(s[t], wc, xb) : dot_u8s8(s[t], _mm256_sign_epi8(wc, wc), _mm256_sign_epi8(xb, wc));
        }
      }
      const __m256 d = _mm256_loadu_ps(pn.d.data() + b * LANES);
      for (int t = 0; t < T; ++t) {
        acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(d, _mm256_set1_ps(r[t]->step[b])), acc[t][h]);
        if (Q4_1) low[t][h] = _mm256_fmadd_ps(_mm256_loadu_ps(pn.m.data() + b * LANES), _mm256_set1_ps(r[t]->sum[b]), low[t][h]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    _mm256_storeu_ps(y[t], _mm256_add_ps(_mm256_add_ps(acc[t][0], low[t][0]), _mm256_add_ps(acc[t][1], low[t][1])));
}

constexpr int T4_1 = 2, T8_0 = 2;  // rows at a time, within the 16 registers
constexpr bool UNSIGNED_Q8 = false;
#endif

#if defined(__x86_64__)
template <int T, bool Q4_1>
inline void panel_products(const Panel<LANES>& pn, int64_t nb, const RoundedRows& rows, int64_t from, int64_t to,
                           float* out) {
  int64_t t = from;
  for (; t + T <= to; t += T) {
    const RoundedRow* r[T];
    const QuadRow* x[T];
    float* y[T];
    for (int i = 0; i < T; ++i) r[i] = &rows.r[t + i], x[i] = &rows.x[t + i], y[i] = out + LANES * (t + i - from);
    panel_rows<T, Q4_1>(pn, nb, r, x, y);
  }
  for (; t < to; ++t) {
    const RoundedRow* r[1] = {&rows.r[t]};
    const QuadRow* x[1] = {&rows.x[t]};
    float* y[1] = {out + LANES * (t - from)};
    panel_rows<1, Q4_1>(pn, nb, r, x, y);
  }
}
#endif

// Rows [from, to) of a prompt against quads [first, last) of a matrix (row t's outputs of quad i at
// y[(t - from) * ystride + 4 * i]). On x86, LANES / 4 quads at a time as a panel; on ARM64 each row against
// each quad as a decoded token's row, the quad staying in L1 while the rows pass.
inline void prompt_products(const uint8_t* P, int64_t stride, int64_t nb, int64_t first, int64_t last,
                            const RoundedRows& rows, int64_t from, int64_t to, bool q4_1, float* y, int64_t ystride) {
#if defined(__x86_64__)
  constexpr int64_t QUADS = LANES / ROWS;
  Panel<LANES> pn(nb);
  std::vector<float> out((to - from) * LANES);
  for (int64_t i = first; i < last; i += QUADS) {
    const int64_t count = std::min<int64_t>(QUADS, last - i);
    pn.fill(P, stride, nb, q4_1, UNSIGNED_Q8, i, count);
    if (q4_1) panel_products<T4_1, true>(pn, nb, rows, from, to, out.data());
    else panel_products<T8_0, false>(pn, nb, rows, from, to, out.data());
    for (int64_t t = from; t < to; ++t)
      std::copy_n(out.data() + LANES * (t - from), ROWS * count, y + (t - from) * ystride + ROWS * i);
  }
#else
  for (int64_t i = first; i < last; ++i)
    for (int64_t t = from; t < to; ++t)
      quad_product(P + i * stride, nb, rows.x[t], rows.r[t], q4_1, y + (t - from) * ystride + ROWS * i);
#endif
}

}  // namespace lumen_quads
