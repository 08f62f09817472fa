// attend.h's attention for one query without torch, for a CPU this machine can only emulate (ARM64 under
// qemu-user): reads one problem from the file argv[1] and writes y to argv[2]. tests/test_fast_attention.py
// builds it and holds y to softmax attention computed in float64.
//
//     problem: int64 group (query heads of the key head), hd, n (slots); then q (group x hd float32),
//              k and v (n x hd float32 each)
//     y:       group x hd float32
#include <cstdio>
#include <vector>

#include "attend.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::FILE* in = std::fopen(argv[1], "rb");
  int64_t head[3];
  if (!in || std::fread(head, sizeof head, 1, in) != 1) return 3;
  const int64_t group = head[0], hd = head[1], n = head[2];
  std::vector<float> q(group * hd), k(n * hd), v(n * hd), y(group * hd, 0.f), scores(group * n), top(group),
      total(group);
  for (std::vector<float>* a : {&q, &k, &v})
    if (std::fread(a->data(), sizeof(float), a->size(), in) != a->size()) return 3;
  std::fclose(in);
  std::vector<int64_t> slots(n);
  for (int64_t t = 0; t < n; ++t) slots[t] = t;
  lumen_attend::attend_part<0>(q.data(), k.data(), v.data(), group, hd, slots.data(), n, 1.f / std::sqrt(float(hd)),
                               scores.data(), y.data(), top.data(), total.data());
  for (int64_t i = 0; i < group; ++i)
    for (int64_t d = 0; d < hd; ++d) y[i * hd + d] /= total[i];
  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out || std::fwrite(y.data(), sizeof(float), y.size(), out) != y.size()) return 4;
  return std::fclose(out) == 0 ? 0 : 4;
}
