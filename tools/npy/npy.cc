// npy.cc: the .npy reader/writer (format: numpy/lib/format.py, versions 1.0-3.0).
//
// File layout: "\x93NUMPY", major, minor, header length (u16 LE for 1.0, u32 LE for 2.0/3.0),
// header (a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and '\n'), then the raw elements in C order.
#include "tools/npy/npy.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace kda::npy {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "npy: elements are used as stored (little-endian); a big-endian host would need "
              "byte swaps");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;  // numpy pads the preamble + header to this

#define KDA_NPY_FAIL(code, name, ...) \
  KDA_THROW((code), "npy: {}: {}", (name), ::fmt::format(__VA_ARGS__))

// Printable rendering of raw bytes for messages: "\x93NUMPY" or "PK\x03\x04".
std::string escape_bytes(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

// ---- header: a Python literal ----

struct PyValue {
  enum class Kind { kStr, kBool, kNone, kInt, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  std::string str;
  bool boolean = false;
  int64_t integer = 0;
  std::vector<PyValue> items;                            // tuple, list
  std::vector<std::pair<std::string, PyValue>> entries;  // dict
};

const char* kind_name(PyValue::Kind k) {
  switch (k) {
    case PyValue::Kind::kStr:
      return "a string";
    case PyValue::Kind::kBool:
      return "a bool";
    case PyValue::Kind::kNone:
      return "None";
    case PyValue::Kind::kInt:
      return "an int";
    case PyValue::Kind::kTuple:
      return "a tuple";
    case PyValue::Kind::kList:
      return "a list";
    case PyValue::Kind::kDict:
      return "a dict";
  }
  return "?";
}

// Recursive descent over the subset of Python literals numpy headers use.
class HeaderParser {
 public:
  HeaderParser(const std::string& name, const std::string& text) : name_(name), text_(text) {}

  PyValue parse_header() {
    skip_space();
    PyValue v = parse_value();
    if (v.kind != PyValue::Kind::kDict) {
      fail(fmt::format("the header is {}, expected a dict", kind_name(v.kind)));
    }
    skip_space();
    if (pos_ != text_.size()) {
      fail(fmt::format("unexpected '{}' after the header dict",
                       escape_bytes(text_.substr(pos_, 1))));
    }
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    std::string shown = text_;
    while (!shown.empty() && (shown.back() == ' ' || shown.back() == '\n')) {
      shown.pop_back();
    }
    KDA_NPY_FAIL(ErrorCode::kIo, name_, "malformed header at offset {}: {} (header: {})", pos_,
                 what, escape_bytes(shown));
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\t' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool at(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
  void expect_char(char c) {
    skip_space();
    if (!at(c)) {
      fail(fmt::format("expected '{}'", c));
    }
    ++pos_;
  }
  bool starts_with(const char* word) const { return text_.compare(pos_, strlen(word), word) == 0; }

  PyValue parse_value() {
    skip_space();
    if (pos_ >= text_.size()) {
      fail("unexpected end of header");
    }
    const char c = text_[pos_];
    if (c == '{') {
      return parse_dict();
    }
    if (c == '(' || c == '[') {
      return parse_sequence(c);
    }
    if (c == '\'' || c == '"') {
      PyValue v;
      v.kind = PyValue::Kind::kStr;
      v.str = parse_string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      return parse_int();
    }
    PyValue v;
    if (starts_with("True")) {
      pos_ += 4;
      v.kind = PyValue::Kind::kBool;
      v.boolean = true;
    } else if (starts_with("False")) {
      pos_ += 5;
      v.kind = PyValue::Kind::kBool;
    } else if (starts_with("None")) {
      pos_ += 4;
    } else {
      fail(fmt::format("unexpected '{}'", escape_bytes(std::string(1, c))));
    }
    return v;
  }

  std::string parse_string() {
    const char quote = text_[pos_++];
    std::string s;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) {
        ++pos_;
      }
      s += text_[pos_++];
    }
    if (pos_ >= text_.size()) {
      fail("unterminated string");
    }
    ++pos_;
    return s;
  }

  PyValue parse_int() {
    const size_t start = pos_;
    const bool negative = at('-');
    if (negative) {
      ++pos_;
    }
    int64_t value = 0;
    bool digits = false;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const int d = text_[pos_++] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - d) / 10) {
        pos_ = start;
        fail("integer out of range");
      }
      value = value * 10 + d;
      digits = true;
    }
    if (!digits) {
      fail("expected digits");
    }
    if (at('L')) {  // Python 2 long literal, written by very old numpy
      ++pos_;
    }
    PyValue v;
    v.kind = PyValue::Kind::kInt;
    v.integer = negative ? -value : value;
    return v;
  }

  PyValue parse_sequence(char open) {
    const char close = open == '(' ? ')' : ']';
    ++pos_;
    PyValue v;
    v.kind = open == '(' ? PyValue::Kind::kTuple : PyValue::Kind::kList;
    skip_space();
    while (!at(close)) {
      v.items.push_back(parse_value());
      skip_space();
      if (at(',')) {
        ++pos_;
        skip_space();
      } else if (!at(close)) {
        fail(fmt::format("expected ',' or '{}'", close));
      }
    }
    ++pos_;
    return v;
  }

  PyValue parse_dict() {
    ++pos_;
    PyValue v;
    v.kind = PyValue::Kind::kDict;
    skip_space();
    while (!at('}')) {
      if (!at('\'') && !at('"')) {
        fail("expected a string key");
      }
      std::string key = parse_string();
      for (const auto& e : v.entries) {
        if (e.first == key) {
          fail(fmt::format("duplicate key '{}'", key));
        }
      }
      expect_char(':');
      v.entries.emplace_back(std::move(key), parse_value());
      skip_space();
      if (at(',')) {
        ++pos_;
        skip_space();
      } else if (!at('}')) {
        fail("expected ',' or '}'");
      }
    }
    ++pos_;
    return v;
  }

  const std::string& name_;
  const std::string& text_;
  size_t pos_ = 0;
};

