// The CLI as a function: parse, check and run one command line, as the binary's main does and as
// the Python package's laga.plan / laga.model do in-process. Exit status as the binary's: 0 success,
// 1 a check failed, 2 bad usage or configuration, 3 an internal error; the message of a failure
// goes to `err` ("laga: ..."), a command's own output to stdout.
#pragma once

#include <ostream>

namespace laga::cli {

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace laga::cli
