// fast_gpu_test.cc: the fast-output verify (contract §10; VerifySchedule::kFastChunk) on the CUDA
// kernels, on garbage-filled problems (records and outputs random, never zero; NaN in padding):
//   (b) against the exact fused verify of the same inputs: >= 99.9% of bf16 outputs bitwise
//       equal over each table, none more than 1 ulp apart: both gates, GQA, K = 64 and 128, bf16
//       and f32 conv weights, T = 1..16, input scales x0.1..x4, dense and ragged chains;
//   (c) against the host fp64 oracle: rel L2 at most 1.25x the exact path's;
//   records: ring records, conv windows bitwise the exact verify's; ssm_state and conv_state
//       untouched; the committed state after verify + commit bitwise the exact mode's;
//   (a) batch invariance: a request's outputs bitwise the same at every fast tile, in a sub-batch,
//       in another batch order, from another slot, in a CUDA graph, dense vs ragged (equal T_n).
// Planted faults (fast_faults_gpu.h: 1xTF32, a decay ratio a step late, token 1 without its
// intra-chunk terms, the output mask off by one, a staggered CTA's late tile a column short) each
// make the (b) or (c) check fail.
// Statistics of (b) and (c) are printed per table (WARN), for the closing note.
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kda_kernels.h"
#include "kernels/ref/kda_host.h"
#include "tests/fast_faults_gpu.h"
#include "tests/output_compare.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;

namespace {

const Device kGpu = Device::cuda(0);

/// Rows of a dense batch: request n at n * T, T tokens.
struct Rows {
  std::vector<int64_t> first;
  std::vector<int32_t> lengths;
};
Rows dense_rows(int B, int T) {
  Rows r;
  for (int n = 0; n < B; ++n) {
    r.first.push_back(static_cast<int64_t>(n) * T);
    r.lengths.push_back(T);
  }
  return r;
}
Rows ragged_rows(const std::vector<int32_t>& off) {
  Rows r;
  for (size_t n = 0; n + 1 < off.size(); ++n) {
    r.first.push_back(off[n]);
    r.lengths.push_back(off[n + 1] - off[n]);
  }
  return r;
}

void run_verify(const VerifyParams& p, int block_v, cudaStream_t stream = nullptr) {
  kernels::invoke_verify_fused(p, block_v, stream);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
}

VerifyParams fast(VerifyParams p) {
  p.numerics = VerifyNumerics::kFast;
  return p;
}

/// Multiplies the token inputs and the committed SSM state by `scale` (bf16 inputs rounded).
void scale_inputs(VerifyProblem& x, float scale) {
  std::vector<bf16_t> q = x.get<bf16_t>(Tensor::kQkv);
  for (bf16_t& e : q) {
    e = float_to_bf16(bf16_to_float(e) * scale);
  }
  x.set(Tensor::kQkv, q);
  std::vector<float> s = x.get<float>(Tensor::kSsmState);
  for (float& e : s) {
    e *= scale;
  }
  x.set(Tensor::kSsmState, s);
}

std::vector<int32_t> ragged_offsets(int B, int T, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> off(static_cast<size_t>(B) + 1, 0);
  for (int n = 0; n < B; ++n) {
    off[n + 1] = off[n] + 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(T));
  }
  return off;
}

struct FastCase {
  VerifyCase c;
  float scale;
  bool ragged;
};