// A descr of a type we do not read: a hint how to save it instead.
std::string descr_hint(const std::string& d) {
  if (d == "<f8") {
    return "; save float64 as float32 (arr.astype(np.float32))";
  }
  if (d == "<i8") {
    return "; save indices as int32 (arr.astype(np.int32))";
  }
  if (d == "<i2") {
    return "; save bf16 bit patterns as uint16 (t.view(torch.int16).numpy().view(np.uint16))";
  }
  if (d == "<f2") {
    return "; that is float16, not bf16: save bf16 tensors as uint16 bit patterns";
  }
  return "";
}

NpyType parse_descr(const std::string& name, const std::string& d) {
  if (d == "<f4") {
    return NpyType::kF32;
  }
  if (d == "<i4") {
    return NpyType::kI32;
  }
  if (d == "<u2" || d == "<V2" || d == "|V2" || d == "bfloat16") {
    return NpyType::kBF16;
  }
  if (!d.empty() && d[0] == '>') {
    KDA_NPY_FAIL(ErrorCode::kIo, name,
                 "big-endian descr '{}' unsupported: little-endian only (save arr.astype('<{}'))",
                 d, d.substr(1));
  }
  KDA_NPY_FAIL(ErrorCode::kIo, name,
               "unsupported descr '{}': expected '<f4' (f32), '<i4' (i32), or '<u2', '<V2', "
               "'bfloat16' (bf16){}",
               d, descr_hint(d));
}

uint32_t read_le(const std::string& s, size_t offset, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(s[offset + static_cast<size_t>(i)]);
  }
  return v;
}

int64_t checked_numel(const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      KDA_NPY_FAIL(ErrorCode::kIo, name, "negative extent {} in shape {}", d,
                   shape_to_string(shape));
    }
    if (d != 0 && n > (int64_t{1} << 60) / d) {
      KDA_NPY_FAIL(ErrorCode::kIo, name, "shape {} is too large", shape_to_string(shape));
    }
    n *= d;
  }
  return n;
}

std::string descr_of(NpyType type, Bf16Descr bf16) {
  switch (type) {
    case NpyType::kF32:
      return "<f4";
    case NpyType::kI32:
      return "<i4";
    case NpyType::kBF16:
      return bf16 == Bf16Descr::kU2 ? "<u2" : "bfloat16";
  }
  return "?";
}

}  // namespace

const char* npy_type_name(NpyType type) {
  switch (type) {
    case NpyType::kF32:
      return "f32";
    case NpyType::kI32:
      return "i32";
    case NpyType::kBF16:
      return "bf16";
  }
  return "?";
}

int64_t npy_type_size(NpyType type) {
  switch (type) {
    case NpyType::kF32:
      return 4;
    case NpyType::kI32:
      return 4;
    case NpyType::kBF16:
      return 2;
  }
  return 0;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += i ? ", " : "";
    s += shape[i] < 0 ? std::string("*") : std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    n *= d;
  }
  return n;
}

std::string NpyArray::shape_str() const { return shape_to_string(shape); }

std::string NpyArray::describe() const { return npy_type_name(type) + shape_str(); }

