"""The quads layout: a GGUF matrix's quantized blocks (Q4_1, Q8_0) as one run of bytes in the order a decoded
token's product reads them.

llama.cpp stores a weight row in blocks of 32 numbers: a Q8_0 block is a scale (float16) and 32 signed 8-bit
codes; a Q4_1 block a scale, a minimum (float16) and 32 4-bit codes, two to a byte. A token's product reads
every weight once, from memory: the bytes, not the arithmetic, set its pace. So a matrix's blocks are
reordered into quads (`pack`): four rows side by side, four blocks of each (a group) at a time, each group's
codes followed by its scales and minima, which one pass of x serves four rows at a time. The kernels
(quant.cpp, over quads.h's arithmetic) read quads front to back; `unpack` gives the file's layout back.

    >>> import torch
    >>> codes = torch.randint(-127, 128, (6, 64), dtype=torch.int8)     # a Q8_0 matrix: 6 rows of 2 blocks
    >>> scale = torch.rand(6, 2).half()
    >>> quads_shape(scale, None)      # two quads (rows 6 and 7: zeros), each 4 rows x 2 blocks x 34 bytes
    (2, 272)
    >>> back, back_scale, minimum = unpack(pack(codes, scale, None), 2, "Q8_0")
    >>> back.shape, torch.equal(back[:6], codes), torch.equal(back_scale[:6], scale), minimum
    (torch.Size([8, 64]), True, True, None)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 32  # numbers per block, for both types
ROWS, GROUP = 4, 4  # four rows side by side, four blocks (a group) at a time
SLAB = 4096  # rows packed (or dequantized) at a time: a large matrix is never copied whole (a multiple of ROWS)
BYTES = {"Q4_1": 20, "Q8_0": 34}  # a block's bytes: codes, a scale and (Q4_1) a minimum


def quads_shape(scale: torch.Tensor, minimum: torch.Tensor | None) -> tuple[int, int]:
    """The shape of a matrix's quads, from its scales (out, in / 32) and whether it has minima (Q4_1: 20 bytes a
    block; Q8_0: 34): (quads, bytes of four rows)."""
    out, nb = scale.shape
    return -(-out // ROWS), ROWS * nb * BYTES["Q8_0" if minimum is None else "Q4_1"]


def pack(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None,
         into: torch.Tensor | None = None) -> torch.Tensor:
    """A matrix's blocks (as `formats.gguf.stored_quantized` reads them) in quads, the layout quant.cpp reads front
    to back: (ceil(out / 4), bytes of four rows) uint8. A quad's bytes are its groups of four blocks (a row's last
    group: its last 1-3), each group the four rows' codes one row after another, then the group's scales and,
    for Q4_1, its minima, block by block, the four rows' of a block together (float16). Rows past the matrix
    (out not a multiple of 4) are zeros. The same bytes, in another order: `unpack` gives them back. into: a
    buffer of `quads_shape` to write them to (else a new one)."""
    out, nb = scale.shape
    into = torch.empty(quads_shape(scale, minimum), dtype=torch.uint8, device=codes.device) if into is None else into
    for i in range(0, out, SLAB):
        rows = slice(i, i + SLAB)
        quads, pad = -(-min(SLAB, out - i) // ROWS), -min(SLAB, out - i) % ROWS
        code = F.pad(codes[rows].view(torch.uint8), (0, 0, 0, pad)).view(quads, ROWS, nb, -1)
        floats = [F.pad(t[rows], (0, 0, 0, pad)).view(quads, ROWS, nb) for t in (scale, minimum) if t is not None]
        parts = []
        for b in range(0, nb, GROUP):
            g = slice(b, b + GROUP)
            parts.append(code[:, :, g].reshape(quads, -1))  # row by row
            # block by block, a block's four rows together
            parts += [t[:, :, g].transpose(1, 2).contiguous().view(quads, -1).view(torch.uint8) for t in floats]
        torch.cat(parts, 1, out=into[i // ROWS: i // ROWS + quads])
    return into


def unpack(quads: torch.Tensor, nb: int, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`pack` undone: the quads' rows (4 a quad) as the file holds them: (codes, scale, minimum)."""
    n, per = quads.shape[0], 16 if kind == "Q4_1" else 32  # code bytes per block
    codes: list[torch.Tensor] = []
    floats: list[list[torch.Tensor]] = [[], []] if kind == "Q4_1" else [[]]
    at = 0
    for b in range(0, nb, GROUP):
        k = min(GROUP, nb - b)
        codes.append(quads[:, at: at + ROWS * k * per].reshape(n, ROWS, k * per))
        at += ROWS * k * per
        for part in floats:
            half = quads[:, at: at + 2 * ROWS * k].contiguous().view(torch.float16)
            part.append(half.reshape(n, k, ROWS).transpose(1, 2))
            at += 2 * ROWS * k
    code = torch.cat(codes, 2).reshape(n * ROWS, nb * per)
    scale, *minimum = (torch.cat(part, 2).reshape(n * ROWS, nb) for part in floats)
    return code if kind == "Q4_1" else code.view(torch.int8), scale, minimum[0] if minimum else None


def block_codes(codes: torch.Tensor, kind: str) -> torch.Tensor:
    """Codes as the file holds them (`unpack`), one to a number: (..., in / 32, 32); a Q4_1 block's numbers 0-15
    in the low halves of its 16 bytes, 16-31 in the high halves."""
    if kind == "Q8_0":
        return codes.unflatten(-1, (-1, BLOCK))
    half = codes.unflatten(-1, (-1, BLOCK // 2))  # two codes a byte: a block's low halves, then its high
    return torch.cat([half & 0x0F, half >> 4], -1)
