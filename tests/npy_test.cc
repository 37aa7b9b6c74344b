// npy_test.cc: the .npy reader/writer (tools/npy): round trips of every dtype, files as
// numpy writes them (v1.0, v2.0, v3.0; '<V2' / 'bfloat16' bf16), and every error case with
// its message (file name + what was wrong).
#include "tools/npy/npy.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace kda::npy {
namespace {

using Catch::Matchers::Contains;

std::string temp_dir() {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir =
      std::filesystem::path(base != nullptr ? base : std::filesystem::temp_directory_path()) /
      ("npy_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A .npy file with a hand-written header (as numpy writes it), version major.0.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  std::string header = dict;
  const size_t preamble = major == 1 ? 10 : 12;
  while ((preamble + header.size() + 1) % 64 != 0) {
    header += ' ';
  }
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const uint32_t len = static_cast<uint32_t>(header.size());
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) {
    out += static_cast<char>((len >> (8 * i)) & 0xff);
  }
  return out + header + data;
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// The message of the kda::Error `f` throws (fails the test if it does not throw one).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  FAIL("no kda::Error thrown");
  return "";
}

template <typename F>
ErrorCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  FAIL("no kda::Error thrown");
  return ErrorCode::kInternal;
}

TEST_CASE("npy: round trip of every dtype", "[tools][npy]") {
  const std::string dir = temp_dir();
  SECTION("f32 [2, 3]") {
    const std::vector<float> v = {1.5f, -2.0f, 0.0f, -0.0f, 1e-30f, 3.25f};
    write_npy(dir + "/f.npy", {2, 3}, v);
    const NpyArray a = read_npy(dir + "/f.npy");
    CHECK(a.type == NpyType::kF32);
    CHECK(a.descr == "<f4");
    CHECK(a.shape == std::vector<int64_t>{2, 3});
    CHECK(a.version_major == 1);
    REQUIRE(a.bytes.size() == 24);
    CHECK(std::memcmp(a.bytes.data(), v.data(), 24) == 0);  // bitwise, -0.0 included
    CHECK(read_npy_as<float>(dir + "/f.npy", {2, 3}) == v);
  }
  SECTION("i32 [4]") {
    const std::vector<int32_t> v = {0, -1, 2147483647, -2147483647 - 1};
    write_npy(dir + "/i.npy", {4}, v);
    CHECK(read_npy(dir + "/i.npy").descr == "<i4");
    CHECK(read_npy_as<int32_t>(dir + "/i.npy", {4}) == v);
  }
  SECTION("bf16 as '<u2' and as 'bfloat16'") {
    const std::vector<bf16_t> v = {float_to_bf16(1.0f), float_to_bf16(-3.5f), bf16_t{0x7fc1},
                                   bf16_t{0x8000},      bf16_t{0x0001},       bf16_t{0xffff}};
    const Bf16Descr style = GENERATE(Bf16Descr::kU2, Bf16Descr::kBfloat16);
    write_npy(dir + "/h.npy", {1, 2, 3}, v, style);
    const NpyArray a = read_npy(dir + "/h.npy");
    CHECK(a.type == NpyType::kBF16);
    CHECK(a.descr == (style == Bf16Descr::kU2 ? "<u2" : "bfloat16"));
    const std::vector<bf16_t> back = read_npy_as<bf16_t>(dir + "/h.npy", {1, 2, 3});
    REQUIRE(back.size() == v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      CHECK(back[i].bits == v[i].bits);
    }
  }
  SECTION("scalar, empty and 5-d shapes") {
    write_npy(dir + "/s.npy", {}, std::vector<float>{7.0f});
    CHECK(read_npy(dir + "/s.npy").shape.empty());
    CHECK(read_npy_as<float>(dir + "/s.npy", {}) == std::vector<float>{7.0f});
    write_npy(dir + "/e.npy", {0, 3}, std::vector<int32_t>{});
    CHECK(read_npy(dir + "/e.npy").shape == std::vector<int64_t>{0, 3});
    std::vector<float> big(2 * 1 * 3 * 2 * 2);
    for (size_t i = 0; i < big.size(); ++i) {
      big[i] = static_cast<float>(i);
    }
    write_npy(dir + "/5.npy", {2, 1, 3, 2, 2}, big);
    CHECK(read_npy_as<float>(dir + "/5.npy", {2, 1, 3, 2, 2}) == big);
  }
}

