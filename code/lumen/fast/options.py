"""What inductor is told when it compiles a decoding step, by torch.compile (decoding.py) or ahead of time
(aot.py): one place both read, so neither imports the other for it."""

from ..runtime.compiling import COMPILE_OPTIONS

# A one-token step is a few hundred kernels, most of them over a few thousand numbers (a norm, a gate, one
# query's attention). Each kernel that inductor splits between threads ends at a barrier, and on a busy machine
# the thread waiting for a core holds the others there: such small loops run on one thread (only loops over at
# least this many numbers per thread are split: the products over the weights are)
DECODE_OPTIONS = {**COMPILE_OPTIONS, "cpp.min_chunk_size": 16384}
