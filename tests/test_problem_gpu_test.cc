// test_problem_gpu_test.cc: a problem built on CUDA is the problem built on the host.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <vector>

#include "kernels/ref/kda_host.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;

TEST_CASE("test_problem: CUDA problems are byte-identical to host ones", "[test_problem][gpu]") {
  VerifyCase c;
  c.B = 3;
  c.T = 4;
  c.H = 1;
  c.HV = 2;
  c.K = 64;
  c.V = 32;
  c.bias = true;
  c.wtype = ConvWeightType::kBF16;
  c.neg_slot = true;
  c.reversed = true;
  c.qkv_pad = 3;
  c.pitch_pad = 5;
  c.seed = 21;
  const VerifyProblem host(c);
  const VerifyProblem cuda(c, Device::cuda(0));
  const VerifyProblem cloned = host.clone_to(Device::cuda(0));
  const VerifyProblem back = cloned.clone_to(Device::host());
  for (int i = 0; i < static_cast<int>(Tensor::kCount); ++i) {
    const Tensor t = static_cast<Tensor>(i);
    INFO("tensor " << tensor_name(t));
    REQUIRE(bitwise_equal(cuda.raw(t), host.raw(t)));
    REQUIRE(bitwise_equal(cloned.raw(t), host.raw(t)));
    REQUIRE(bitwise_equal(back.raw(t), host.raw(t)));
  }
  // Strided accessors read through CUDA too.
  REQUIRE(bitwise_equal(cuda.qkv(), host.qkv()));
  REQUIRE(bitwise_equal(cuda.ssm_state(), host.ssm_state()));
  REQUIRE(cuda.conv_weight() == host.conv_weight());

  // Params carry device pointers.
  const VerifyParams p = cuda.params();
  for (const void* ptr : {static_cast<const void*>(p.mixed_qkv), static_cast<const void*>(p.out),
                          static_cast<const void*>(p.ring_rawk), p.conv_weight}) {
    cudaPointerAttributes attr{};
    REQUIRE(cudaPointerGetAttributes(&attr, ptr) == cudaSuccess);
    REQUIRE(attr.type == cudaMemoryTypeDevice);
  }
  const Buffer accepted = make_buffer({1, 2, 3}, Device::cuda(0));
  CHECK(cuda.commit_params(accepted).accepted == accepted.data());

  // The host reference runs on a host copy of a CUDA problem.
  VerifyProblem a = cuda.clone_to(Device::host());
  VerifyProblem b = host.clone_to(Device::host());
  host::verify_fused(a.params());
  host::verify_fused(b.params());
  REQUIRE(bitwise_equal(a.raw(Tensor::kOut), b.raw(Tensor::kOut)));
}
