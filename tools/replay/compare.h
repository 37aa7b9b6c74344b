// compare.h: --compare: compares the .npy files of a replay output directory with reference
// files of the same names (another replay, another path or device, or the engine's own
// capture of the same step), element by element on the bit patterns.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace kda::replay {

/// What "equal" means.
enum class Expect : uint8_t {
  kBitwise,  ///< every bit (contract §3: across paths, tiles, batch compositions, engines)
  kClose,    ///< contract §3 GPU-vs-host tolerances: relative L2 <= 1e-2 for bf16 tensors,
             ///< <= 1e-5 for f32 tensors; i32 exact
};
/// "bitwise" / "close".
const char* expect_name(Expect e);

/// Contract §3 GPU-vs-host tolerances (relative L2).
constexpr double kBf16RelTol = 1e-2;
constexpr double kF32RelTol = 1e-5;

/// True for the outputs contract §3 makes bitwise across paths: output, conv_window,
/// snapshots, ring_rawv/rawk/g/beta, ssm_state and conv_state (committed).
bool is_bitwise_contract_tensor(const std::string& name);

enum class CompareStatus : uint8_t {
  kEqual,            ///< bitwise equal
  kWithinTolerance,  ///< differs, but within the kClose tolerance
  kDiffers,          ///< differs (beyond tolerance in kClose)
  kMismatch,         ///< dtype or shape differ, or the reference cannot be read
  kSkipped,          ///< no reference file of that name
};

struct TensorComparison {
  std::string name;
  CompareStatus status = CompareStatus::kSkipped;
  bool contract = false;  ///< a bitwise-contract tensor
  bool failed = false;    ///< counts toward the non-zero exit
  std::string what;       ///< "bf16[8, 4, 64]"
  int64_t numel = 0;
  int64_t num_diff = 0;              ///< elements whose bits differ
  int64_t first_diff = -1;           ///< flat index of the first one
  std::vector<int64_t> first_index;  ///< its multi-dim index
  double max_abs_diff = 0.0;         ///< inf when a NaN meets a number
  int64_t max_ulp_diff = 0;          ///< distance in representable values (i32: |a - b|)
  double rel_l2 = 0.0;               ///< ||out - ref|| / ||ref||
  std::string line;                  ///< the printed report line
};

struct CompareReport {
  std::vector<TensorComparison> tensors;
  int failures = 0;
  bool ok() const { return failures == 0; }
  const TensorComparison* find(const std::string& name) const;
};

/// Compares every OUT/<name>.npy with REF/<name>.npy (known tensors in contract order, then
/// the others by name). A failure is a bitwise-contract tensor that differs (beyond the
/// tolerance with kClose) or mismatches; other tensors are reported only. Throws kda::Error
/// if OUT holds no .npy file or an OUT file cannot be read.
CompareReport compare_dirs(const std::string& out_dir, const std::string& ref_dir, Expect expect);

/// One line per tensor and a final verdict line.
void print_report(const CompareReport& report, const std::string& out_dir,
                  const std::string& ref_dir, Expect expect, std::ostream& os);

}  // namespace kda::replay
