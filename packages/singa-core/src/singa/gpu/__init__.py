"""What GPU backends share: kernels written once in the common subset of OpenCL C and CUDA C++.

`singa.gpu.codegen` renders the element-wise expression table into that subset; `singa/gpu/kernels/*.cl` hold the
hand-written families (reductions, pooling, batch normalisation, softmax and losses, indexing, random numbers, a
portable GEMM); `singa.gpu.table` is the kernel table built on them. A backend adds its prelude (the definitions that
make the subset its own language), its launch interface and its matrix product and convolution.
"""
