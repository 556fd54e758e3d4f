// The communicators without peers (no_peers.hpp): NoPeersCommunicator's immediate completion, and
// what StandInCommunicator (stand_in.hpp) and MetaCommunicator (meta.hpp) put in the absent ranks'
// chunks — made-up copies of this rank's data, and nothing.
#include <cstdlib>
#include <cstring>
#include <memory>

#include "laga/comm/meta.hpp"
#include "laga/comm/stand_in.hpp"
#include "laga/core/error.hpp"

namespace laga {

NoPeersCommunicator::NoPeersCommunicator(int rank, int size) : rank_(rank), size_(size) {
  LAGA_CHECK(size >= 1 && rank >= 0 && rank < size,
             "rank {} of {} ranks (no peers); the rank must be in 0 .. {}", rank, size, size - 1);
}

void NoPeersCommunicator::abort(const std::string& reason) {
  throw Error(ErrorKind::failure, __FILE__, __LINE__,
              fmt::format("rank {} ({}) aborted: {}", rank_, backend(), reason));
}

std::unique_ptr<Communicator::RawRequest> NoPeersCommunicator::start_raw(const RawOp& op) {
  if (op.bytes > 0) fill(op);
  return nullptr;  // complete
}

void NoPeersCommunicator::timed_out(RawRequest& r) {
  LAGA_ASSERT(false, "rank {} ({}): {} timed out, but it has no peers to wait for", rank_,
              backend(), r.what);
  std::abort();  // unreachable
}

std::unique_ptr<Communicator> NoPeersCommunicator::first_ranks_of(int P) {
  if (rank_ >= P) return nullptr;
  auto c = make(rank_, P);
  c->set_timeout(timeout_s_);
  return c;
}

// The sub-group's other ranks are as absent as the parent's: a communicator of the same kind.
std::unique_ptr<Communicator> NoPeersCommunicator::split_of(int, int, int sub_rank, int sub_size) {
  return make(sub_rank, sub_size);
}

void StandInCommunicator::fill(const RawOp& op) {
  const int P = size(), me = rank();
  const int64_t b = op.bytes;
  char* o = static_cast<char*>(op.recv);
  switch (op.kind) {
    case RawKind::all_gather: {
      // Every absent rank's chunk is a copy of this rank's.
      const char* mine = o + int64_t(me) * b;
      if (op.send != mine) std::memcpy(o + int64_t(me) * b, op.send, size_t(b));
      for (int j = 0; j < P; ++j)
        if (j != me) std::memcpy(o + int64_t(j) * b, mine, size_t(b));
      break;
    }
    case RawKind::all_to_all: {
      // Rank j would send this rank its chunk for us; stand in with the chunk this rank sends to j.
      const char* i = static_cast<const char*>(op.send);
      for (int j = 0; j < P; ++j) std::memcpy(o + int64_t(j) * b, i + int64_t(j) * b, size_t(b));
      break;
    }
    case RawKind::send_recv:  // the rank before this one "sends" what this rank sends
      std::memcpy(o, op.send, size_t(b));
      break;
    case RawKind::broadcast:  // the root's bytes stand in as this rank's own
    case RawKind::barrier:
      break;
  }
}

std::unique_ptr<Communicator> StandInCommunicator::make(int rank, int P) const {
  return std::make_unique<StandInCommunicator>(rank, P);
}

std::unique_ptr<Communicator> MetaCommunicator::make(int rank, int P) const {
  return std::make_unique<MetaCommunicator>(rank, P);
}

}  // namespace laga
