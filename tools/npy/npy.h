// npy.h: a small, strict reader/writer of numpy's .npy files (format versions 1.0, 2.0, 3.0),
// for the replay tool's captured tensors.
//
// Accepted element types (little-endian only; the data is used as stored, never swapped):
//   f32  '<f4'
//   i32  '<i4'
//   bf16 '<u2' (raw bf16 bit patterns, e.g. t.view(torch.int16).numpy().view(np.uint16)),
//        '<V2' / '|V2' (what np.save writes for an ml_dtypes.bfloat16 array) and 'bfloat16'.
// Headers must say fortran_order False and give a shape tuple; the data must be exactly
// prod(shape) elements. Anything else (bad magic, unknown version, truncated file, trailing
// bytes, big-endian or unknown descr, structured dtype, Fortran order, malformed header)
// throws kda::Error(ErrorCode::kIo) whose message starts "npy: <path>: " and says what was
// wrong. Expectation checks (expect / read_npy_as) throw kInvalidArgument the same way.
//
// The writer writes format 1.0 (2.0 if the header would not fit), C order, the header padded
// to a multiple of 64 bytes as numpy does; f32 as '<f4', i32 as '<i4', bf16 as '<u2' by
// default or as 'bfloat16' (Bf16Descr::kBfloat16: numpy itself cannot load that descr without
// a registered bfloat16 type; ml_dtypes can).
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kda::npy {

/// Element types of the files this library reads and writes.
enum class NpyType : uint8_t { kF32, kI32, kBF16 };

/// "f32", "i32", "bf16".
const char* npy_type_name(NpyType type);
/// Bytes per element (4, 4, 2).
int64_t npy_type_size(NpyType type);

/// How the writer spells bf16 in the header.
enum class Bf16Descr : uint8_t {
  kU2,        ///< '<u2': loads anywhere as uint16 bit patterns
  kBfloat16,  ///< 'bfloat16': loads as bf16 with ml_dtypes registered
};

/// A whole .npy file in memory: packed C-order little-endian elements.
struct NpyArray {
  NpyType type = NpyType::kF32;
  std::vector<int64_t> shape;  ///< () for a scalar
  std::string descr;           ///< the descr as found in the file (or as written)
  int version_major = 1;       ///< format version of the file read (1, 2 or 3)
  std::vector<uint8_t> bytes;  ///< numel() * npy_type_size(type) bytes

  int64_t numel() const;
  /// "[2, 3]" ("[]" for a scalar).
  std::string shape_str() const;
  /// "f32[2, 3]".
  std::string describe() const;
};

/// "[2, 3]"; -1 entries print as "*".
std::string shape_to_string(const std::vector<int64_t>& shape);

/// Parses the bytes of a .npy file; `name` (the path) prefixes every error message.
NpyArray parse_npy(const std::string& name, const std::string& contents);
/// Reads and parses a file; throws kIo naming `path` if it cannot be read or is malformed.
NpyArray read_npy(const std::string& path);

/// Throws kInvalidArgument ("npy: <path>: dtype is i32 ('<i4'), expected f32" /
/// "npy: <path>: shape is [2, 3], expected [2, 4] (B*T, HV*K)") unless `a` has `type` and
/// `shape` (a -1 entry accepts any extent). `dims` (optional) names the expected dims.
void expect(const NpyArray& a, const std::string& path, NpyType type,
            const std::vector<int64_t>& shape, const std::string& dims = "");
/// Throws like expect() unless `a` has `shape`; any dtype.
void expect_shape(const NpyArray& a, const std::string& path, const std::vector<int64_t>& shape,
                  const std::string& dims = "");

/// The elements of `a` as a vector of T (float, int32_t or bf16_t); throws unless T matches.
template <typename T>
std::vector<T> elements(const NpyArray& a, const std::string& path);

/// read_npy + expect + elements.
template <typename T>
std::vector<T> read_npy_as(const std::string& path, const std::vector<int64_t>& shape,
                           const std::string& dims = "");

/// The bytes of a .npy file holding `numel(shape)` elements of `type` from `data`.
std::string encode_npy(NpyType type, const std::vector<int64_t>& shape, const void* data,
                       Bf16Descr bf16 = Bf16Descr::kU2);
/// Writes encode_npy(...) to `path` (replacing it); throws kIo naming the path on failure.
void write_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
               const void* data, Bf16Descr bf16 = Bf16Descr::kU2);

/// Typed writer: `values.size()` must equal numel(shape).
template <typename T>
void write_npy(const std::string& path, const std::vector<int64_t>& shape,
               const std::vector<T>& values, Bf16Descr bf16 = Bf16Descr::kU2);

/// The NpyType of a C++ element type (float, int32_t, bf16_t).
template <typename T>
constexpr NpyType npy_type_of();
template <>
constexpr NpyType npy_type_of<float>() {
  return NpyType::kF32;
}
template <>
constexpr NpyType npy_type_of<int32_t>() {
  return NpyType::kI32;
}
template <>
constexpr NpyType npy_type_of<bf16_t>() {
  return NpyType::kBF16;
}

}  // namespace kda::npy