/// The §10 (b) / (c) / records comparison of one case at the default fast tile.
void compare_case(const FastCase& fc, OutCompare& agree, double& worst_ratio) {
  const VerifyCase& c = fc.c;
  VerifyProblem exact(c, kGpu);
  scale_inputs(exact, fc.scale);
  VerifyProblem fastp = exact.clone_to(kGpu);
  Buffer offsets;
  VerifyParams pe = exact.params(), pf = fast(fastp.params());
  Rows rows = dense_rows(c.B, c.T);
  if (fc.ragged) {
    const std::vector<int32_t> off = ragged_offsets(c.B, c.T, c.seed);
    rows = ragged_rows(off);
    offsets = make_buffer(off, kGpu);
    pe.token_offsets = pf.token_offsets = static_cast<const int32_t*>(offsets.data());
  }
  const int bv = kernels::default_fast_block_v(c.B, c.HV, c.V, 132);
  const kernels::VerifyPlan plan = kernels::plan_verify_on_device(pf, VerifyPath::kFused, bv);
  REQUIRE(plan.schedule == kernels::VerifySchedule::kFastChunk);
  REQUIRE(plan.numerics == VerifyNumerics::kFast);
  const std::vector<uint8_t> state0 = fastp.raw(Tensor::kSsmState);
  const std::vector<uint8_t> conv0 = fastp.raw(Tensor::kConvState);
  run_verify(pe, bv);
  run_verify(pf, bv);
  // Records and windows: the exact verify's, bitwise; the committed state untouched.
  for (const Tensor t : {Tensor::kRingRawk, Tensor::kRingRawv, Tensor::kRingG, Tensor::kRingBeta,
                         Tensor::kConvWindow}) {
    CAPTURE(tensor_name(t));
    REQUIRE(bitwise_equal(fastp.raw(t), exact.raw(t)));
  }
  REQUIRE(bitwise_equal(fastp.raw(Tensor::kSsmState), state0));
  REQUIRE(bitwise_equal(fastp.raw(Tensor::kConvState), conv0));
  // (b): per case no element beyond 1 ulp (the share of equal ones is checked over the table).
  const std::vector<bf16_t> of = fastp.out(), oe = exact.out();
  const OutCompare one =
      compare_requests(of, oe, rows.first, rows.lengths, exact.pad_request(), c.HV, c.V);
  CAPTURE(one.max_raw_ulp, one.equal_fraction());
  CHECK(one.max_ulp <= kMaxUlp);
  agree.merge(one);
  // (c): against the fp64 oracle (dense cases: the oracle takes the dense layout).
  if (!fc.ragged) {
    const VerifyProblem host = exact.clone_to(Device::host());
    const host::Fp64Verify ref = host::verify_fp64(host.params());
    std::vector<double> ref_rows(ref.out.begin(), ref.out.end());
    const int pad = host.pad_request();
    const int64_t row = static_cast<int64_t>(c.T) * c.HV * c.V;
    auto real_rows = [&](std::vector<double> v) {  // padding rows dropped (their outputs are 0)
      if (pad >= 0) {
        v.erase(v.begin() + pad * row, v.begin() + (pad + 1) * row);
      }
      return v;
    };
    auto as_double = [](const std::vector<bf16_t>& v) {
      std::vector<double> d(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        d[i] = bf16_to_float(v[i]);
      }
      return d;
    };
    const std::vector<double> r = real_rows(ref_rows);
    const double e_exact = rel_l2(real_rows(as_double(oe)), r);
    const double e_fast = rel_l2(real_rows(as_double(of)), r);
    CAPTURE(e_exact, e_fast);
    CHECK(e_fast <= 1.25 * std::max(e_exact, 1e-7));
    worst_ratio = std::max(worst_ratio, e_fast / std::max(e_exact, 1e-7));
  }
}

}  // namespace

TEST_CASE("fast outputs: within 1 ulp of exact, >= 99.9% bitwise, fp64 error <= 1.25x exact",
          "[gpu][fast]") {
  std::vector<FastCase> cases;
  uint64_t seed = 100;
  for (const int K : {64, 128}) {
    for (const bool safe : {false, true}) {
      for (const int T : {1, 2, 3, 4, 7, 8, 9, 16}) {
        for (const float scale : {0.1f, 1.0f, 4.0f}) {
          VerifyCase c =
              make_case(T <= 4 ? 5 : 3, T, 2, 4, K, K == 128 ? 128 : 96, RecordMode::kRing, ++seed);
          c.safe_gate = safe;
          c.wtype = (seed % 2) != 0 ? ConvWeightType::kF32 : ConvWeightType::kBF16;
          c.bias = (seed % 3) != 0;
          c.neg_slot = T == 4 || T == 9;
          c.reversed = (seed % 2) == 0;
          c.L = 32;
          c.qkv_pad = (seed % 4) == 0 ? 8 : 0;
          cases.push_back({c, scale, false});
          if (scale == 1.0f && T >= 2) {
            // Ragged rows are packed: the dense padding request's NaN input rows would fall
            // inside live requests, so the ragged form of a case has no padding request.
            VerifyCase r = c;
            r.neg_slot = false;
            cases.push_back({r, scale, true});
          }
        }
      }
    }
  }
  OutCompare agree;
  double worst_ratio = 0.0;
  for (const FastCase& fc : cases) {
    CAPTURE(fc.c, fc.scale, fc.ragged);
    compare_case(fc, agree, worst_ratio);
  }
  WARN("fast vs exact over " << cases.size() << " cases, " << agree.elems << " outputs: "
                             << 100.0 * agree.equal_fraction() << "% bitwise equal, max "
                             << agree.max_ulp << " ulp (" << agree.max_raw_ulp
                             << " without the floor), rel L2 at most " << agree.rel_l2()
                             << " ulp; fp64 rel L2 fast / exact at most " << worst_ratio);
  CHECK(agree.meets_contract());
}