NpyArray parse_npy(const std::string& name, const std::string& contents) {
  const size_t size = contents.size();
  const size_t magic_seen = size < kMagicLen ? size : kMagicLen;
  if (contents.compare(0, magic_seen, kMagic, magic_seen) != 0 || size == 0) {
    KDA_NPY_FAIL(ErrorCode::kIo, name, "bad magic: expected \\x93NUMPY, got '{}' (not a .npy file)",
                 escape_bytes(contents.substr(0, kMagicLen)));
  }
  if (size < kMagicLen + 2) {
    KDA_NPY_FAIL(ErrorCode::kIo, name, "truncated: {} bytes, shorter than the format preamble",
                 size);
  }
  NpyArray a;
  a.version_major = static_cast<unsigned char>(contents[kMagicLen]);
  const int minor = static_cast<unsigned char>(contents[kMagicLen + 1]);
  if (a.version_major < 1 || a.version_major > 3 || minor != 0) {
    KDA_NPY_FAIL(ErrorCode::kIo, name,
                 "unsupported format version {}.{} (expected 1.0, 2.0 or 3.0)", a.version_major,
                 minor);
  }
  const int len_bytes = a.version_major == 1 ? 2 : 4;
  const size_t header_start = kMagicLen + 2 + static_cast<size_t>(len_bytes);
  if (size < header_start) {
    KDA_NPY_FAIL(ErrorCode::kIo, name, "truncated: {} bytes, shorter than the {}-byte preamble",
                 size, header_start);
  }
  const size_t header_len = read_le(contents, kMagicLen + 2, len_bytes);
  if (size - header_start < header_len) {
    KDA_NPY_FAIL(ErrorCode::kIo, name,
                 "truncated: the header needs {} bytes, the file has {} after "
                 "the preamble",
                 header_len, size - header_start);
  }
  const std::string header = contents.substr(header_start, header_len);
  const PyValue dict = HeaderParser(name, header).parse_header();

  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (const auto& [key, value] : dict.entries) {
    if (key == "descr") {
      descr = &value;
    } else if (key == "fortran_order") {
      fortran = &value;
    } else if (key == "shape") {
      shape = &value;
    } else {
      KDA_NPY_FAIL(ErrorCode::kIo, name, "header has an unexpected key '{}'", key);
    }
  }
  for (const auto& [value, key] : {std::pair{descr, "descr"}, std::pair{fortran, "fortran_order"},
                                   std::pair{shape, "shape"}}) {
    if (value == nullptr) {
      KDA_NPY_FAIL(ErrorCode::kIo, name, "header has no '{}' key", key);
    }
  }
  if (descr->kind == PyValue::Kind::kList) {
    KDA_NPY_FAIL(ErrorCode::kIo, name, "structured dtype (descr is a list) unsupported");
  }
  if (descr->kind != PyValue::Kind::kStr) {
    KDA_NPY_FAIL(ErrorCode::kIo, name, "'descr' is {}, expected a string", kind_name(descr->kind));
  }
  a.descr = descr->str;
  a.type = parse_descr(name, a.descr);
  if (fortran->kind != PyValue::Kind::kBool) {
    KDA_NPY_FAIL(ErrorCode::kIo, name, "'fortran_order' is {}, expected True or False",
                 kind_name(fortran->kind));
  }
  if (fortran->boolean) {
    KDA_NPY_FAIL(
        ErrorCode::kIo, name,
        "fortran_order is True: only C order is supported (save np.ascontiguousarray(arr))");
  }
  if (shape->kind != PyValue::Kind::kTuple) {
    KDA_NPY_FAIL(ErrorCode::kIo, name, "'shape' is {}, expected a tuple of ints",
                 kind_name(shape->kind));
  }
  for (const PyValue& d : shape->items) {
    if (d.kind != PyValue::Kind::kInt) {
      KDA_NPY_FAIL(ErrorCode::kIo, name, "'shape' holds {}, expected ints", kind_name(d.kind));
    }
    a.shape.push_back(d.integer);
  }
  const int64_t numel = checked_numel(name, a.shape);
  const uint64_t want = static_cast<uint64_t>(numel * npy_type_size(a.type));
  const uint64_t have = size - header_start - header_len;
  if (have < want) {
    KDA_NPY_FAIL(ErrorCode::kIo, name,
                 "truncated: shape {} of {} needs {} data bytes, the file has {} after the header",
                 a.shape_str(), npy_type_name(a.type), want, have);
  }
  if (have > want) {
    KDA_NPY_FAIL(ErrorCode::kIo, name,
                 "{} trailing bytes: shape {} of {} needs {} data bytes, the file has {} after the "
                 "header",
                 have - want, a.shape_str(), npy_type_name(a.type), want, have);
  }
  const auto* data = reinterpret_cast<const uint8_t*>(contents.data()) + header_start + header_len;
  a.bytes.assign(data, data + want);
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    KDA_NPY_FAIL(ErrorCode::kIo, path, "cannot open: {}", std::strerror(errno));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    KDA_NPY_FAIL(ErrorCode::kIo, path, "read error: {}", std::strerror(errno));
  }
  return parse_npy(path, buffer.str());
}

