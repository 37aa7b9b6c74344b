#include "memory_pool/pool_storage.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace kda {

namespace {

// How a tensor's leading dims read (pool_storage.h).
enum class Lead : uint8_t {
  kSlots,      ///< [layers, S', inner...]
  kRows,       ///< [layers, R', T', inner...]: scratch, the step dim may exceed T_max
  kCursor,     ///< [S'] contiguous
  kPending,    ///< [layers, S'] slot stride 1
  kActivation  ///< [>= R * T_max, D] contiguous
};

enum class Needs : uint8_t { kAlways, kSnapshotMode, kRingMode, kURecords };

struct Spec {
  const char* name;
  DType dtype;
  Lead lead;
  Needs needs;
  int64_t align;               ///< bytes: data address and pitches
  std::vector<int64_t> inner;  ///< exact extents after the slot / row (and step) dims
};

std::vector<Spec> specs(const PoolConfig& c) {
  const int64_t H = c.H, HV = c.HV, K = c.K, V = c.V, L = c.ring_len, D = c.qkv_dim();
  constexpr int64_t W1 = kPoolConvHistory;
  return {
      {"conv_state", DType::kBF16, Lead::kSlots, Needs::kAlways, 4, {W1, D}},
      {"ssm_state", DType::kF32, Lead::kSlots, Needs::kAlways, 16, {HV, V, K}},
      {"conv_window", DType::kBF16, Lead::kRows, Needs::kAlways, 4, {W1, D}},
      {"snapshots", DType::kF32, Lead::kRows, Needs::kSnapshotMode, 16, {HV, V, K}},
      {"ring_rawv", DType::kBF16, Lead::kSlots, Needs::kRingMode, 4, {HV, L, V}},
      {"ring_rawk", DType::kBF16, Lead::kSlots, Needs::kRingMode, 4, {H, L, K}},
      {"ring_g", DType::kF32, Lead::kSlots, Needs::kRingMode, 4, {HV, L, K}},
      {"ring_beta", DType::kF32, Lead::kSlots, Needs::kRingMode, 4, {HV, L}},
      {"ring_cursor", DType::kI32, Lead::kCursor, Needs::kRingMode, 4, {}},
      {"ring_pending", DType::kI32, Lead::kPending, Needs::kRingMode, 4, {}},
      {"ring_u", DType::kF32, Lead::kSlots, Needs::kURecords, 4, {HV, L, V}},
      {"qkv_act", DType::kBF16, Lead::kActivation, Needs::kAlways, 4, {D}},
  };
}

const TensorView& tensor_of(const ExternalPoolTensors& e, const std::string& name) {
  const std::pair<const char*, const TensorView*> all[] = {
      {"conv_state", &e.conv_state},   {"ssm_state", &e.ssm_state},
      {"conv_window", &e.conv_window}, {"snapshots", &e.snapshots},
      {"ring_rawv", &e.ring_rawv},     {"ring_rawk", &e.ring_rawk},
      {"ring_g", &e.ring_g},           {"ring_beta", &e.ring_beta},
      {"ring_cursor", &e.ring_cursor}, {"ring_pending", &e.ring_pending},
      {"ring_u", &e.ring_u},           {"qkv_act", &e.qkv_act}};
  for (const auto& [n, t] : all) {
    if (name == n) {
      return *t;
    }
  }
  KDA_THROW(ErrorCode::kInternal, "external_pool: no tensor named {}", name);
}

std::string list(const std::vector<int64_t>& v) { return fmt::format("{}", fmt::join(v, ", ")); }

// The whole expected shape, with "*" for the dims that may be larger than the config's.
std::string expected_shape(const PoolConfig& c, const Spec& s) {
  const std::string inner = s.inner.empty() ? "" : ", " + list(s.inner);
  switch (s.lead) {
    case Lead::kSlots:
      return fmt::format("[{}, >= {}{}]", c.layers, c.num_slots, inner);
    case Lead::kRows:
      return fmt::format("[{}, >= {}, >= {}{}]", c.layers, c.num_rows, c.T_max, inner);
    case Lead::kCursor:
      return fmt::format("[>= {}]", c.num_slots);
    case Lead::kPending:
      return fmt::format("[{}, >= {}]", c.layers, c.num_slots);
    case Lead::kActivation:
      return fmt::format("[>= {}, {}]", int64_t{c.num_rows} * c.T_max, list(s.inner));
  }
  return "?";
}

const char* needs_text(Needs n) {
  switch (n) {
    case Needs::kAlways:
      return "";
    case Needs::kSnapshotMode:
      return "snapshot mode only (the pool is in ring mode)";
    case Needs::kRingMode:
      return "ring mode only (the pool is in snapshot mode)";
    case Needs::kURecords:
      return "ring mode with the deferred commit only, not the lazy write-back (the pool keeps "
             "no u records)";
  }
  return "";
}

bool applies(const PoolConfig& c, Needs n) {
  switch (n) {
    case Needs::kAlways:
      return true;
    case Needs::kSnapshotMode:
      return !c.ring_mode;
    case Needs::kRingMode:
      return c.ring_mode;
    case Needs::kURecords:
      return c.ring_mode && c.deferred_commit && !c.lazy_commit;
  }
  return false;
}

// `per_layer`: the tensor has no [layers] dim (one layer's view: the ops' verify).
void check_one(const PoolConfig& c, const Spec& s, const TensorView& t, const char* prefix,
               bool per_layer) {
  const std::string name = fmt::format("{}.{}", prefix, s.name);
  KDA_CHECK(applies(c, s.needs), "{}: given, but it is {}", name, needs_text(s.needs));
  KDA_CHECK(t.dtype() == s.dtype, "{}: expected dtype {}, got {}", name, dtype_name(s.dtype),
            dtype_name(t.dtype()));
  KDA_CHECK(t.device() == c.device, "{}: expected memory on {} (the pool's device), got {}", name,
            device_name(c.device), device_name(t.device()));
  const bool layered =
      !per_layer && (s.lead == Lead::kSlots || s.lead == Lead::kRows || s.lead == Lead::kPending);
  const int off = layered ? 1 : 0;  // the slot / row dim
  // Leading dims: ([layers,] S' or R' [, T']) then the exact inner extents.
  const int lead = off + (s.lead == Lead::kRows ? 2 : 1);
  const int ndim = lead + static_cast<int>(s.inner.size());
  bool shape_ok = t.ndim() == ndim;
  for (int d = 0; shape_ok && d < ndim; ++d) {
    const int64_t got = t.size(d);
    if (d >= lead) {
      shape_ok = got == s.inner[static_cast<size_t>(d - lead)];
    } else if (d < off) {
      shape_ok = got == c.layers;
    } else if (s.lead == Lead::kActivation) {
      shape_ok = got >= int64_t{c.num_rows} * c.T_max;
    } else if (d == off) {
      shape_ok = got >= (s.lead == Lead::kRows ? c.num_rows : c.num_slots);
    } else {
      shape_ok = got >= c.T_max;  // kRows: the step dim
    }
  }
  std::string want = expected_shape(c, s);
  if (!layered && (s.lead == Lead::kSlots || s.lead == Lead::kRows || s.lead == Lead::kPending)) {
    want = "[" + want.substr(want.find(", ") + 2);  // without the [layers] dim
  }
  KDA_CHECK(shape_ok, "{}: expected shape {}, got {} (too small, or another layout)", name, want,
            t.shape_str());

  // The dims after the slot / row dim are packed row-major (the kernels compute their offsets);
  // the slot stride of ring_pending, the cursor and qkv_act are packed throughout.
  const bool pitched = s.lead == Lead::kSlots || s.lead == Lead::kRows;
  const int packed_from = pitched ? off + 1 : off;
  const char* unit = s.lead == Lead::kRows ? "row" : "slot";
  int64_t expect = 1;
  for (int d = ndim - 1; d >= packed_from; --d) {
    KDA_CHECK(t.size(d) == 1 || t.stride(d) == expect,
              "{}: dim {} has stride {}, expected {} (the dims after the {} dim are packed "
              "row-major; got strides {})",
              name, d, t.stride(d), expect, pitched ? unit : "first", t.strides_str());
    expect *= t.size(d);
  }
  const int64_t esize = dtype_size(s.dtype);
  KDA_CHECK(reinterpret_cast<uintptr_t>(t.data()) % static_cast<uintptr_t>(s.align) == 0,
            "{}: expected data aligned to {} bytes, got address {}", name, s.align, t.data());
  if (pitched) {
    KDA_CHECK(t.stride(off) >= expect,
              "{}: {} pitch stride({}) = {} is smaller than one packed {} ({} elements): {}s "
              "would overlap",
              name, unit, off, t.stride(off), unit, expect, unit);
    for (int d = 0; d <= off; ++d) {
      KDA_CHECK((t.stride(d) * esize) % s.align == 0,
                "{}: stride({}) = {} elements is not a multiple of {} bytes (the kernels' vector "
                "accesses)",
                name, d, t.stride(d), s.align);
    }
  }
  if (layered && c.layers > 1) {
    KDA_CHECK(t.stride(0) >= t.size(1) * t.stride(1),
              "{}: layer pitch stride(0) = {} is smaller than {} x {} = {}: layers would overlap "
              "(layer-major layout expected)",
              name, t.stride(0), t.size(1), t.stride(1), t.size(1) * t.stride(1));
  }
}

}  // namespace

