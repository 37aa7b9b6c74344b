// kda_demo: end-to-end speculative decoding through the KDA verify backend (README's main
// job: ./bazelw run //tools:kda_demo). See tools/demo/demo_args.cc or --help for the flags.
#include <iostream>

#include "tools/demo/demo_app.h"

int main(int argc, char** argv) {
  return kda::demo::run_kda_demo(argc, argv, std::cout, std::cerr);
}