TEST_CASE("fast outputs: bitwise batch-invariant (tile, sub-batch, order, slot, graph, ragged)",
          "[gpu][fast]") {
  VerifyCase c = make_case(6, GENERATE(4, 8, 13), 2, 4, 128, 128, RecordMode::kRing, 7);
  c.reversed = true;
  c.L = 32;
  c.extra_slots = 3;
  CAPTURE(c);
  VerifyProblem base(c, kGpu);
  const VerifyParams p = fast(base.params());
  run_verify(p, 128);
  const std::vector<bf16_t> ref = base.out();
  const int64_t per_req = static_cast<int64_t>(c.T) * c.HV * c.V;
  auto request_rows = [&](const std::vector<bf16_t>& v, int n) {
    return std::vector<bf16_t>(v.begin() + n * per_req, v.begin() + (n + 1) * per_req);
  };

  SECTION("every fast tile") {
    for (const int bv : kernels::kFastBlockVs) {
      CAPTURE(bv);
      run_verify(p, bv);
      REQUIRE(bitwise_equal(base.out(), ref));
    }
  }
  SECTION("a sub-batch: the first requests alone") {
    VerifyParams q = p;
    q.B = 2;
    base.set(Tensor::kOut, std::vector<bf16_t>(ref.size(), float_to_bf16(7.0f)));
    run_verify(q, 64);
    const std::vector<bf16_t> got = base.out();
    for (int n = 0; n < 2; ++n) {
      REQUIRE(bitwise_equal(request_rows(got, n), request_rows(ref, n)));
    }
  }
  SECTION("another batch order, request 0 from a spare slot") {
    VerifyProblem perm = base.clone_to(kGpu);
    const std::vector<int32_t> slots = base.slots(), rows = base.rows();
    std::vector<int> order(static_cast<size_t>(c.B));  // new position i holds old request order[i]
    for (int i = 0; i < c.B; ++i) {
      order[i] = (i * 5 + 2) % c.B;
    }
    // Request 0's state and conv state copied to a slot outside the batch.
    int spare = base.num_slots() - 1;
    while (std::find(slots.begin(), slots.end(), spare) != slots.end()) {
      --spare;
    }
    REQUIRE(spare >= 0);
    std::vector<float> st = perm.get<float>(Tensor::kSsmState);
    const int64_t se = base.state_elems();
    std::copy(st.begin() + slots[0] * se, st.begin() + (slots[0] + 1) * se,
              st.begin() + spare * se);
    perm.set(Tensor::kSsmState, st);
    std::vector<bf16_t> cs = perm.get<bf16_t>(Tensor::kConvState);
    const int64_t ce = static_cast<int64_t>(kConvHistory) * base.D();
    std::copy(cs.begin() + slots[0] * ce, cs.begin() + (slots[0] + 1) * ce,
              cs.begin() + spare * ce);
    perm.set(Tensor::kConvState, cs);
    std::vector<int32_t> ps(slots.size()), pr(rows.size());
    for (int i = 0; i < c.B; ++i) {
      ps[i] = order[i] == 0 ? spare : slots[order[i]];
      pr[i] = rows[order[i]];
    }
    perm.set(Tensor::kSlots, ps);
    perm.set(Tensor::kRows, pr);
    for (const Tensor t : {Tensor::kQkv, Tensor::kA, Tensor::kB}) {
      const std::vector<bf16_t> v = base.get<bf16_t>(t);
      const int64_t per = static_cast<int64_t>(v.size()) / c.B;
      std::vector<bf16_t> w(v.size());
      for (int i = 0; i < c.B; ++i) {
        std::copy(v.begin() + order[i] * per, v.begin() + (order[i] + 1) * per,
                  w.begin() + i * per);
      }
      perm.set(t, w);
    }
    run_verify(fast(perm.params()), 32);
    const std::vector<bf16_t> got = perm.out();
    for (int i = 0; i < c.B; ++i) {
      CAPTURE(i, order[i]);
      REQUIRE(bitwise_equal(request_rows(got, i), request_rows(ref, order[i])));
    }
  }
  SECTION("a few resident CTAs walking every item (padding rows among them)") {
    // Each CTA copies its next item's inputs and state tile under the current item's work (none
    // for a padding row); the outputs must not depend on the grid. A padding request among them,
    // dense and ragged rows (equal lengths and mixed ones).
    VerifyCase cp = c;
    cp.neg_slot = true;
    cp.pad_at = 2;
    VerifyProblem padded(cp, kGpu);
    const std::vector<int32_t> mixed = ragged_offsets(c.B, c.T, 5);
    const Buffer mixed_offsets = make_buffer(mixed, kGpu);
    for (const bool ragged : {false, true}) {
      VerifyParams q = fast(padded.params());
      if (ragged) {
        q.token_offsets = static_cast<const int32_t*>(mixed_offsets.data());
      }
      const int64_t out_elems = static_cast<int64_t>(ref.size());
      kernels::LaunchOverrides per_item;
      per_item.persistent = kernels::PersistentMode::kNever;
      for (const int bv : kernels::kFastBlockVs) {
        CAPTURE(ragged, bv);
        const kernels::VerifyPlan alone =
            kernels::plan_verify_on_device(q, VerifyPath::kFused, bv, per_item);
        REQUIRE(alone.grid == alone.items);
        padded.set(Tensor::kOut, std::vector<bf16_t>(out_elems, float_to_bf16(-9.0f)));
        kernels::invoke_verify_fused(q, bv, nullptr, per_item);
        REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
        const std::vector<bf16_t> want = padded.out();
        for (const int ctas : {1, 3, 5}) {
          CAPTURE(ctas);
          kernels::LaunchOverrides o;
          o.persistent = kernels::PersistentMode::kAlways;
          o.persistent_max_ctas = ctas;
          const kernels::VerifyPlan plan =
              kernels::plan_verify_on_device(q, VerifyPath::kFused, bv, o);
          // Beyond one token chunk (8) there is no walk: a CTA per item whatever the overrides.
          const bool walks = kernels::fast_walk_possible(q);
          REQUIRE(walks == (c.T <= 8));
          REQUIRE(plan.grid == (walks ? std::min<int64_t>(ctas, plan.items) : plan.items));
          padded.set(Tensor::kOut, std::vector<bf16_t>(out_elems, float_to_bf16(-9.0f)));
          kernels::invoke_verify_fused(q, bv, nullptr, o);
          REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
          REQUIRE(bitwise_equal(padded.out(), want));
        }
      }
    }
    // A plan whose grid is not 1..items is refused before anything runs.
    const VerifyParams q = fast(padded.params());
    kernels::VerifyPlan bad = kernels::plan_verify_on_device(q, VerifyPath::kFused, 64);
    bad.grid = bad.items + 1;
    padded.set(Tensor::kOut, std::vector<bf16_t>(ref.size(), float_to_bf16(-9.0f)));
    CHECK_THROWS_WITH(kernels::invoke_verify(q, bad, nullptr), Catch::Contains("CTAs, got"));
    REQUIRE(bitwise_equal(padded.out(), std::vector<bf16_t>(ref.size(), float_to_bf16(-9.0f))));
  }
  SECTION("staggered tiles: the same bits as early ones; refused on walking and exact plans") {
    // A staggered plan's odd-parity CTAs stage their state tile after the first chunk's gates.
    // Forced on a small grid (the plan staggers only beyond one wave), with a padding request,
    // dense and mixed ragged rows, at every fast tile: bitwise the unstaggered outputs.
    VerifyCase cp = c;
    cp.neg_slot = true;
    cp.pad_at = 1;
    VerifyProblem padded(cp, kGpu);
    const std::vector<int32_t> mixed = ragged_offsets(c.B, c.T, 7);
    const Buffer mixed_offsets = make_buffer(mixed, kGpu);
    const int64_t out_elems = static_cast<int64_t>(ref.size());
    kernels::LaunchOverrides per_item;
    per_item.persistent = kernels::PersistentMode::kNever;
    per_item.fast_stagger = false;
    for (const bool ragged : {false, true}) {
      VerifyParams q = fast(padded.params());
      if (ragged) {
        q.token_offsets = static_cast<const int32_t*>(mixed_offsets.data());
      }
      for (const int bv : kernels::kFastBlockVs) {
        CAPTURE(ragged, bv);
        const kernels::VerifyPlan early =
            kernels::plan_verify_on_device(q, VerifyPath::kFused, bv, per_item);
        REQUIRE(early.grid == early.items);
        REQUIRE_FALSE(early.stagger_tiles);
        padded.set(Tensor::kOut, std::vector<bf16_t>(out_elems, float_to_bf16(-9.0f)));
        kernels::invoke_verify(q, early, nullptr);
        REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
        const std::vector<bf16_t> want = padded.out();
        kernels::VerifyPlan staggered = early;
        staggered.stagger_tiles = true;
        // The same fill: rows past a ragged batch's last token are nobody's.
        padded.set(Tensor::kOut, std::vector<bf16_t>(out_elems, float_to_bf16(-9.0f)));
        kernels::invoke_verify(q, staggered, nullptr);
        REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
        REQUIRE(bitwise_equal(padded.out(), want));
      }
    }
    const VerifyParams q = fast(padded.params());
    const std::vector<bf16_t> garbage(ref.size(), float_to_bf16(-5.0f));
    // A walking plan that staggers: refused before anything runs.
    if (kernels::fast_walk_possible(q)) {
      kernels::LaunchOverrides walk;
      walk.persistent = kernels::PersistentMode::kAlways;
      walk.persistent_max_ctas = 3;
      kernels::VerifyPlan bad = kernels::plan_verify_on_device(q, VerifyPath::kFused, 64, walk);
      REQUIRE(bad.grid < bad.items);
      bad.stagger_tiles = true;
      padded.set(Tensor::kOut, garbage);
      CHECK_THROWS_WITH(kernels::invoke_verify(q, bad, nullptr),
                        Catch::Contains("staggers its tiles"));
      REQUIRE(bitwise_equal(padded.out(), garbage));
    }
    // An exact plan that staggers: refused.
    kernels::VerifyPlan exact_plan =
        kernels::plan_verify_on_device(padded.params(), VerifyPath::kFused, 64);
    REQUIRE(exact_plan.numerics == VerifyNumerics::kExact);
    exact_plan.stagger_tiles = true;
    padded.set(Tensor::kOut, garbage);
    CHECK_THROWS_WITH(kernels::invoke_verify(padded.params(), exact_plan, nullptr),
                      Catch::Contains("staggers its tiles"));
    REQUIRE(bitwise_equal(padded.out(), garbage));
  }
  SECTION("CUDA graph replay") {
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    base.set(Tensor::kOut, std::vector<bf16_t>(ref.size(), float_to_bf16(-3.0f)));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    kernels::invoke_verify_fused(p, 64, s);
    REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
    REQUIRE(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(ge, s) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(ge, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    REQUIRE(bitwise_equal(base.out(), ref));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
  }
  SECTION("ragged rows with equal lengths") {
    std::vector<int32_t> off(static_cast<size_t>(c.B) + 1);
    for (int n = 0; n <= c.B; ++n) {
      off[n] = n * c.T;
    }
    const Buffer ob = make_buffer(off, kGpu);
    VerifyParams q = p;
    q.token_offsets = static_cast<const int32_t*>(ob.data());
    REQUIRE((kernels::plan_verify_on_device(q, VerifyPath::kFused, 128).features &
             kernels::kRaggedRows) != 0);
    base.set(Tensor::kOut, std::vector<bf16_t>(ref.size(), float_to_bf16(5.0f)));
    run_verify(q, 128);
    REQUIRE(bitwise_equal(base.out(), ref));
  }
}

TEST_CASE("fast outputs: the committed state after rounds is the exact mode's, bitwise",
          "[gpu][fast]") {
  VerifyCase c = make_case(4, 6, 2, 4, 128, 128, RecordMode::kRing, 31);
  c.neg_slot = true;
  c.reversed = true;
  c.L = 16;
  VerifyProblem exact(c, kGpu);
  VerifyProblem fastp = exact.clone_to(kGpu);
  std::mt19937 rng(5);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    run_verify(exact.params(), 64);
    run_verify(fast(fastp.params()), 64);
    std::vector<int32_t> accepted(static_cast<size_t>(c.B));
    for (int32_t& n : accepted) {
      n = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(c.T));
    }
    const Buffer acc = make_buffer(accepted, kGpu);
    kernels::invoke_commit(exact.commit_params(acc), nullptr);
    kernels::invoke_commit(fastp.commit_params(acc), nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(bitwise_equal(fastp.raw(Tensor::kSsmState), exact.raw(Tensor::kSsmState)));
    REQUIRE(bitwise_equal(fastp.raw(Tensor::kConvState), exact.raw(Tensor::kConvState)));
    // New draft inputs for the next round, the same on both.
    std::vector<bf16_t> q = exact.get<bf16_t>(Tensor::kQkv);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    for (bf16_t& e : q) {
      e = float_to_bf16(nd(rng));
    }
    exact.set(Tensor::kQkv, q);
    fastp.set(Tensor::kQkv, q);
  }
}

TEST_CASE("fast outputs: the plan keeps exact where §10 does not apply", "[gpu][fast]") {
  VerifyCase c = make_case(2, 4, 1, 2, 128, 128, RecordMode::kRing, 3);
  VerifyProblem x(c, kGpu);
  VerifyParams p = fast(x.params());
  CHECK(kernels::plan_verify_on_device(p, VerifyPath::kFused, 64).schedule ==
        kernels::VerifySchedule::kFastChunk);
  CHECK(kernels::plan_verify_on_device(p, VerifyPath::kFused, 16).numerics ==
        VerifyNumerics::kExact);  // not a fast tile
  CHECK(kernels::plan_verify_on_device(p, VerifyPath::kUnfused, 0).numerics ==
        VerifyNumerics::kExact);
  VerifyParams s = fast(x.params(RecordMode::kSnapshot));
  CHECK(kernels::plan_verify_on_device(s, VerifyPath::kFused, 64).numerics ==
        VerifyNumerics::kExact);
}

TEST_CASE("fast outputs: each planted fault fails the checks", "[gpu][fast]") {
  const PlantedFastFault fault =
      GENERATE(PlantedFastFault::kOneTf32Product, PlantedFastFault::kDecayOffByOne,
               PlantedFastFault::kDropIntraTerm, PlantedFastFault::kMaskOffByOne,
               PlantedFastFault::kLateTileShort);
  CAPTURE(planted_fast_fault_name(fault));
  VerifyCase c = make_case(8, 8, 2, 4, 128, 128, RecordMode::kRing, 77);
  c.L = 16;
  VerifyProblem exact(c, kGpu);
  VerifyProblem planted = exact.clone_to(kGpu);
  VerifyProblem good = exact.clone_to(kGpu);
  run_verify(exact.params(), 64);
  run_verify(fast(good.params()), 64);
  verify_fast_with_fault(fast(planted.params()), fault);
  const Rows rows = dense_rows(c.B, c.T);
  const OutCompare ok =
      compare_requests(good.out(), exact.out(), rows.first, rows.lengths, -1, c.HV, c.V);
  const OutCompare bad =
      compare_requests(planted.out(), exact.out(), rows.first, rows.lengths, -1, c.HV, c.V);
  const VerifyProblem host = exact.clone_to(Device::host());
  const host::Fp64Verify ref = host::verify_fp64(host.params());
  auto err = [&](const std::vector<bf16_t>& o) {
    std::vector<double> d(o.size());
    for (size_t i = 0; i < o.size(); ++i) {
      d[i] = bf16_to_float(o[i]);
    }
    return rel_l2(d, ref.out);
  };
  const double e_exact = err(exact.out()), e_good = err(good.out()), e_bad = err(planted.out());
  WARN(planted_fast_fault_name(fault)
       << ": " << 100.0 * bad.equal_fraction() << "% equal, max " << bad.max_ulp
       << " ulp, fp64 rel L2 " << e_bad << " (fast " << e_good << ", exact " << e_exact << ")");
  // The correct kernel passes what the planted one must fail.
  REQUIRE(ok.meets_contract());
  REQUIRE(e_good <= 1.25 * std::max(e_exact, 1e-7));
  const bool fails = !bad.meets_contract() || e_bad > 1.25 * std::max(e_exact, 1e-7);
  CHECK(fails);
}
