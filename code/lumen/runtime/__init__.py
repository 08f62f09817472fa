"""The machine lumen runs on: what the speed wing and the training loop tune, below both and beside nothing
of the chapter's. cpu.py (the CPU's flags, read once), threads.py (the thread count a loop of steps measures as
fastest on a busy machine), heap.py (glibc's heap settings while decoding or training), compiling.py
(torch.compile's options and the C++ compiler check), cache.py (the folder lumen keeps downloads, corpora,
kernels and exported steps in)."""
