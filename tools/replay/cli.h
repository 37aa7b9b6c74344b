// cli.h: the kda_replay command line (tools/kda_replay.cc is main() around run_cli).
//
//   kda_replay --in DIR --out DIR [--device cuda|host] [--path auto|fused|unfused]
//              [--mode ring|snapshot] [--block-v N] [--compare REF [--expect bitwise|close]]
//   kda_replay --out DIR --compare REF          (compare existing outputs only)
//   kda_replay --make-example DIR [--B 2 --T 4 ...]
//   kda_replay --help
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kda::replay {

/// Exit codes of run_cli.
constexpr int kExitOk = 0;
constexpr int kExitCompareFailed = 1;  ///< a bitwise-contract tensor differs
constexpr int kExitError = 2;          ///< bad usage, bad input files, kernel / CUDA error

/// The --help text (usage, options, the manifest format with an example).
std::string replay_help_text();

/// Runs the tool on `args` (without the program name); reports to `out`, errors to `err`.
/// Never throws: errors are printed and give kExitError.
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kda::replay
