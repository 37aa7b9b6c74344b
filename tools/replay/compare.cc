// compare.cc: element-wise comparison of two replay output directories.
#include "tools/replay/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "tools/npy/npy.h"

namespace kda::replay {
namespace {

using npy::NpyArray;
using npy::NpyType;

// Contract order of the outputs; also the bitwise-contract set.
constexpr const char* kContractTensors[] = {"output",    "conv_window", "snapshots",
                                            "ring_rawv", "ring_rawk",   "ring_g",
                                            "ring_beta", "ssm_state",   "conv_state"};

// One element decoded: its bits, its value, and its position on the ordered number line
// (sign-magnitude bits folded so that adjacent representable values differ by one).
struct Elem {
  uint32_t bits = 0;
  double value = 0.0;
  int64_t ordered = 0;
};

Elem decode(const NpyArray& a, int64_t i) {
  Elem e;
  switch (a.type) {
    case NpyType::kBF16: {
      uint16_t bits;
      std::memcpy(&bits, a.bytes.data() + 2 * i, 2);
      e.bits = bits;
      e.value = bf16_to_float(bf16_t{bits});
      const int64_t mag = bits & 0x7fff;
      e.ordered = (bits & 0x8000) ? -mag : mag;
      break;
    }
    case NpyType::kF32: {
      uint32_t bits;
      float f;
      std::memcpy(&bits, a.bytes.data() + 4 * i, 4);
      std::memcpy(&f, &bits, 4);
      e.bits = bits;
      e.value = f;
      const int64_t mag = bits & 0x7fffffffu;
      e.ordered = (bits & 0x80000000u) ? -mag : mag;
      break;
    }
    case NpyType::kI32: {
      int32_t x;
      std::memcpy(&x, a.bytes.data() + 4 * i, 4);
      e.bits = static_cast<uint32_t>(x);
      e.value = x;
      e.ordered = x;
      break;
    }
  }
  return e;
}

std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return idx;
}

std::string show(const Elem& e, NpyType type) {
  if (type == NpyType::kI32) {
    return fmt::format("{}", static_cast<int32_t>(e.bits));
  }
  return fmt::format("{} (0x{:0{}x})", static_cast<float>(e.value), e.bits,
                     type == NpyType::kBF16 ? 4 : 8);
}

void compare_arrays(const NpyArray& out, const NpyArray& ref, Expect expect, TensorComparison& c) {
  c.numel = out.numel();
  double diff2 = 0.0, ref2 = 0.0;
  bool nan_mismatch = false;
  Elem first_out, first_ref;
  for (int64_t i = 0; i < c.numel; ++i) {
    const Elem a = decode(out, i);
    const Elem b = decode(ref, i);
    if (a.bits != b.bits) {
      if (c.num_diff++ == 0) {
        c.first_diff = i;
        first_out = a;
        first_ref = b;
      }
      c.max_ulp_diff = std::max<int64_t>(c.max_ulp_diff, std::llabs(a.ordered - b.ordered));
      if (std::isnan(a.value) || std::isnan(b.value)) {
        nan_mismatch = true;
        c.max_abs_diff = std::numeric_limits<double>::infinity();
      } else {
        c.max_abs_diff = std::max(c.max_abs_diff, std::fabs(a.value - b.value));
      }
    }
    if (!std::isnan(a.value) && !std::isnan(b.value)) {
      diff2 += (a.value - b.value) * (a.value - b.value);
      ref2 += b.value * b.value;
    }
  }
  c.rel_l2 = nan_mismatch ? std::numeric_limits<double>::infinity()
                          : (ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2));
  if (c.num_diff == 0) {
    c.status = CompareStatus::kEqual;
    c.line = "bitwise equal";
    return;
  }
  c.first_index = unravel(c.first_diff, out.shape);
  const std::string stats = fmt::format(
      "{} of {} elements differ; max abs diff {:.6g}, max ulp diff {}, rel L2 {:.3g}; first at "
      "{} (flat {}): {} vs reference {}",
      c.num_diff, c.numel, c.max_abs_diff, c.max_ulp_diff, c.rel_l2,
      npy::shape_to_string(c.first_index), c.first_diff, show(first_out, out.type),
      show(first_ref, ref.type));
  if (expect == Expect::kClose && out.type != NpyType::kI32) {
    const double tol = out.type == NpyType::kBF16 ? kBf16RelTol : kF32RelTol;
    if (c.rel_l2 <= tol) {
      c.status = CompareStatus::kWithinTolerance;
      c.line = fmt::format("within tolerance (rel L2 {:.3g} <= {:g}): {}", c.rel_l2, tol, stats);
      return;
    }
    c.status = CompareStatus::kDiffers;
    c.line =
        fmt::format("DIFFERS beyond tolerance (rel L2 {:.3g} > {:g}): {}", c.rel_l2, tol, stats);
    return;
  }
  c.status = CompareStatus::kDiffers;
  c.line = "DIFFERS: " + stats;
}

