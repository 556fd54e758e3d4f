// The laga CLI (docs/cli.md): plan, run, verify, bench, bench-comm, train, model, report. Exit
// status: 0 success, 1 a check failed, 2 bad usage or configuration, 3 an internal error. The
// command line runs through run_cli (entry.hpp), which the Python package calls too.
#include <iostream>

#include "entry.hpp"

int main(int argc, char** argv) { return laga::cli::run_cli(argc, argv, std::cout, std::cerr); }
