// manifest.h: the replay directory's manifest.json: the shape parameters of one captured
// verify step (one layer) and which tensors (.npy files, layouts of docs/contract.md §2) are
// present. The format is documented for users in kda_replay --help (replay_help_text()).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/params/kda_params.h"

namespace kda::replay {

/// Layout of the conv state / conv window files: the last two dims as (W-1, D) or (D, W-1).
enum class ConvLayout : uint8_t {
  kSWD,  ///< contract §2: [S, W-1, D] (windows [R, T_max, W-1, D]), D contiguous
  kSDW,  ///< SGLang's transposed view: [S, D, W-1] (windows [R, T_max, D, W-1])
};
/// "SWD" / "SDW".
const char* conv_layout_name(ConvLayout layout);
/// Parses "SWD" / "SDW"; throws naming `what` and the value otherwise.
ConvLayout parse_conv_layout(const std::string& value, const std::string& what);

/// "ring" / "snapshot".
const char* record_mode_name(RecordMode mode);
/// Parses "ring" / "snapshot"; throws naming `what` and the value otherwise.
RecordMode parse_record_mode(const std::string& value, const std::string& what);

/// The manifest's value of "format" (written by make-example; optional on input).
constexpr const char* kManifestFormat = "kda_replay/1";
constexpr const char* kManifestFile = "manifest.json";
/// Ring length when neither the manifest nor a ring file gives one (the pool default).
constexpr int kDefaultRingLength = 16;

/// The tensors a replay directory may hold, in manifest order.
struct TensorSpec {
  const char* name;   ///< key in "tensors" (and the default file name, + ".npy")
  bool required;      ///< must be present
  const char* dtype;  ///< as documented ("bf16", "f32", "i32", "f32|bf16")
  const char* shape;  ///< as documented, contract §2 letters
  const char* note;   ///< one line for --help
};
/// Every tensor, inputs first, then the optional pre-filled output buffers.
const std::vector<TensorSpec>& tensor_specs();

/// A parsed manifest. Sizes are validated (positive, HV % H == 0, T <= T_max); tensor
/// names are checked against tensor_specs() and required ones must be present.
struct Manifest {
  int B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0;
  std::optional<float> lower_bound;  ///< null/absent key is invalid; null = standard gate
  std::optional<int> L;              ///< ring length; absent: ring files, else 16
  std::optional<int> T_max;          ///< scratch step pitch; absent: scratch files, else T
  std::optional<int> R;              ///< scratch rows; absent: scratch files, else from rows
  std::optional<RecordMode> mode;    ///< default of --mode
  ConvLayout conv_state_layout = ConvLayout::kSWD;
  ConvLayout conv_window_layout = ConvLayout::kSWD;  ///< default: conv_state_layout
  std::map<std::string, std::string> tensors;        ///< name -> file (relative to the dir)
  std::string comment;                               ///< free text, carried into the summary

  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  int64_t D() const { return 2LL * H * K + static_cast<int64_t>(HV) * V; }
  int64_t N() const { return static_cast<int64_t>(B) * T; }
};

/// Parses manifest JSON text; `source` (a path) prefixes every error (kda::Error kIo for bad
/// JSON, kInvalidArgument for bad values).
Manifest parse_manifest(const std::string& json_text, const std::string& source);
/// Reads DIR/manifest.json.
Manifest read_manifest(const std::string& dir);
/// The manifest as JSON text (2-space indent), every tensor listed by file name.
std::string manifest_to_json(const Manifest& m);

}  // namespace kda::replay
