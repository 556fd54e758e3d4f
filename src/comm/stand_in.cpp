// StandInCommunicator (see stand_in.hpp): one rank's collectives with the absent ranks' data made up.
#include "laga/comm/stand_in.hpp"

#include <cstring>

#include "laga/core/error.hpp"

namespace laga {

StandInCommunicator::StandInCommunicator(int rank, int size) : rank_(rank), size_(size) {
  LAGA_CHECK(size >= 1 && rank >= 0 && rank < size, "stand-in rank {} of {} ranks; the rank must be in 0 .. {}", rank,
             size, size - 1);
}

void StandInCommunicator::abort(const std::string& reason) {
  throw Error(ErrorKind::failure, __FILE__, __LINE__, fmt::format("rank {} (stand-in) aborted: {}", rank_, reason));
}

void StandInCommunicator::do_all_gather(const void* in, void* out, int64_t bytes) {
  // Every absent rank's chunk is a copy of this rank's.
  char* o = static_cast<char*>(out);
  const char* mine = o + int64_t(rank_) * bytes;
  if (in != mine) std::memcpy(o + int64_t(rank_) * bytes, in, size_t(bytes));
  for (int j = 0; j < size_; ++j)
    if (j != rank_) std::memcpy(o + int64_t(j) * bytes, mine, size_t(bytes));
}

void StandInCommunicator::do_all_to_all(const void* in, void* out, int64_t bytes_per_peer) {
  // Rank j would send this rank its chunk for us; stand in with the chunk this rank sends to j.
  const char* i = static_cast<const char*>(in);
  char* o = static_cast<char*>(out);
  for (int j = 0; j < size_; ++j) std::memcpy(o + int64_t(j) * bytes_per_peer, i + int64_t(j) * bytes_per_peer, size_t(bytes_per_peer));
}

}  // namespace laga
