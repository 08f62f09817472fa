// quads.h's block products without torch, for a CPU this machine can only emulate (ARM64 under qemu-user):
// reads one problem from the file argv[1] and writes y to argv[2]. tests/test_quant.py builds it, writes the
// problem from lumen's own quads and holds y to the float64 formula.
//
//     problem: int64 q4_1 (1: Q4_1, 0: Q8_0), n (a row's numbers), quads, stride (a quad's bytes), m (rows);
//              then x (m x n float32), then the quads (quads x stride bytes)
//     y:       m x 4 quads float32, a prompt's product (prompt_products); exit 5 where a row's numbers are not,
//              bit for bit, those the row gets alone (quad_product, a decoded token's)
#include <cstdio>
#include <cstring>
#include <vector>

#include "quads.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::FILE* in = std::fopen(argv[1], "rb");
  int64_t head[5];
  if (!in || std::fread(head, sizeof head, 1, in) != 1) return 3;
  const int64_t q4_1 = head[0], n = head[1], quads = head[2], stride = head[3], m = head[4];
  const int64_t nb = n / lumen_quads::BLOCK, ystride = 4 * quads;
  std::vector<float> x(m * n), y(m * ystride), alone(m * ystride);
  std::vector<uint8_t> packed(quads * stride + lumen_quads::AHEAD_BYTES);  // (prefetches past the end stay inside)
  if (std::fread(x.data(), sizeof(float), m * n, in) != static_cast<size_t>(m * n)) return 3;
  if (std::fread(packed.data(), 1, quads * stride, in) != static_cast<size_t>(quads * stride)) return 3;
  std::fclose(in);
  lumen_quads::RoundedRows rows(m);
  rows.round(x.data(), n, 0, m);
  lumen_quads::prompt_products(packed.data(), stride, nb, 0, quads, rows, 0, m, q4_1 != 0, y.data(), ystride);
  for (int64_t i = 0; i < quads; ++i)
    for (int64_t t = 0; t < m; ++t)
      lumen_quads::quad_product(packed.data() + i * stride, nb, rows.x[t], rows.r[t], q4_1 != 0,
                                alone.data() + t * ystride + 4 * i);
  if (std::memcmp(y.data(), alone.data(), y.size() * sizeof(float)) != 0) return 5;
  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out || std::fwrite(y.data(), sizeof(float), y.size(), out) != y.size()) return 4;
  return std::fclose(out) == 0 ? 0 : 4;
}
