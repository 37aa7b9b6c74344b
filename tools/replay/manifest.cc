// manifest.cc: manifest.json parsing and writing (nlohmann::json).
#include "tools/replay/manifest.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace kda::replay {
namespace {

using Json = nlohmann::ordered_json;

// Keys the manifest may hold besides "tensors"; anything else is a typo and rejected.
constexpr const char* kSizeKeys[] = {"B", "T", "H", "HV", "K", "V"};

int get_int(const Json& j, const char* key, const std::string& source, bool required,
            int fallback) {
  if (!j.contains(key) || j.at(key).is_null()) {
    KDA_CHECK(!required, "replay manifest {}: missing \"{}\" (an integer)", source, key);
    return fallback;
  }
  const Json& v = j.at(key);
  KDA_CHECK(v.is_number_integer(), "replay manifest {}: \"{}\" is {}, expected an integer", source,
            key, v.dump());
  const int64_t x = v.get<int64_t>();
  KDA_CHECK(x >= 1 && x <= (int64_t{1} << 30),
            "replay manifest {}: \"{}\" = {} out of range [1, 2^30]", source, key, x);
  return static_cast<int>(x);
}

std::optional<int> get_optional_int(const Json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) {
    return std::nullopt;
  }
  return get_int(j, key, source, true, 0);
}

std::string get_string(const Json& j, const char* key, const std::string& source) {
  const Json& v = j.at(key);
  KDA_CHECK(v.is_string(), "replay manifest {}: \"{}\" is {}, expected a string", source, key,
            v.dump());
  return v.get<std::string>();
}

const TensorSpec* find_spec(const std::string& name) {
  for (const TensorSpec& s : tensor_specs()) {
    if (name == s.name) {
      return &s;
    }
  }
  return nullptr;
}

std::string spec_names() {
  std::string names;
  for (const TensorSpec& s : tensor_specs()) {
    names += (names.empty() ? "" : ", ") + std::string(s.name);
  }
  return names;
}

}  // namespace

const char* conv_layout_name(ConvLayout layout) {
  switch (layout) {
    case ConvLayout::kSWD:
      return "SWD";
    case ConvLayout::kSDW:
      return "SDW";
  }
  return "?";
}

ConvLayout parse_conv_layout(const std::string& value, const std::string& what) {
  if (value == "SWD") {
    return ConvLayout::kSWD;
  }
  if (value == "SDW") {
    return ConvLayout::kSDW;
  }
  KDA_FAIL("{}: \"{}\" unsupported, expected \"SWD\" ([S, W-1, D]) or \"SDW\" ([S, D, W-1])", what,
           value);
}

const char* record_mode_name(RecordMode mode) {
  switch (mode) {
    case RecordMode::kRing:
      return "ring";
    case RecordMode::kSnapshot:
      return "snapshot";
  }
  return "?";
}

RecordMode parse_record_mode(const std::string& value, const std::string& what) {
  if (value == "ring") {
    return RecordMode::kRing;
  }
  if (value == "snapshot") {
    return RecordMode::kSnapshot;
  }
  KDA_FAIL("{}: \"{}\" unsupported, expected \"ring\" or \"snapshot\"", what, value);
}