TEST_CASE("npy: the writer writes format 1.0 with a 64-byte aligned header", "[tools][npy]") {
  const std::vector<float> v = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  const std::string bytes = encode_npy(NpyType::kF32, {2, 3}, v.data());
  REQUIRE(bytes.size() == 128 + 24);
  CHECK(bytes.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)) == 0);
  const size_t header_len = static_cast<unsigned char>(bytes[8]) |
                            (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  CHECK(header_len == 118);
  CHECK(bytes.compare(10, 59, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }") == 0);
  CHECK(bytes[127] == '\n');
  CHECK(encode_npy(NpyType::kI32, {5}, std::vector<int32_t>(5).data()).find("(5,)") !=
        std::string::npos);
}

TEST_CASE("npy: reads files as numpy and ml_dtypes write them", "[tools][npy]") {
  const std::vector<uint16_t> bits = {0x3f80, 0xc060, 0x0000};
  SECTION("v1.0 '<V2' (np.save of an ml_dtypes.bfloat16 array)") {
    const NpyArray a = parse_npy(
        "x.npy", npy_bytes("{'descr': '<V2', 'fortran_order': False, 'shape': (3,), }", raw(bits)));
    CHECK(a.type == NpyType::kBF16);
    CHECK(elements<bf16_t>(a, "x.npy")[1].bits == 0xc060);
  }
  SECTION("'|V2' and 'bfloat16', key order free, double quotes") {
    CHECK(parse_npy("x.npy", npy_bytes("{'descr': '|V2', 'fortran_order': False, 'shape': (3,), }",
                                       raw(bits)))
              .type == NpyType::kBF16);
    const NpyArray a = parse_npy(
        "x.npy", npy_bytes("{\"shape\": (1, 3), \"fortran_order\": False, \"descr\": \"bfloat16\"}",
                           raw(bits)));
    CHECK(a.type == NpyType::kBF16);
    CHECK(a.shape == std::vector<int64_t>{1, 3});
  }
  SECTION("v2.0 and v3.0 headers") {
    const int major = GENERATE(2, 3);
    const NpyArray a =
        parse_npy("x.npy", npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
                                     raw(std::vector<int32_t>{5, -6}), major));
    CHECK(a.version_major == major);
    CHECK(elements<int32_t>(a, "x.npy") == std::vector<int32_t>{5, -6});
  }
  SECTION("1-d fortran-order False and Python 2 long literals") {
    const NpyArray a =
        parse_npy("x.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2L,), }",
                                     raw(std::vector<float>{1.0f, 2.0f})));
    CHECK(a.shape == std::vector<int64_t>{2});
  }
}