void expect_shape(const NpyArray& a, const std::string& path, const std::vector<int64_t>& shape,
                  const std::string& dims) {
  bool ok = a.shape.size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    ok = shape[i] < 0 || shape[i] == a.shape[i];
  }
  if (!ok) {
    KDA_NPY_FAIL(ErrorCode::kInvalidArgument, path, "shape is {}, expected {}{}", a.shape_str(),
                 shape_to_string(shape), dims.empty() ? "" : " (" + dims + ")");
  }
}

void expect(const NpyArray& a, const std::string& path, NpyType type,
            const std::vector<int64_t>& shape, const std::string& dims) {
  if (a.type != type) {
    KDA_NPY_FAIL(ErrorCode::kInvalidArgument, path, "dtype is {} ('{}'), expected {}",
                 npy_type_name(a.type), a.descr, npy_type_name(type));
  }
  expect_shape(a, path, shape, dims);
}

template <typename T>
std::vector<T> elements(const NpyArray& a, const std::string& path) {
  constexpr NpyType want = npy_type_of<T>();
  if (a.type != want) {
    KDA_NPY_FAIL(ErrorCode::kInvalidArgument, path, "dtype is {} ('{}'), expected {}",
                 npy_type_name(a.type), a.descr, npy_type_name(want));
  }
  std::vector<T> out(static_cast<size_t>(a.numel()));
  if (!out.empty()) {
    std::memcpy(out.data(), a.bytes.data(), a.bytes.size());
  }
  return out;
}

template <typename T>
std::vector<T> read_npy_as(const std::string& path, const std::vector<int64_t>& shape,
                           const std::string& dims) {
  const NpyArray a = read_npy(path);
  expect(a, path, npy_type_of<T>(), shape, dims);
  return elements<T>(a, path);
}

std::string encode_npy(NpyType type, const std::vector<int64_t>& shape, const void* data,
                       Bf16Descr bf16) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    KDA_CHECK(shape[i] >= 0, "npy: encode_npy: negative extent in shape {}",
              shape_to_string(shape));
    dims += (i ? ", " : "") + std::to_string(shape[i]);
  }
  if (shape.size() == 1) {
    dims += ",";  // a 1-tuple
  }
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   descr_of(type, bf16), dims);
  // Version 1.0 unless the header length would not fit in its u16.
  const int major = header.size() + kAlign + 12 > 0xffff ? 2 : 1;
  const size_t preamble = kMagicLen + 2 + (major == 1 ? 2 : 4);
  const size_t total = (preamble + header.size() + 1 + kAlign - 1) / kAlign * kAlign;
  header.append(total - preamble - header.size() - 1, ' ');
  header += '\n';

  int64_t numel = 1;
  for (int64_t d : shape) {
    numel *= d;
  }
  const size_t data_bytes = static_cast<size_t>(numel * npy_type_size(type));
  std::string out;
  out.reserve(total + data_bytes);
  out.append(kMagic, kMagicLen);
  out += static_cast<char>(major);
  out += '\0';
  const uint32_t len = static_cast<uint32_t>(header.size());
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) {
    out += static_cast<char>((len >> (8 * i)) & 0xff);
  }
  out += header;
  if (data_bytes > 0) {
    out.append(static_cast<const char*>(data), data_bytes);
  }
  return out;
}

void write_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
               const void* data, Bf16Descr bf16) {
  const std::string bytes = encode_npy(type, shape, data, bf16);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    KDA_NPY_FAIL(ErrorCode::kIo, path, "cannot create: {}", std::strerror(errno));
  }
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    KDA_NPY_FAIL(ErrorCode::kIo, path, "write error: {}", std::strerror(errno));
  }
}

template <typename T>
void write_npy(const std::string& path, const std::vector<int64_t>& shape,
               const std::vector<T>& values, Bf16Descr bf16) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    numel *= d;
  }
  KDA_CHECK(numel == static_cast<int64_t>(values.size()),
            "npy: {}: shape {} holds {} elements, {} given", path, shape_to_string(shape), numel,
            values.size());
  write_npy(path, npy_type_of<T>(), shape, values.data(), bf16);
}

#define KDA_NPY_INSTANTIATE(T)                                                            \
  template std::vector<T> elements<T>(const NpyArray&, const std::string&);               \
  template std::vector<T> read_npy_as<T>(const std::string&, const std::vector<int64_t>&, \
                                         const std::string&);                             \
  template void write_npy<T>(const std::string&, const std::vector<int64_t>&,             \
                             const std::vector<T>&, Bf16Descr);

KDA_NPY_INSTANTIATE(float)
KDA_NPY_INSTANTIATE(int32_t)
KDA_NPY_INSTANTIATE(bf16_t)

#undef KDA_NPY_INSTANTIATE

}  // namespace kda::npy
