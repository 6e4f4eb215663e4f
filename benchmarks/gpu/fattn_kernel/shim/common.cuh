// Stand-in for ggml-cuda/common.cuh when fattn-mma-q.cuh is compiled alone by harness.cu: the few names the
// kernel header uses beyond ggml.h (the real common.cuh needs cuBLAS and the whole backend).
#pragma once
#include <cuda_fp16.h>
#include <cstdio>
#include "ggml.h"

#define GGML_CUDA_CC_AMPERE 800
#define NO_DEVICE_CODE __trap()
static __device__ __forceinline__ void ggml_cuda_pdl_lc() {}
static __device__ __forceinline__ void ggml_cuda_pdl_sync() {}
