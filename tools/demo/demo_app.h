// demo_app.h: kda_demo as a function, so tests can run it in-process.
#pragma once

#include <ostream>

namespace kda::demo {

/// Exit codes of kda_demo.
constexpr int kExitPass = 0;   ///< every check passed (or --check off / --help)
constexpr int kExitFail = 1;   ///< a check failed, or a runtime error (message on `err`)
constexpr int kExitUsage = 2;  ///< bad command line (message on `err`)

/// Runs the demo with a main()-style argv: summary on `out`, progress and errors on `err`.
int run_kda_demo(int argc, char** argv, std::ostream& out, std::ostream& err);

}  // namespace kda::demo
