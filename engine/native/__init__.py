"""The native CPU kernels (csrc/: paged attention and the fused layer ops), built and loaded by
``cpu_kernels``. Below both engine.attention and engine.model, which call them; imports neither."""