std::vector<std::string> output_names(const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  KDA_CHECK_CODE(fs::is_directory(out_dir, ec), ErrorCode::kIo, "compare: {} is not a directory",
                 out_dir);
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(out_dir)) {
    if (e.is_regular_file() && e.path().extension() == ".npy") {
      found.push_back(e.path().stem().string());
    }
  }
  KDA_CHECK_CODE(!found.empty(), ErrorCode::kIo, "compare: {} holds no .npy file", out_dir);
  std::vector<std::string> names;
  for (const char* n : kContractTensors) {
    if (std::find(found.begin(), found.end(), n) != found.end()) {
      names.push_back(n);
    }
  }
  std::sort(found.begin(), found.end());
  for (const std::string& n : found) {
    if (!is_bitwise_contract_tensor(n)) {
      names.push_back(n);
    }
  }
  return names;
}

}  // namespace

const char* expect_name(Expect e) {
  switch (e) {
    case Expect::kBitwise:
      return "bitwise";
    case Expect::kClose:
      return "close";
  }
  return "?";
}

bool is_bitwise_contract_tensor(const std::string& name) {
  for (const char* n : kContractTensors) {
    if (name == n) {
      return true;
    }
  }
  return false;
}

const TensorComparison* CompareReport::find(const std::string& name) const {
  for (const TensorComparison& t : tensors) {
    if (t.name == name) {
      return &t;
    }
  }
  return nullptr;
}

CompareReport compare_dirs(const std::string& out_dir, const std::string& ref_dir, Expect expect) {
  namespace fs = std::filesystem;
  std::error_code ec;
  KDA_CHECK_CODE(fs::is_directory(ref_dir, ec), ErrorCode::kIo,
                 "compare: reference {} is not a directory", ref_dir);
  CompareReport report;
  for (const std::string& name : output_names(out_dir)) {
    TensorComparison c;
    c.name = name;
    c.contract = is_bitwise_contract_tensor(name);
    const std::string out_path = out_dir + "/" + name + ".npy";
    const std::string ref_path = ref_dir + "/" + name + ".npy";
    const NpyArray out = npy::read_npy(out_path);
    c.what = out.describe();
    if (!fs::exists(ref_path, ec)) {
      c.status = CompareStatus::kSkipped;
      c.line = "skipped: not in the reference dir";
      report.tensors.push_back(std::move(c));
      continue;
    }
    try {
      const NpyArray ref = npy::read_npy(ref_path);
      if (ref.type != out.type || ref.shape != out.shape) {
        c.status = CompareStatus::kMismatch;
        c.line = fmt::format("MISMATCH: reference is {} ('{}')", ref.describe(), ref.descr);
      } else {
        compare_arrays(out, ref, expect, c);
      }
    } catch (const Error& e) {
      c.status = CompareStatus::kMismatch;
      c.line = "MISMATCH: " + e.message();
    }
    c.failed =
        c.contract && (c.status == CompareStatus::kDiffers || c.status == CompareStatus::kMismatch);
    report.failures += c.failed ? 1 : 0;
    report.tensors.push_back(std::move(c));
  }
  return report;
}

void print_report(const CompareReport& report, const std::string& out_dir,
                  const std::string& ref_dir, Expect expect, std::ostream& os) {
  os << fmt::format("compare {} against reference {} (expect {}):\n", out_dir, ref_dir,
                    expect_name(expect));
  size_t name_w = 0, what_w = 0;
  for (const TensorComparison& t : report.tensors) {
    name_w = std::max(name_w, t.name.size());
    what_w = std::max(what_w, t.what.size());
  }
  int equal = 0, close = 0, differ = 0, skipped = 0;
  std::string failed;
  for (const TensorComparison& t : report.tensors) {
    os << fmt::format(
        "  {:<{}}  {:<{}}  {}{}\n", t.name, name_w, t.what, what_w, t.line,
        !t.contract && (t.status == CompareStatus::kDiffers || t.status == CompareStatus::kMismatch)
            ? " (not a bitwise-contract tensor: reported only)"
            : "");
    switch (t.status) {
      case CompareStatus::kEqual:
        ++equal;
        break;
      case CompareStatus::kWithinTolerance:
        ++close;
        break;
      case CompareStatus::kDiffers:
      case CompareStatus::kMismatch:
        ++differ;
        break;
      case CompareStatus::kSkipped:
        ++skipped;
        break;
    }
    if (t.failed) {
      failed += (failed.empty() ? "" : ", ") + t.name;
    }
  }
  os << fmt::format(
      "compare: {} tensors: {} bitwise equal, {} within tolerance, {} differ, {} skipped -> {}\n",
      report.tensors.size(), equal, close, differ, skipped,
      report.ok() ? "OK"
                  : fmt::format("FAIL ({}: {})",
                                expect == Expect::kBitwise ? "bitwise contract violated"
                                                           : "beyond contract tolerance",
                                failed));
}

}  // namespace kda::replay
