// How a command's ranks come to be: one launch(kind, body) per command, whose Launcher runs P-rank
// groups as often as the command needs (verify runs P = 1, 2, 4, 8; bench runs every form in turn):
//   threads   every group is P threads of this process (the default; nothing to start)
//   mpi       the processes of the mpirun job: a P-rank group is the first P ranks of the world
//             (collective over the world; the others wait), so every command works under mpirun
//   stand-in  one rank of each group alone, the others' traffic made up (comm/stand_in.hpp)
//   meta      one rank of each group on meta tensors: recorded, not computed (the planner)
//   host      the group of a process that runs the commands in-process over a communicator of its
//             own (the Python package: its torch.distributed group, HostGroup below): a P-rank
//             group is its first P ranks
// Rank 0 of every group is the root process's (world rank 0 under MPI), so what a group's rank 0
// keeps is on the root, which reports.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "laga/comm/communicator.hpp"

namespace laga {

enum class LaunchKind { threads, mpi, stand_in, meta, host };
std::string_view launch_kind_name(LaunchKind k);

class Launcher {
 public:
  virtual ~Launcher() = default;
  virtual LaunchKind kind() const = 0;
  virtual std::string backend() const = 0;  // for reports: "threads", "mpi", "stand-in for rank 2"
  virtual bool is_root() const = 0;         // this process reports
  // Runs fn on every rank of a P-rank group (those of this process) and returns when the group is
  // done. A rank that throws brings its group down; the error reaches the caller (threads) or ends
  // the job (mpi). timeout_s > 0 bounds every collective's wait.
  virtual void run(int P, const std::function<void(Communicator&)>& fn, double timeout_s = 0) = 0;
};

// While one lives, this thread's commands run on `group` (LaunchKind::host): --comm auto picks it,
// and the root is its rank 0. Not nestable.
class HostGroup {
 public:
  explicit HostGroup(Communicator& group);
  ~HostGroup();
  HostGroup(const HostGroup&) = delete;
  HostGroup& operator=(const HostGroup&) = delete;
};

// --comm auto|threads|mpi as a kind: auto is the host's group where a HostGroup lives, else mpi
// under mpirun. Usage error for mpi without mpirun,
// an unknown name, or threads under an mpirun of more than one process.
LaunchKind launch_kind(std::string_view comm);

// Whether this process will be the root, known before any launch (world rank 0 under mpirun): for
// opening output files up front.
bool is_root_process();

// Runs body once in this process with a launcher of that kind (stand_in_rank: the rank a stand-in
// or meta launcher plays). Returns whether this process is the root. Under mpi, MPI is initialised
// around body and an escaping error ends the job with its exit status (comm's run_mpi).
bool launch(LaunchKind kind, const std::function<void(Launcher&)>& body, int stand_in_rank = 0);

}  // namespace laga
