// One query's attention for a decoding step, the arithmetic alone (no torch: attend.cpp wraps it for torch,
// and a test builds it for ARM64 and runs it under emulation). The instructions are chosen as it is built:
// AVX2 and FMA on x86-64, NEON on ARM64.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#else
#error "lumen's attention kernel is written for x86-64 (AVX2) and ARM64 (NEON)"
#endif

namespace lumen_attend {

#if defined(__x86_64__)
// x . y over hd numbers (hd a multiple of 8; HD its value when known as the code is built, 0 when not), in
// four running sums so that no product waits for the one before it
template <int64_t HD>
inline float dot(const float* x, const float* y, int64_t hd) {
  const int64_t n = HD ? HD : hd;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t j = 0; j < n; j += 8)
    acc[(j / 8) & 3] = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j), acc[(j / 8) & 3]);
  const __m256 v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y += a x over hd numbers
template <int64_t HD>
inline void add_scaled(float* y, float a, const float* x, int64_t hd) {
  const int64_t n = HD ? HD : hd;
  const __m256 av = _mm256_set1_ps(a);
  for (int64_t j = 0; j < n; j += 8)
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
}

// e^x for eight x <= 0: e^x = 2^k e^r, k the integer nearest x / ln 2, r = x - k ln 2 (ln 2 in two parts, so
// that r is exact), e^r by its Taylor series to r^6 (|r| <= ln 2 / 2: within a unit in the last place)
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));  // (e^-87 is still a normal float)
  const __m256 k =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  for (const float c : {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_k));
}

// e^(s - max s) for n scores in place; returns (max s, their sum)
inline std::pair<float, float> exponentiate(float* s, int64_t n) {
  float best = -INFINITY;
  for (int64_t t = 0; t < n; ++t) best = std::max(best, s[t]);
  const __m256 top = _mm256_set1_ps(best);
  __m256 sum8 = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), top));
    _mm256_storeu_ps(s + t, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  float lanes[8], total = 0.f;
  _mm256_storeu_ps(lanes, sum8);
  for (const float l : lanes) total += l;
  for (; t < n; ++t) total += (s[t] = std::exp(s[t] - best));
  return {best, total};
}

#else
// x . y over hd numbers (hd a multiple of 8; HD its value when known as the code is built, 0 when not), in
// four running sums so that no product waits for the one before it
template <int64_t HD>
inline float dot(const float* x, const float* y, int64_t hd) {
  const int64_t n = HD ? HD : hd;
  float32x4_t acc[4] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)};
  for (int64_t j = 0; j < n; j += 8) {
    acc[(j / 8) & 1] = vfmaq_f32(acc[(j / 8) & 1], vld1q_f32(x + j), vld1q_f32(y + j));
    acc[2 + ((j / 8) & 1)] = vfmaq_f32(acc[2 + ((j / 8) & 1)], vld1q_f32(x + j + 4), vld1q_f32(y + j + 4));
  }
  return vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
}

// y += a x over hd numbers
template <int64_t HD>
inline void add_scaled(float* y, float a, const float* x, int64_t hd) {
  const int64_t n = HD ? HD : hd;
  for (int64_t j = 0; j < n; j += 4) vst1q_f32(y + j, vfmaq_n_f32(vld1q_f32(y + j), vld1q_f32(x + j), a));
}

// e^x for four x <= 0, as the x86 path's exp8: e^x = 2^k e^r, e^r by its Taylor series to r^6
inline float32x4_t exp4(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(-87.f));
  const float32x4_t k = vrndnq_f32(vmulq_n_f32(x, 1.44269504f));
  float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, k, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.f / 720);
  for (const float c : {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = vfmaq_f32(vdupq_n_f32(c), p, r);
  const int32x4_t two_k = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(k), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(two_k));
}

// e^(s - max s) for n scores in place; returns (max s, their sum)
inline std::pair<float, float> exponentiate(float* s, int64_t n) {
  float best = -INFINITY;
  for (int64_t t = 0; t < n; ++t) best = std::max(best, s[t]);
  const float32x4_t top = vdupq_n_f32(best);
  float32x4_t sum4 = vdupq_n_f32(0.f);
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const float32x4_t e = exp4(vsubq_f32(vld1q_f32(s + t), top));
    vst1q_f32(s + t, e);
    sum4 = vaddq_f32(sum4, e);
  }
  float total = vaddvq_f32(sum4);
  for (; t < n; ++t) total += (s[t] = std::exp(s[t] - best));
  return {best, total};
}

#endif

// One key head's group of query heads over a run of n of the slots they may see, each key and value read once
// for all of them: for each head i its largest score top[i], total[i] = sum_t e^(s_t - top[i]) and
// y[i] = sum_t e^(s_t - top[i]) v_t (hd numbers, zeroed before)
template <int64_t HD>
void attend_part(const float* qg, const float* kg, const float* vg, int64_t group, int64_t hd, const int64_t* slots,
                 int64_t n, float scale, float* scores, float* y, float* top, float* total) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < group; ++i) scores[i * n + t] = dot<HD>(qg + i * hd, kg + slots[t] * hd, hd) * scale;
  for (int64_t i = 0; i < group; ++i) std::tie(top[i], total[i]) = exponentiate(scores + i * n, n);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < group; ++i) add_scaled<HD>(y + i * hd, scores[i * n + t], vg + slots[t] * hd, hd);
}

}  // namespace lumen_attend
