#include "tools/bench/bench_bytes.h"

#include <fmt/format.h>

#include <random>

namespace kda::bench {

int64_t VerifyBytes::model() const {
  return state + mixed_qkv + a + b + weights + conv_state + windows + out + records;
}

int64_t ring_step_bytes(const Shape& s) {
  const int64_t HV = s.HV, H = s.H, K = s.K, V = s.V;
  return HV * V * 2 + H * K * 2 + HV * K * 4 + HV * 4;
}

namespace {
int64_t state_bytes(const Shape& s) { return int64_t{s.HV} * s.V * s.K * 4; }

int64_t weight_bytes(const Shape& s) {
  const int64_t D = s.D(), w = s.conv_weight_elem_bytes();
  return int64_t{s.HV} * 4 + int64_t{s.HV} * s.K * 4 + D * kConvWidth * w +
         (s.conv_bias ? D * w : 0);
}
}  // namespace

VerifyBytes verify_bytes(const Shape& s, int B, int T, RecordMode mode) {
  const int64_t N = int64_t{B} * T, D = s.D();
  VerifyBytes v;
  v.state = B * state_bytes(s);
  v.mixed_qkv = N * D * 2;
  v.a = N * s.HV * s.K * 2;
  v.b = N * s.HV * 2;
  v.weights = weight_bytes(s);
  v.conv_state = B * kConvHistory * D * 2;
  v.windows = N * kConvHistory * D * 2;
  v.out = N * s.HV * s.V * 2;
  v.records = mode == RecordMode::kRing ? N * ring_step_bytes(s) : N * state_bytes(s);
  v.qkv_act_trip = 2 * N * D * 2;
  return v;
}

CommitBytes commit_bytes(const Shape& s, int layers, int B, int accepted) {
  const int64_t per = int64_t{layers} * B;
  CommitBytes c;
  c.fold = per * (2 * state_bytes(s) + accepted * ring_step_bytes(s));
  c.snapshot = per * 2 * state_bytes(s);
  c.conv = per * kConvHistory * s.D() * 2 * 2;
  return c;
}

TrackBytes track_bytes(const Shape& s, int layers, int tracks, int step) {
  const int64_t per = int64_t{layers} * tracks;
  const int64_t conv = kConvHistory * s.D() * 2 * 2;
  TrackBytes t;
  t.ring = per * (state_bytes(s) + conv);
  t.snapshot = per * (2 * state_bytes(s) + conv);
  t.deferred = per * (2 * state_bytes(s) + (int64_t{step} + 1) * ring_step_bytes(s) + conv);
  return t;
}

int64_t deferred_round_delta(const Shape& s, int layers, int B, int T, int64_t accepted_sum) {
  const int64_t head_u = int64_t{s.HV} * s.V * 4;  // one step's u records
  const int64_t raw_v_beta = int64_t{s.HV} * (int64_t{s.V} * 2 + 4);
  const int64_t u =
      int64_t{layers} * (int64_t{B} * T * head_u + accepted_sum * (head_u - raw_v_beta));
  return u - int64_t{layers} * B * state_bytes(s);
}

LazyRound lazy_round(const Shape& s, int layers, int B, int T_max, int L, int accepted,
                     int rounds) {
  LazyRound r;
  r.rounds = rounds;
  int64_t pending = 0, history = 0, folded_steps = 0;
  for (int i = 0; i < rounds; ++i) {
    history += pending;  // this round's verifies read the history before the commit
    const int64_t m = pending + accepted;
    if (m + T_max > L) {
      ++r.folds;
      folded_steps += m;
      pending = 0;
    } else {
      pending = m;
    }
  }
  r.history = static_cast<double>(history) / rounds;
  const int64_t per = int64_t{layers} * B;
  // Per round on average: + the history's records, + the folds' state passes and records,
  // - the eager fold's (2 state passes and the accepted steps' records, every round).
  const int64_t lazy = per *
                       (history * ring_step_bytes(s) + r.folds * 2 * state_bytes(s) +
                        folded_steps * ring_step_bytes(s)) /
                       rounds;
  const int64_t eager = per * (2 * state_bytes(s) + int64_t{accepted} * ring_step_bytes(s));
  r.delta = lazy - eager;
  return r;
}

StepBytes step_kda_bytes(const Shape& s, int layers, int B, int T, const std::vector<int>& accepted,
                         int T_max, int L) {
  int64_t sum = 0;
  for (const int n : accepted) {
    sum += n;
  }
  const int64_t verify_ring = int64_t{layers} * verify_bytes(s, B, T, RecordMode::kRing).model();
  const int64_t verify_snap =
      int64_t{layers} * verify_bytes(s, B, T, RecordMode::kSnapshot).model();
  const CommitBytes all = commit_bytes(s, layers, B, 0);  // the fold's ring steps come per request
  StepBytes b;
  b.ring = verify_ring + all.fold + int64_t{layers} * sum * ring_step_bytes(s) + all.conv;
  b.deferred = b.ring + deferred_round_delta(s, layers, B, T, sum);
  b.snapshot = verify_snap + all.snapshot + all.conv;
  if (T_max > 0 && L > 0) {
    b.lazy = b.ring;
    for (const int n : accepted) {
      b.lazy += lazy_round(s, layers, 1, T_max, L, n).delta;
    }
  }
  return b;
}

std::vector<int> step_accepted(uint64_t seed, int T, int B) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(T) * 1000003u +
                      static_cast<uint64_t>(B));
  std::uniform_int_distribution<int> length(1, T);
  std::vector<int> out(static_cast<size_t>(B));
  for (int& n : out) {
    n = length(rng);
  }
  return out;
}