const std::vector<TensorSpec>& tensor_specs() {
  static const std::vector<TensorSpec> specs = {
      {"mixed_qkv", true, "bf16", "[N, D]",
       "channels q|k|v, row n*T+t (ragged: qsl[n]+t) = token t of request n"},
      {"a", true, "bf16", "[N, HV*K]", "gate logits"},
      {"b", true, "bf16", "[N, HV]", "beta logits"},
      {"A_log", true, "f32", "[HV]", ""},
      {"dt_bias", true, "f32", "[HV*K]", ""},
      {"conv_weight", true, "f32|bf16", "[D, W]", "tap 0 oldest ... tap 3 current; W = 4"},
      {"conv_bias", false, "as conv_weight", "[D]", "absent: no bias"},
      {"conv_state", true, "bf16", "[S, W-1, D] | [S, D, W-1]", "by \"conv_state_layout\""},
      {"ssm_state", true, "f32", "[S, HV, V, K]", "K contiguous; S = its dim 0"},
      {"slots", true, "i32", "[B]", "slot per request; -1 = padding request"},
      {"rows", false, "i32", "[B]", "scratch row per request; absent: arange(B)"},
      {"accepted", false, "i32", "[B]", "accepted lengths 1..T; present: commit runs"},
      {"query_start_loc", false, "i32", "[B+1]",
       "ragged chain (contract §8): request n's tokens are rows qsl[n]..qsl[n+1]-1, packed "
       "from 0, T_n in 1..T; mixed_qkv / a / b then have N = qsl[B] rows"},
      {"parents", false, "i32", "[B, T]",
       "tree (contract §8): node j's parent within its request, -1 for node 0 only"},
      {"accepted_paths", false, "i32", "[B, T]",
       "tree with accepted: each request's accepted root path, node 0 first"},
      {"conv_window", false, "bf16", "[R, T_max, W-1, D] | [R, T_max, D, W-1]",
       "pre-filled scratch; layout \"conv_window_layout\"; absent: zeros"},
      {"snapshots", false, "f32", "[R, T_max, HV, V, K]",
       "pre-filled snapshot scratch; absent: zeros"},
      {"ring_rawv", false, "bf16", "[S', HV, L, V]", "pre-filled ring (S' >= S); absent: zeros"},
      {"ring_rawk", false, "bf16", "[S', H, L, K]", "pre-filled ring; absent: zeros"},
      {"ring_g", false, "f32", "[S', HV, L, K]", "pre-filled ring; absent: zeros"},
      {"ring_beta", false, "f32", "[S', HV, L]", "pre-filled ring; absent: zeros"},
  };
  return specs;
}