TEST_CASE("npy: every malformed file throws kIo naming the file and the problem", "[tools][npy]") {
  const std::string dir = temp_dir();
  const std::string good = encode_npy(NpyType::kF32, {2, 3}, std::vector<float>(6, 1.0f).data());
  const std::string f32_23 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string data24 = raw(std::vector<float>(6, 1.0f));
  auto read_bytes = [&](const std::string& bytes) {
    write_file(dir + "/bad.npy", bytes);
    return [path = dir + "/bad.npy"] { read_npy(path); };
  };
  const std::string where = "npy: " + dir + "/bad.npy: ";

  SECTION("truncated data") {
    const auto f = read_bytes(good.substr(0, good.size() - 5));
    CHECK(code_of(f) == ErrorCode::kIo);
    CHECK(error_of(f) == where +
                             "truncated: shape [2, 3] of f32 needs 24 data bytes, the file has 19 "
                             "after the header");
  }
  SECTION("truncated header") {
    CHECK(error_of(read_bytes(good.substr(0, 40))) ==
          where + "truncated: the header needs 118 bytes, the file has 30 after the preamble");
  }
  SECTION("truncated preamble") {
    CHECK_THAT(error_of(read_bytes(good.substr(0, 7))), Contains(where + "truncated: 7 bytes"));
  }
  SECTION("trailing bytes") {
    CHECK_THAT(error_of(read_bytes(good + "xx")), Contains(where + "2 trailing bytes"));
  }
  SECTION("bad magic") {
    std::string zip = good;
    zip.replace(0, 4, "PK\x03\x04");
    CHECK(error_of(read_bytes(zip)) ==
          where + "bad magic: expected \\x93NUMPY, got 'PK\\x03\\x04PY' (not a .npy file)");
    CHECK_THAT(error_of(read_bytes("")), Contains(where + "bad magic"));
  }
  SECTION("unsupported version") {
    std::string v4 = good;
    v4[6] = 4;
    CHECK(error_of(read_bytes(v4)) ==
          where + "unsupported format version 4.0 (expected 1.0, 2.0 or 3.0)");
  }
  SECTION("big-endian descr") {
    const auto f = read_bytes(
        npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", data24));
    CHECK(code_of(f) == ErrorCode::kIo);
    CHECK(error_of(f) == where +
                             "big-endian descr '>f4' unsupported: little-endian only (save "
                             "arr.astype('<f4'))");
  }
  SECTION("fortran order") {
    CHECK(error_of(read_bytes(
              npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data24))) ==
          where +
              "fortran_order is True: only C order is supported (save "
              "np.ascontiguousarray(arr))");
  }
  SECTION("unsupported descr, with a hint") {
    CHECK_THAT(error_of(read_bytes(
                   npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", data24))),
               Contains(where + "unsupported descr '<i8'") && Contains("arr.astype(np.int32)"));
    CHECK_THAT(error_of(read_bytes(npy_bytes(
                   "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", data24))),
               Contains(where + "structured dtype"));
  }
  SECTION("malformed headers") {
    CHECK_THAT(error_of(read_bytes(npy_bytes("{'descr': '<f4', 'shape': (2, 3), }", data24))),
               Contains(where + "header has no 'fortran_order' key"));
    CHECK_THAT(error_of(read_bytes(npy_bytes(
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", data24))),
               Contains(where + "header has an unexpected key 'x'"));
    CHECK_THAT(error_of(read_bytes(
                   npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}", data24))),
               Contains(where + "'shape' is a list, expected a tuple of ints"));
    CHECK_THAT(error_of(read_bytes(
                   npy_bytes("{'descr': '<f4', 'fortran_order': False 'shape': (2, 3)}", data24))),
               Contains(where + "malformed header at offset 40: expected ',' or '}'"));
  }
  SECTION("missing file") {
    CHECK(error_of([&] { read_npy(dir + "/nope.npy"); }) ==
          "npy: " + dir + "/nope.npy: cannot open: No such file or directory");
  }
}

TEST_CASE("npy: expectation mismatches throw kInvalidArgument naming the file", "[tools][npy]") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/x.npy";
  write_npy(path, {2, 3}, std::vector<int32_t>(6, 1));
  SECTION("wrong dtype") {
    const auto f = [&] { read_npy_as<float>(path, {2, 3}); };
    CHECK(code_of(f) == ErrorCode::kInvalidArgument);
    CHECK(error_of(f) == "npy: " + path + ": dtype is i32 ('<i4'), expected f32");
  }
  SECTION("wrong shape, with the dims named") {
    CHECK(error_of([&] {
            read_npy_as<int32_t>(path, {2, 4}, "B*T, HV*K");
          }) == "npy: " + path + ": shape is [2, 3], expected [2, 4] (B*T, HV*K)");
    CHECK(error_of([&] { read_npy_as<int32_t>(path, {6}); }) ==
          "npy: " + path + ": shape is [2, 3], expected [6]");
  }
  SECTION("-1 accepts any extent") {
    const NpyArray a = read_npy(path);
    CHECK_NOTHROW(expect(a, path, NpyType::kI32, {-1, 3}));
    CHECK(error_of([&] {
            expect(a, path, NpyType::kI32, {-1, 4});
          }) == "npy: " + path + ": shape is [2, 3], expected [*, 4]");
  }
  SECTION("writer: element count must match the shape") {
    CHECK_THAT(error_of([&] {
                 write_npy(dir + "/y.npy", {2, 2}, std::vector<float>(3));
               }),
               Contains("shape [2, 2] holds 4 elements, 3 given"));
  }
}

}  // namespace
}  // namespace kda::npy
