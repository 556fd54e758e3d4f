// Wall time of one rank's compute by operation class: matmul (every oneDNN product laga issues
// outside an attention kernel), attention forward and attention backward (every kernel call, eager,
// fused or latent), each with the FLOPs it executes. What `laga bench` reports beside each row
// (--profile prints it) and `laga model --bench-json` sets against the model's phase classes
// (docs/model.md §4): the time left over — total minus these classes minus the exposed
// communication — is the elementwise work, copies and everything else.
//
// Collection is per thread: a ProfileScope makes a profile current on its thread (a rank is one
// thread, or one process under MPI); an op timed with OpTimer adds to it. Only the outermost timed
// op counts (the eager kernel's products are attention, not matmul), and threads without a current
// profile (OpenMP workers) record nothing, so every second is counted once. Without a scope an
// OpTimer costs one thread-local read.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace laga {

enum class ProfiledOp { matmul, attention_forward, attention_backward };
inline constexpr ProfiledOp kProfiledOps[] = {ProfiledOp::matmul, ProfiledOp::attention_forward,
                                              ProfiledOp::attention_backward};
// "matmul", "attention_fwd", "attention_bwd": the model's class names (mla/flops.hpp
// op_class_name).
const char* profiled_op_name(ProfiledOp op);

struct OpTotals {
  double seconds = 0, flops = 0;
  int64_t calls = 0;
};

struct OpProfile {
  std::map<ProfiledOp, OpTotals> by_op;
  // matmul by shape, "M×N×K dtype" (batch products "b×M×N×K"): where a slow matmul class comes
  // from.
  std::map<std::string, OpTotals> matmul_shapes;
  double seconds() const;  // over every class
  void add(const OpProfile& o);
  // {"matmul": {"seconds", "flops", "calls"}, ..., "matmul_shapes": {...}}
  nlohmann::json to_json() const;
  static OpProfile from_json(const nlohmann::json& j);
};

// Makes p this thread's current profile until destroyed (the previous one then again). Nestable.
class ProfileScope {
 public:
  explicit ProfileScope(OpProfile& p);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  OpProfile* prev_;
};

// Times the enclosing op into the thread's current profile, if any and if no timed op encloses it.
class OpTimer {
 public:
  OpTimer(ProfiledOp op, double flops);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;
  bool recording() const { return target_ != nullptr; }
  // The matmul shape it is filed under too (only when recording: callers format it behind
  // recording()).
  void set_shape(std::string shape) { shape_ = std::move(shape); }

 private:
  OpProfile* target_ = nullptr;  // null: not recording (no profile, or nested)
  bool counted_ = false;         // opened with a profile current: counted in the thread's depth
  ProfiledOp op_{};
  double flops_ = 0;
  std::string shape_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace laga
