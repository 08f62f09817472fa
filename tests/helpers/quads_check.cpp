// quads.h's block products without torch, for a CPU this machine can only emulate (ARM64 under qemu-user):
// reads one problem from the file argv[1] and writes y to argv[2]. tests/test_quant.py builds it, writes the
// problem from lumen's own quads and holds y to the float64 formula.
//
//     problem: int64 q4_1 (1: Q4_1, 0: Q8_0), n (x's numbers), quads, stride (a quad's bytes);
//              then x (n float32), then the quads (quads x stride bytes)
//     y:       4 x quads float32
#include <cstdio>
#include <vector>

#include "quads.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::FILE* in = std::fopen(argv[1], "rb");
  int64_t head[4];
  if (!in || std::fread(head, sizeof head, 1, in) != 1) return 3;
  const int64_t q4_1 = head[0], n = head[1], quads = head[2], stride = head[3], nb = n / lumen_quads::BLOCK;
  std::vector<float> x(n), y(4 * quads);
  std::vector<uint8_t> packed(quads * stride + lumen_quads::AHEAD_BYTES);  // (prefetches past the end stay inside)
  if (std::fread(x.data(), sizeof(float), n, in) != static_cast<size_t>(n)) return 3;
  if (std::fread(packed.data(), 1, quads * stride, in) != static_cast<size_t>(quads * stride)) return 3;
  std::fclose(in);
  const lumen_quads::RoundedRow r(x.data(), n);
  const lumen_quads::QuadRow xq(r, nb);
  for (int64_t i = 0; i < quads; ++i)
    lumen_quads::quad_product(packed.data() + i * stride, nb, xq, r, q4_1 != 0, y.data() + 4 * i);
  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out || std::fwrite(y.data(), sizeof(float), y.size(), out) != y.size()) return 4;
  return std::fclose(out) == 0 ? 0 : 4;
}
