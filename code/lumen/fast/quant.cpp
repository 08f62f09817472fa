// lumen's block kernels for torch: x @ w.T for one float32 row x (a decoded token), or for many (a prompt, each
// row rounded as a token's is), from a GGUF matrix's blocks kept in quads (the arithmetic, and the instructions
// each CPU gets, are quads.h's; kernels.py builds this file once per machine, with -march=native).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include "quads.h"

namespace {

using namespace lumen_quads;


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
  const QuadRow xq(r, nb);
  at::parallel_for(0, quads, 4, [&](int64_t begin, int64_t end) {
    // (the stretch's first bytes asked for at once; then each group asks for the bytes AHEAD_BYTES after it)
    for (int64_t a = 0; a < std::min(AHEAD_BYTES, (end - begin) * stride); a += 64) prefetch(P + begin * stride + a);
    for (int64_t i = begin; i < end; ++i) quad_product(P + i * stride, nb, xq, r, q4_1, Y + i * ROWS);
  });
  return y;
}

// A prompt's rows in stretches of this many: their 8-bit x (~4 bytes a number, its copies and steps included)
// stays in the core's L2 while every weight passes over it, and the matrix is read once a stretch
constexpr int64_t STRETCH = 256;

// Y (m x 4 quads) = X @ w.T for m float32 rows X, each row's numbers those `quads_row` gives it alone (the same
// rounding of x, the same sums in the same order); sixteen rows of w (four quads) at a time split between the
// threads, a stretch of rows at a time
at::Tensor quads_rows(const at::Tensor& x, const at::Tensor& packed, bool q4_1) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) % BLOCK == 0,
              "x: contiguous float32 rows of whole blocks");
  const int64_t m = x.size(0), n = x.size(1), nb = n / BLOCK, quads = packed.size(0);
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous(), "quads: uint8 rows");
  TORCH_CHECK(packed.size(1) == nb * ROWS * (q4_1 ? 20 : 34), "quads of ", packed.size(1), " bytes for x of ", n);
  RoundedRows rows(m);
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) { rows.round(x.data_ptr<float>(), n, begin, end); });
  at::Tensor y = at::empty({m, quads * ROWS}, x.options());
  const uint8_t* P = packed.data_ptr<uint8_t>();
  float* Y = y.data_ptr<float>();
  const int64_t stride = packed.size(1), ystride = quads * ROWS, panels = (quads + 3) / 4;
  for (int64_t from = 0; from < m; from += STRETCH) {
    const int64_t to = std::min(m, from + STRETCH);
    at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
      prompt_products(P, stride, nb, 4 * begin, std::min(quads, 4 * end), rows, from, to, q4_1, Y + from * ystride,
                      ystride);
    });
  }
  return y;
}

at::Tensor q4_1_row(const at::Tensor& x, const at::Tensor& packed) { return quads_row(x, packed, true); }
at::Tensor q8_0_row(const at::Tensor& x, const at::Tensor& packed) { return quads_row(x, packed, false); }
at::Tensor q4_1_rows(const at::Tensor& x, const at::Tensor& packed) { return quads_rows(x, packed, true); }
at::Tensor q8_0_rows(const at::Tensor& x, const at::Tensor& packed) { return quads_rows(x, packed, false); }

}  // namespace

// the schemas are quant.py's (torch.library.define); this file gives them CPU kernels
TORCH_LIBRARY_IMPL(lumen, CPU, m) {
  m.impl("q4_1_row", &q4_1_row);
  m.impl("q8_0_row", &q8_0_row);
  m.impl("q4_1_rows", &q4_1_rows);
  m.impl("q8_0_rows", &q8_0_rows);
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