bool ExternalPoolTensors::any() const {
  for (const TensorView* t :
       {&conv_state, &ssm_state, &conv_window, &snapshots, &ring_rawv, &ring_rawk, &ring_g,
        &ring_beta, &ring_cursor, &ring_pending, &ring_u, &qkv_act}) {
    if (t->defined()) {
      return true;
    }
  }
  return false;
}

void validate_external_tensors(const PoolConfig& config, const ExternalPoolTensors& external,
                               const char* prefix, bool with_qkv_act, bool per_layer) {
  struct Span {
    const char* name;
    uintptr_t begin, end;
  };
  std::vector<Span> spans;
  for (const Spec& s : specs(config)) {
    const TensorView& t = tensor_of(external, s.name);
    if (!t.defined() || (!with_qkv_act && std::strcmp(s.name, "qkv_act") == 0)) {
      continue;
    }
    check_one(config, s, t, prefix, per_layer);
    const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data());
    const uintptr_t end = begin + static_cast<uintptr_t>(t.span_bytes());
    for (const Span& other : spans) {
      KDA_CHECK(end <= other.begin || other.end <= begin,
                "{}.{}: its bytes [{:#x}, {:#x}) overlap {}.{}'s [{:#x}, {:#x}) (every pool "
                "tensor needs memory of its own)",
                prefix, s.name, begin, end, prefix, other.name, other.begin, other.end);
    }
    spans.push_back({s.name, begin, end});
  }
}

TensorView external_pool_view(const PoolConfig& config, const char* name, const TensorView& t) {
  for (const Spec& s : specs(config)) {
    if (std::strcmp(s.name, name) != 0) {
      continue;
    }
    switch (s.lead) {
      case Lead::kSlots:
      case Lead::kPending:
        return t.narrow(1, 0, config.num_slots);
      case Lead::kRows:
        return t.narrow(1, 0, config.num_rows).narrow(2, 0, config.T_max);
      case Lead::kCursor:
        return t.narrow(0, 0, config.num_slots);
      case Lead::kActivation:
        return t.narrow(0, 0, int64_t{config.num_rows} * config.T_max);
    }
  }
  KDA_THROW(ErrorCode::kInternal, "external_pool_view: no tensor named {}", name);
}

}  // namespace kda