int64_t step_gemm_weight_bytes(const Shape& s, int layers, int hidden, int mlp) {
  const int64_t P = s.D() + int64_t{s.HV} * s.K + s.HV;
  const int64_t per_layer = (P + int64_t{s.HV} * s.V + 2 * int64_t{mlp}) * hidden * 2;
  return per_layer * layers;
}

std::vector<std::string> describe_step_model(const Shape& s, int layers, int hidden, int mlp) {
  std::vector<std::string> l;
  const int64_t P = s.D() + int64_t{s.HV} * s.K + s.HV;
  l.push_back(fmt::format(
      "step (contract §6): per layer x[N, {}] -> input projection GEMM [N, {}] x [{}, {}]^T (bf16, "
      "fp32 accumulate) -> mixed_qkv | a | b as column views (row stride >= {}) -> verify -> "
      "output "
      "projection GEMM [N, {}] x [{}, {}]^T + residual{}; {} layers, then the commit; one CUDA "
      "graph",
      hidden, hidden, P, hidden, P, int64_t{s.HV} * s.V, hidden, int64_t{s.HV} * s.V,
      mlp > 0 ? fmt::format(" -> MLP GEMM pair [{} -> {} -> {}] + residual", hidden, mlp, hidden)
              : std::string(),
      layers));
  l.push_back(
      "  KDA share = the step - the same step without the verifies and the commit (gemm-only); its "
      "byte model: layers * the verify model + the commit of the step's accepted lengths (fold: "
      "2 state passes + n ring steps per request; deferred: one state pass fewer per layer, plus "
      "the u records; snapshot: snapshot read + state write); the deferred model is the two-pass "
      "floor; floor = model / the measured D2D copy rate");
  return l;
}

std::vector<std::string> describe_byte_model(const Shape& s, double hbm_gbps) {
  const VerifyBytes one = verify_bytes(s, 1, 1, RecordMode::kRing);
  const VerifyBytes snap = verify_bytes(s, 1, 1, RecordMode::kSnapshot);
  std::vector<std::string> l;
  l.push_back("byte model, one layer's verify (every byte once; N = B*T; W-1 = 3):");
  const auto line = [&](const char* what, const char* formula, const std::string& value) {
    l.push_back(fmt::format("  {:<22} {:<36} = {}", what, formula, value));
  };
  line("ssm state read", "B*HV*V*K*4", fmt::format("B * {}", one.state));
  line("mixed_qkv", "N*D*2", fmt::format("N * {}", one.mixed_qkv));
  line("a (gate logits)", "N*HV*K*2", fmt::format("N * {}", one.a));
  line("b (beta logits)", "N*HV*2", fmt::format("N * {}", one.b));
  line("A_log, dt_bias, conv w",
       s.conv_bias ? "HV*4 + HV*K*4 + D*W*w + D*w" : "HV*4 + HV*K*4 + D*W*w",
       fmt::format("{}", one.weights));
  line("conv state read", "B*3*D*2", fmt::format("B * {}", one.conv_state));
  line("conv windows written", "N*3*D*2", fmt::format("N * {}", one.windows));
  line("output", "N*HV*V*2", fmt::format("N * {}", one.out));
  line("ring records (ring)", "N*(HV*V*2 + H*K*2 + HV*K*4 + HV*4)",
       fmt::format("N * {}", one.records));
  line("snapshots (snapshot)", "N*HV*V*K*4", fmt::format("N * {}", snap.records));
  line("unfused extra (moved)", "qkv_act write + read: 2*N*D*2",
       fmt::format("N * {} (not in the floor)", one.qkv_act_trip));
  l.push_back(fmt::format(
      "  floor = model bytes / {:.0f} GB/s; GB/s column = bytes the variant moves / time;",
      hbm_gbps));
  l.push_back("  %floor = floor / time (100% = at the floor; unfused rows use the fused model).");
  const VerifyBytes b1 = verify_bytes(s, 1, 4, RecordMode::kRing);
  const int64_t conv_w = s.D() * kConvWidth * s.conv_weight_elem_bytes();
  l.push_back(fmt::format(
      "  (contract §6's floor table matches this model without the conv weights, {} B/call: "
      "T=4 B=1 ring {:.3f} us here, {:.3f} us without)",
      conv_w, floor_us(b1.model(), hbm_gbps), floor_us(b1.model() - conv_w, hbm_gbps)));
  l.push_back(
      "commit, all layers (n = accepted): fold = layers*B*(2*HV*V*K*4 + n*ring step); snapshot = "
      "layers*B*2*HV*V*K*4; conv = layers*B*3*D*2*2; % = of the measured D2D copy rate.");
  return l;
}

std::vector<std::string> describe_track_model(const Shape& s) {
  const TrackBytes one = track_bytes(s, 1, 1, 0);
  std::vector<std::string> l;
  l.push_back(
      "commit tracks (--commit-tracks), added per tracked request and layer (k = track step):");
  const auto line = [&](const char* what, const char* formula, const std::string& value) {
    l.push_back(fmt::format("  {:<22} {:<48} = {}", what, formula, value));
  };
  line("commit+ring+track", "state write + conv window copy 3*D*2*2", fmt::format("{}", one.ring));
  line("commit+track", "snapshot k read + state write + conv window copy",
       fmt::format("{}", one.snapshot));
  line("commit+deferred+track", "state read + write + (k+1) ring steps + conv copy",
       fmt::format("{} + k * {}", one.deferred, ring_step_bytes(s)));
  l.push_back("  commit+deferred (no track) = the conv commit's bytes (pending counts uncounted).");
  return l;
}

}  // namespace kda::bench
