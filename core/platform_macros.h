// platform_macros.h: qualifiers shared by host (.cc) and device (.cu) translation units.
#pragma once

#if defined(__CUDACC__)
#define KDA_HD __host__ __device__ __forceinline__
#define KDA_DEVICE __device__ __forceinline__
#else
#define KDA_HD inline
#endif