Manifest parse_manifest(const std::string& json_text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    KDA_THROW(ErrorCode::kIo, "replay manifest {}: not valid JSON: {}", source, e.what());
  }
  KDA_CHECK(j.is_object(), "replay manifest {}: expected a JSON object, got {}", source,
            j.type_name());

  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    bool known = key == "tensors" || key == "format" || key == "comment" || key == "lower_bound" ||
                 key == "L" || key == "T_max" || key == "R" || key == "mode" ||
                 key == "conv_state_layout" || key == "conv_window_layout" ||
                 (!key.empty() && key[0] == '_');
    for (const char* k : kSizeKeys) {
      known = known || key == k;
    }
    KDA_CHECK(known,
              "replay manifest {}: unknown key \"{}\" (keys: format, comment, B, T, H, HV, K, V, "
              "lower_bound, L, T_max, R, mode, conv_state_layout, conv_window_layout, tensors; "
              "keys starting with '_' are ignored)",
              source, key);
  }
  if (j.contains("format")) {
    const std::string format = get_string(j, "format", source);
    KDA_CHECK(format == kManifestFormat,
              "replay manifest {}: \"format\" is \"{}\", expected \"{}\"", source, format,
              kManifestFormat);
  }

  Manifest m;
  m.B = get_int(j, "B", source, true, 0);
  m.T = get_int(j, "T", source, true, 0);
  m.H = get_int(j, "H", source, true, 0);
  m.HV = get_int(j, "HV", source, true, 0);
  m.K = get_int(j, "K", source, true, 0);
  m.V = get_int(j, "V", source, true, 0);
  KDA_CHECK(m.HV % m.H == 0, "replay manifest {}: HV = {} is not a multiple of H = {}", source,
            m.HV, m.H);

  // lower_bound must be stated: a missing key silently meaning "standard gate" would replay a
  // safe-gate model wrongly.
  KDA_CHECK(j.contains("lower_bound"),
            "replay manifest {}: missing \"lower_bound\" (null = standard gate, a negative number "
            "= safe gate)",
            source);
  const Json& lb = j.at("lower_bound");
  if (!lb.is_null()) {
    KDA_CHECK(lb.is_number(),
              "replay manifest {}: \"lower_bound\" is {}, expected null or a number", source,
              lb.dump());
    m.lower_bound = lb.get<float>();
  }
  m.L = get_optional_int(j, "L", source);
  m.T_max = get_optional_int(j, "T_max", source);
  m.R = get_optional_int(j, "R", source);
  if (m.T_max) {
    KDA_CHECK(*m.T_max >= m.T, "replay manifest {}: T_max = {} is smaller than T = {}", source,
              *m.T_max, m.T);
  }
  if (j.contains("mode") && !j.at("mode").is_null()) {
    m.mode = parse_record_mode(get_string(j, "mode", source),
                               fmt::format("replay manifest {}: \"mode\"", source));
  }
  if (j.contains("conv_state_layout")) {
    m.conv_state_layout =
        parse_conv_layout(get_string(j, "conv_state_layout", source),
                          fmt::format("replay manifest {}: \"conv_state_layout\"", source));
  }
  m.conv_window_layout = m.conv_state_layout;
  if (j.contains("conv_window_layout")) {
    m.conv_window_layout =
        parse_conv_layout(get_string(j, "conv_window_layout", source),
                          fmt::format("replay manifest {}: \"conv_window_layout\"", source));
  }
  if (j.contains("comment")) {
    m.comment = get_string(j, "comment", source);
  }

  KDA_CHECK(j.contains("tensors"), "replay manifest {}: missing \"tensors\"", source);
  const Json& tensors = j.at("tensors");
  auto add = [&](const std::string& name, const std::string& file) {
    KDA_CHECK(find_spec(name) != nullptr,
              "replay manifest {}: unknown tensor \"{}\" in \"tensors\" (known: {})", source, name,
              spec_names());
    KDA_CHECK(!file.empty() && file.find("..") == std::string::npos && file[0] != '/',
              "replay manifest {}: tensor \"{}\": file \"{}\" must be a relative path inside the "
              "directory",
              source, name, file);
    KDA_CHECK(m.tensors.emplace(name, file).second,
              "replay manifest {}: tensor \"{}\" listed twice", source, name);
  };
  if (tensors.is_array()) {  // ["mixed_qkv", ...]: files <name>.npy
    for (const Json& t : tensors) {
      KDA_CHECK(t.is_string(), "replay manifest {}: \"tensors\" entry {} is not a string", source,
                t.dump());
      add(t.get<std::string>(), t.get<std::string>() + ".npy");
    }
  } else if (tensors.is_object()) {  // {"mixed_qkv": "file.npy", ...}
    for (const auto& item : tensors.items()) {
      KDA_CHECK(item.value().is_string(),
                "replay manifest {}: tensor \"{}\": file is {}, expected a string", source,
                item.key(), item.value().dump());
      add(item.key(), item.value().get<std::string>());
    }
  } else {
    KDA_FAIL(
        "replay manifest {}: \"tensors\" is {}, expected an object (name -> file) or an "
        "array of names",
        source, tensors.type_name());
  }
  for (const TensorSpec& s : tensor_specs()) {
    KDA_CHECK(!s.required || m.has(s.name),
              "replay manifest {}: required tensor \"{}\" ({} {}) is not listed in \"tensors\"",
              source, s.name, s.dtype, s.shape);
  }
  return m;
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestFile;
  std::ifstream in(path);
  KDA_CHECK_CODE(static_cast<bool>(in), ErrorCode::kIo, "replay manifest {}: cannot open", path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_manifest(text.str(), path);
}

std::string manifest_to_json(const Manifest& m) {
  Json j;
  j["format"] = kManifestFormat;
  if (!m.comment.empty()) {
    j["comment"] = m.comment;
  }
  j["B"] = m.B;
  j["T"] = m.T;
  j["H"] = m.H;
  j["HV"] = m.HV;
  j["K"] = m.K;
  j["V"] = m.V;
  j["lower_bound"] = m.lower_bound ? Json(*m.lower_bound) : Json(nullptr);
  j["L"] = m.L ? Json(*m.L) : Json(nullptr);
  if (m.T_max) {
    j["T_max"] = *m.T_max;
  }
  if (m.R) {
    j["R"] = *m.R;
  }
  if (m.mode) {
    j["mode"] = record_mode_name(*m.mode);
  }
  j["conv_state_layout"] = conv_layout_name(m.conv_state_layout);
  if (m.conv_window_layout != m.conv_state_layout) {
    j["conv_window_layout"] = conv_layout_name(m.conv_window_layout);
  }
  Json tensors = Json::object();
  for (const TensorSpec& s : tensor_specs()) {  // manifest order, not map order
    const auto it = m.tensors.find(s.name);
    if (it != m.tensors.end()) {
      tensors[it->first] = it->second;
    }
  }
  j["tensors"] = tensors;
  return j.dump(2) + "\n";
}

}  // namespace kda::replay
