// The launchers of driver/launch.hpp.
#include "laga/driver/launch.hpp"

#include <cstdlib>
#include <map>
#include <memory>

#include "laga/comm/meta.hpp"
#include "laga/comm/stand_in.hpp"
#include "laga/core/error.hpp"

namespace laga {

namespace {

class ThreadsLauncher final : public Launcher {
 public:
  LaunchKind kind() const override { return LaunchKind::threads; }
  std::string backend() const override { return "threads"; }
  bool is_root() const override { return true; }
  void run(int P, const std::function<void(Communicator&)>& fn, double timeout_s) override {
    run_threads(P, fn, timeout_s);
  }
};

// One rank of every group, in this thread, on a communicator without peers.
class SoloLauncher final : public Launcher {
 public:
  SoloLauncher(LaunchKind kind, int rank) : kind_(kind), rank_(rank) {}
  LaunchKind kind() const override { return kind_; }
  std::string backend() const override {
    return fmt::format("{} for rank {}", kind_ == LaunchKind::meta ? "meta" : "stand-in", rank_);
  }
  bool is_root() const override { return true; }
  void run(int P, const std::function<void(Communicator&)>& fn, double timeout_s) override {
    LAGA_CHECK(rank_ < P, "--stand-in {} is not a rank of --sp {}; try 0 .. {}", rank_, P, P - 1);
    std::unique_ptr<Communicator> comm;
    if (kind_ == LaunchKind::meta)
      comm = std::make_unique<MetaCommunicator>(rank_, P);
    else
      comm = std::make_unique<StandInCommunicator>(rank_, P);
    comm->set_timeout(timeout_s);
    fn(*comm);
  }

 private:
  LaunchKind kind_;
  int rank_;
};

class MpiLauncher final : public Launcher {
 public:
  explicit MpiLauncher(Communicator& world) : world_(world) {}
  LaunchKind kind() const override { return LaunchKind::mpi; }
  std::string backend() const override { return "mpi"; }
  bool is_root() const override { return world_.rank() == 0; }
  // The group of the first P ranks is made once (a collective MPI_Comm_split) and reused by every
  // later run of the same size: bench and train run many groups of one P.
  void run(int P, const std::function<void(Communicator&)>& fn, double timeout_s) override {
    auto it = groups_.find(P);
    if (it == groups_.end()) it = groups_.emplace(P, first_ranks(world_, P)).first;
    if (Communicator* group = it->second.get()) {
      group->set_timeout(timeout_s);
      fn(*group);
    }
  }

 private:
  Communicator& world_;
  std::map<int, std::unique_ptr<Communicator>> groups_;  // null on the ranks outside a group
};

thread_local Communicator* host_group = nullptr;

// Every group on the host's first P ranks (the whole group when P is its size); the others wait.
class HostLauncher final : public Launcher {
 public:
  explicit HostLauncher(Communicator& group) : group_(group) {}
  LaunchKind kind() const override { return LaunchKind::host; }
  std::string backend() const override { return group_.backend(); }
  bool is_root() const override { return group_.rank() == 0; }
  void run(int P, const std::function<void(Communicator&)>& fn, double timeout_s) override {
    if (P == group_.size()) {
      group_.set_timeout(timeout_s);
      fn(group_);
      return;
    }
    auto it = groups_.find(P);
    if (it == groups_.end()) it = groups_.emplace(P, first_ranks(group_, P)).first;
    if (Communicator* group = it->second.get()) {
      group->set_timeout(timeout_s);
      fn(*group);
    }
  }

 private:
  Communicator& group_;
  std::map<int, std::unique_ptr<Communicator>> groups_;  // null on the ranks outside a group
};

}  // namespace

HostGroup::HostGroup(Communicator& group) {
  LAGA_ASSERT(!host_group, "a HostGroup already lives on this thread");
  host_group = &group;
}
HostGroup::~HostGroup() { host_group = nullptr; }

std::string_view launch_kind_name(LaunchKind k) {
  switch (k) {
    case LaunchKind::threads:
      return "threads";
    case LaunchKind::mpi:
      return "mpi";
    case LaunchKind::stand_in:
      return "stand-in";
    case LaunchKind::meta:
      return "meta";
    case LaunchKind::host:
      return "host";
  }
  return "?";
}

LaunchKind launch_kind(std::string_view comm) {
  if (comm == "auto")
    return host_group ? LaunchKind::host : under_mpi() ? LaunchKind::mpi : LaunchKind::threads;
  if (comm == "mpi") {
    LAGA_CHECK(
        under_mpi(),
        "--comm mpi needs the ranks started by mpirun, e.g. mpirun -np 4 laga run ... --sp 4; "
        "or use --comm threads");
    return LaunchKind::mpi;
  }
  if (comm == "threads") {
    const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
    LAGA_CHECK(!world || std::atoi(world) <= 1,
               "--comm threads under mpirun with {} processes would run every "
               "group {} times; use --comm mpi (or auto), or start one process",
               world ? world : "", world ? world : "");
    return LaunchKind::threads;
  }
  LAGA_FAIL_USAGE("unknown --comm '{}'; valid: auto, threads, mpi", comm);
}

bool is_root_process() {
  if (host_group) return host_group->rank() == 0;
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"})
    if (const char* v = std::getenv(var)) return std::string(v) == "0";
  return true;
}

bool launch(LaunchKind kind, const std::function<void(Launcher&)>& body, int stand_in_rank) {
  switch (kind) {
    case LaunchKind::threads: {
      ThreadsLauncher l;
      body(l);
      return true;
    }
    case LaunchKind::stand_in:
    case LaunchKind::meta: {
      SoloLauncher l(kind, stand_in_rank);
      body(l);
      return true;
    }
    case LaunchKind::host: {
      LAGA_CHECK(host_group, "no host group on this thread: use --comm threads or mpi");
      HostLauncher l(*host_group);
      body(l);
      return l.is_root();
    }
    case LaunchKind::mpi: {
      bool root = false;
      run_mpi([&](Communicator& world) {
        MpiLauncher l(world);
        body(l);
        root = l.is_root();
      });
      return root;
    }
  }
  return false;
}

}  // namespace laga
