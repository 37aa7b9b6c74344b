// problem.cc: loading and checking a replay directory.
#include "tools/replay/problem.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "tools/npy/npy.h"

namespace kda::replay {
namespace {

using npy::NpyArray;
using npy::NpyType;

bool is_power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

class Loader {
 public:
  Loader(const std::string& dir, const Manifest& m) : dir_(dir), m_(m) {}

  std::string path(const std::string& name) const { return dir_ + "/" + m_.tensors.at(name); }

  NpyArray read(const std::string& name) const { return npy::read_npy(path(name)); }

  template <typename T>
  std::vector<T> read_as(const std::string& name, const std::vector<int64_t>& shape,
                         const std::string& dims) const {
    return npy::read_npy_as<T>(path(name), shape, dims);
  }

  // A dim taken from a file must agree with the manifest's or another file's value.
  void agree(std::optional<int>& value, int64_t found, const std::string& what,
             const std::string& source, std::string& first_source) const {
    if (value) {
      KDA_CHECK(*value == found, "replay: {}: {} is {}, but {} says {}", source, what, found,
                first_source, *value);
      return;
    }
    value = static_cast<int>(found);
    first_source = source;
  }

 private:
  const std::string& dir_;
  const Manifest& m_;
};

}  // namespace

std::vector<int> ReplayProblem::padding_requests() const {
  std::vector<int> pads;
  for (int n = 0; n < B; ++n) {
    if (slots[static_cast<size_t>(n)] < 0) {
      pads.push_back(n);
    }
  }
  return pads;
}

ReplayProblem load_problem(const std::string& dir, std::optional<RecordMode> mode) {
  ReplayProblem p;
  p.dir = dir;
  p.manifest = read_manifest(dir);
  const Manifest& m = p.manifest;
  const Loader in(dir, m);
  p.mode = mode ? *mode : m.mode.value_or(RecordMode::kRing);
  p.B = m.B;
  p.T = m.T;
  p.H = m.H;
  p.HV = m.HV;
  p.K = m.K;
  p.V = m.V;
  p.D = m.D();
  p.N = m.N();
  // ---- draft shape (contract §8): a ragged capture's rows are its packed total ----
  if (m.has("query_start_loc")) {
    KDA_CHECK(!m.has("parents"), "replay: {} and {}: a tree has T nodes per request (not ragged)",
              in.path("query_start_loc"), in.path("parents"));
    p.query_start_loc = in.read_as<int32_t>("query_start_loc", {int64_t{p.B} + 1}, "B+1");
    const std::vector<int32_t>& q = *p.query_start_loc;
    KDA_CHECK(q[0] == 0, "replay: {}: entry 0 is {}, expected 0 (packed rows)",
              in.path("query_start_loc"), q[0]);
    for (int n = 0; n < p.B; ++n) {
      const int32_t len = q[static_cast<size_t>(n) + 1] - q[static_cast<size_t>(n)];
      KDA_CHECK(len >= 1 && len <= p.T, "replay: {}: request {} has {} tokens, expected 1..T = {}",
                in.path("query_start_loc"), n, len, p.T);
    }
    p.N = q.back();
  }
  if (m.has("parents")) {
    KDA_CHECK(p.T <= kMaxTreeNodes, "replay: {}: T = {}, a tree has at most {} nodes",
              in.path("parents"), p.T, kMaxTreeNodes);
    p.parents = in.read_as<int32_t>("parents", {p.B, p.T}, "B, T");
  }
  KDA_CHECK(m.has("accepted_paths") == (m.has("parents") && m.has("accepted")),
            "replay: accepted_paths goes with parents and accepted (a tree's commit), got "
            "parents {}, accepted {}, accepted_paths {}",
            m.has("parents"), m.has("accepted"), m.has("accepted_paths"));
  if (m.has("accepted_paths")) {
    p.accepted_paths = in.read_as<int32_t>("accepted_paths", {p.B, p.T}, "B, T");
  }
  const int64_t N = p.N, D = p.D, HV = p.HV, K = p.K, V = p.V, H = p.H;
  constexpr int64_t W1 = kConvHistory;

  // ---- committed state: S comes from the SSM state ----
  {
    const NpyArray s = in.read("ssm_state");
    npy::expect(s, in.path("ssm_state"), NpyType::kF32, {-1, HV, V, K}, "S, HV, V, K");
    KDA_CHECK(s.shape[0] >= 1, "replay: {}: no slots (dim 0 is 0)", in.path("ssm_state"));
    p.S = static_cast<int>(s.shape[0]);
    p.ssm_state = npy::elements<float>(s, in.path("ssm_state"));
  }
  const int64_t S = p.S;
  if (m.conv_state_layout == ConvLayout::kSWD) {
    p.conv_state = in.read_as<bf16_t>("conv_state", {S, W1, D}, "S, W-1, D; conv_state_layout SWD");
  } else {
    p.conv_state = transpose_last2(
        in.read_as<bf16_t>("conv_state", {S, D, W1}, "S, D, W-1; conv_state_layout SDW"), S, D, W1);
  }

  // ---- activations and weights ----
  p.mixed_qkv =
      in.read_as<bf16_t>("mixed_qkv", {N, D}, "N = B*T (ragged: qsl[B]), D = 2*H*K + HV*V");
  p.a = in.read_as<bf16_t>("a", {N, HV * K}, "N = B*T (ragged: qsl[B]), HV*K");
  p.b = in.read_as<bf16_t>("b", {N, HV}, "N = B*T (ragged: qsl[B]), HV");
  p.A_log = in.read_as<float>("A_log", {HV}, "HV");
  p.dt_bias = in.read_as<float>("dt_bias", {HV * K}, "HV*K");
  {
    const NpyArray w = in.read("conv_weight");
    KDA_CHECK(w.type == NpyType::kF32 || w.type == NpyType::kBF16,
              "npy: {}: dtype is {} ('{}'), expected f32 or bf16", in.path("conv_weight"),
              npy::npy_type_name(w.type), w.descr);
    npy::expect_shape(w, in.path("conv_weight"), {D, kConvWidth},
                      "D, W = 4; an nn.Conv1d weight [D, 1, W] needs .squeeze(1)");
    p.wtype = w.type == NpyType::kF32 ? ConvWeightType::kF32 : ConvWeightType::kBF16;
    p.conv_weight = w.bytes;
    if (m.has("conv_bias")) {
      const NpyArray bias = in.read("conv_bias");
      npy::expect(bias, in.path("conv_bias"), w.type, {D}, "D; dtype of conv_weight");
      p.has_bias = true;
      p.conv_bias = bias.bytes;
    }
  }

  // ---- indices ----
  p.slots = in.read_as<int32_t>("slots", {p.B}, "B");
  if (m.has("rows")) {
    p.rows = in.read_as<int32_t>("rows", {p.B}, "B");
  } else {
    p.rows.resize(static_cast<size_t>(p.B));
    for (int n = 0; n < p.B; ++n) {
      p.rows[static_cast<size_t>(n)] = n;
    }
  }
  if (m.has("accepted")) {
    p.accepted = in.read_as<int32_t>("accepted", {p.B}, "B");
  }

  // ---- scratch geometry: manifest, else the scratch files, else defaults ----
  std::optional<int> T_max = m.T_max, R = m.R;
  std::string t_src = "the manifest", r_src = "the manifest";
  std::optional<NpyArray> window_file, snapshot_file;
  if (m.has("conv_window")) {
    window_file = in.read("conv_window");
    const bool swd = m.conv_window_layout == ConvLayout::kSWD;
    npy::expect(*window_file, in.path("conv_window"), NpyType::kBF16,
                swd ? std::vector<int64_t>{-1, -1, W1, D} : std::vector<int64_t>{-1, -1, D, W1},
                swd ? "R, T_max, W-1, D; conv_window_layout SWD"
                    : "R, T_max, D, W-1; conv_window_layout SDW");
    in.agree(R, window_file->shape[0], "dim 0 (R)", in.path("conv_window"), r_src);
    in.agree(T_max, window_file->shape[1], "dim 1 (T_max)", in.path("conv_window"), t_src);
  }
  if (p.mode == RecordMode::kSnapshot && m.has("snapshots")) {
    snapshot_file = in.read("snapshots");
    npy::expect(*snapshot_file, in.path("snapshots"), NpyType::kF32, {-1, -1, HV, V, K},
                "R, T_max, HV, V, K");
    in.agree(R, snapshot_file->shape[0], "dim 0 (R)", in.path("snapshots"), r_src);
    in.agree(T_max, snapshot_file->shape[1], "dim 1 (T_max)", in.path("snapshots"), t_src);
  }
  p.T_max = T_max.value_or(p.T);
  KDA_CHECK(p.T_max >= p.T, "replay: T_max = {} (from {}) is smaller than T = {}", p.T_max, t_src,
            p.T);
  int max_row = p.B - 1;
  for (int n = 0; n < p.B; ++n) {
    if (p.slots[static_cast<size_t>(n)] >= 0) {
      max_row = std::max(max_row, p.rows[static_cast<size_t>(n)]);
    }
  }
  p.R = R.value_or(max_row + 1);
  KDA_CHECK(p.R >= 1, "replay: R = {} must be >= 1", p.R);

  // ---- index ranges of the real requests (padding requests' rows are never read) ----
  for (int n = 0; n < p.B; ++n) {
    const int32_t slot = p.slots[static_cast<size_t>(n)];
    if (slot < 0) {
      continue;
    }
    const int32_t row = p.rows[static_cast<size_t>(n)];
    KDA_CHECK(slot < p.S,
              "replay: {}: slots[{}] = {} out of range [0, S = {}) (S = ssm_state dim 0)",
              in.path("slots"), n, slot, p.S);
    KDA_CHECK(row >= 0 && row < p.R,
              "replay: {}: rows[{}] = {} out of range [0, R = {}) (R from {})",
              m.has("rows") ? in.path("rows") : "rows (default arange(B))", n, row, p.R,
              R ? r_src : "max(B, max(rows) + 1)");
    for (int k = 0; k < n; ++k) {
      if (p.slots[static_cast<size_t>(k)] < 0) {
        continue;
      }
      KDA_CHECK(p.slots[static_cast<size_t>(k)] != slot,
                "replay: {}: slots[{}] and slots[{}] are both {}: two requests on one slot",
                in.path("slots"), k, n, slot);
      KDA_CHECK(p.rows[static_cast<size_t>(k)] != row,
                "replay: rows[{}] and rows[{}] are both {}: two requests on one scratch row", k, n,
                row);
    }
    // A real request's tree: node 0 the one root, every parent before its child.
    for (int j = 0; p.parents && j < p.T; ++j) {
      const int32_t par = (*p.parents)[static_cast<size_t>(n) * p.T + j];
      KDA_CHECK(j == 0 ? par == -1 : (par >= 0 && par < j),
                "replay: {}: [{}, {}] = {}, expected {}", in.path("parents"), n, j, par,
                j == 0 ? "-1 (node 0 is the root)" : fmt::format("in [0, {})", j));
    }
  }

  // ---- output buffer templates ----
  const int64_t window_elems = int64_t{p.R} * p.T_max * W1 * D;
  if (window_file) {
    p.conv_window = npy::elements<bf16_t>(*window_file, in.path("conv_window"));
    if (m.conv_window_layout == ConvLayout::kSDW) {
      p.conv_window = transpose_last2(p.conv_window, int64_t{p.R} * p.T_max, D, W1);
    }
  } else {
    p.conv_window.assign(static_cast<size_t>(window_elems), bf16_t{0});
  }
  if (p.mode == RecordMode::kSnapshot) {
    if (snapshot_file) {
      p.snapshots = npy::elements<float>(*snapshot_file, in.path("snapshots"));
    } else {
      p.snapshots.assign(static_cast<size_t>(int64_t{p.R} * p.T_max * p.state_elems()), 0.0f);
    }
    p.L = m.L.value_or(kDefaultRingLength);
    p.ring_slots = p.S;
    return p;
  }

  // Ring mode: L and S' from the manifest / ring files.
  std::optional<int> L = m.L, ring_slots;
  std::string l_src = "the manifest", s_src;
  struct RingFile {
    const char* name;
    NpyType type;
    int64_t heads;
    int64_t dim;  // 0: no last dim (beta)
    const char* dims;
  };
  const RingFile ring_files[] = {{"ring_rawv", NpyType::kBF16, HV, V, "S' >= S, HV, L, V"},
                                 {"ring_rawk", NpyType::kBF16, H, K, "S' >= S, H, L, K"},
                                 {"ring_g", NpyType::kF32, HV, K, "S' >= S, HV, L, K"},
                                 {"ring_beta", NpyType::kF32, HV, 0, "S' >= S, HV, L"}};
  std::optional<NpyArray> loaded[4];
  for (int i = 0; i < 4; ++i) {
    const RingFile& f = ring_files[i];
    if (!m.has(f.name)) {
      continue;
    }
    loaded[i] = in.read(f.name);
    npy::expect(*loaded[i], in.path(f.name), f.type,
                f.dim > 0 ? std::vector<int64_t>{-1, f.heads, -1, f.dim}
                          : std::vector<int64_t>{-1, f.heads, -1},
                f.dims);
    in.agree(ring_slots, loaded[i]->shape[0], "dim 0 (ring slots S')", in.path(f.name), s_src);
    in.agree(L, loaded[i]->shape[2], "dim 2 (L)", in.path(f.name), l_src);
  }
  p.L = L.value_or(kDefaultRingLength);
  p.ring_slots = ring_slots.value_or(p.S);
  KDA_CHECK(is_power_of_two(p.L), "replay: ring length L = {} (from {}) must be a power of two",
            p.L, L ? l_src : "the default");
  KDA_CHECK(p.ring_slots >= p.S,
            "replay: {}: dim 0 (ring slots S') is {}, smaller than S = {} (ssm_state dim 0)", s_src,
            p.ring_slots, p.S);
  const int64_t Sr = p.ring_slots, Lr = p.L;
  auto ring_bf16 = [&](int i, int64_t elems) {
    return loaded[i] ? npy::elements<bf16_t>(*loaded[i], in.path(ring_files[i].name))
                     : std::vector<bf16_t>(static_cast<size_t>(elems), bf16_t{0});
  };
  auto ring_f32 = [&](int i, int64_t elems) {
    return loaded[i] ? npy::elements<float>(*loaded[i], in.path(ring_files[i].name))
                     : std::vector<float>(static_cast<size_t>(elems), 0.0f);
  };
  p.ring_rawv = ring_bf16(0, Sr * HV * Lr * V);
  p.ring_rawk = ring_bf16(1, Sr * H * Lr * K);
  p.ring_g = ring_f32(2, Sr * HV * Lr * K);
  p.ring_beta = ring_f32(3, Sr * HV * Lr);
  return p;
}

}  // namespace kda::replay
