// kda_replay: replays one captured KDA verify step (manifest.json + .npy files) through the
// host reference or the CUDA kernels, writes every output as .npy, and compares output
// directories bit for bit. See `kda_replay --help` (tools/replay/cli.cc).
#include <iostream>
#include <string>
#include <vector>

#include "tools/replay/cli.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return kda::replay::run_cli(args, std::cout, std::cerr);
}
