// laga._C: the compiled half of the Python package (python/laga/). It holds
//   - the CLI's commands run in-process (cli: laga.plan, laga.model), the configuration they build
//     (config_json), the registry (forms), the layouts (segments) and the weight table (weights);
//   - Group: a rank's communicator (over a c10d ProcessGroup, or alone) with the memory tracker its
//     tensors are counted by;
//   - forward / backward of one block (stack_forward / stack_backward, one layer) on torch tensors,
//     which python/laga/torch.py wraps in a torch.autograd.Function.
// Not here: layouts of torch tensors (batch first, sharding), parameters, autograd: python/laga/.
//
// Tensors cross without copies: a torch tensor enters as a laga view of its memory (the torch
// tensor kept alive by the view), and a tensor laga allocated leaves as a torch tensor over the
// same memory whose deleter releases it (to the Group's tracker) when torch drops it. Every laga
// error becomes ValueError (bad usage or configuration) or RuntimeError (anything else); a rank whose
// forward or backward fails aborts its group first, so every other rank raises too.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>
#include <unistd.h>

#include <cstdio>
#include <fcntl.h>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "c10d_communicator.hpp"
#include "cli.hpp"
#include "entry.hpp"
#include "laga/comm/communicator.hpp"
#include "laga/core/error.hpp"
#include "laga/core/isa.hpp"
#include "laga/core/memory.hpp"
#include "laga/core/tensor.hpp"
#include "laga/core/work.hpp"
#include "laga/driver/launch.hpp"
#include "laga/mla/block.hpp"
#include "laga/mla/form.hpp"
#include "laga/mla/weights.hpp"
#include "parse.hpp"
#include "resources.hpp"

namespace py = pybind11;
using namespace laga;

namespace {

// The CLI's message without its "laga: " prefix.
std::string cli_message(const std::string& text) {
  std::string m = text;
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  if (m.rfind("laga: ", 0) == 0) m = m.substr(6);
  return m;
}

[[noreturn]] void raise_for(const Error& e) {
  if (e.kind() == ErrorKind::usage) throw py::value_error(e.what());
  throw std::runtime_error(e.what());
}

// The flags of `laga run ARGS...` parsed and checked as the CLI parses them.
cli::CommonFlags parse_flags(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"laga", "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<const char*> ptrs;
  for (const auto& a : argv) ptrs.push_back(a.c_str());
  cli::Invocation inv;
  std::ostringstream out, err;
  if (auto status = cli::parse_args(int(ptrs.size()), ptrs.data(), inv, out, err))
    throw py::value_error(cli_message(err.str()));
  return inv.flags;
}

// Configs by their flags: a module's forward builds one per call.
Config config_of(const std::vector<std::string>& args) {
  static std::mutex m;
  static std::map<std::vector<std::string>, std::shared_ptr<Config>> cache;
  {
    std::lock_guard lk(m);
    if (auto it = cache.find(args); it != cache.end()) return *it->second;
  }
  try {
    auto c = std::make_shared<Config>(cli::build_config(parse_flags(args)));
    std::lock_guard lk(m);
    cache.emplace(args, c);
    return *c;
  } catch (const Error& e) {
    raise_for(e);
  }
}

DType dtype_of(const at::Tensor& t, const char* name) {
  if (t.scalar_type() == at::kFloat) return DType::f32;
  if (t.scalar_type() == at::kBFloat16) return DType::bf16;
  throw py::type_error(std::string(name) + " is " + std::string(c10::toString(t.scalar_type())) +
                       "; laga runs float32 or bfloat16");
}

// A laga view of a contiguous CPU torch tensor, which the view keeps alive.
Tensor view_of(const at::Tensor& t, const std::string& tag) {
  if (!t.device().is_cpu())
    throw py::value_error(tag + " is on " + t.device().str() + "; laga runs on the CPU");
  if (!t.is_contiguous()) throw py::value_error(tag + " is not contiguous");
  Shape shape(t.sizes().begin(), t.sizes().end());
  return Tensor::external(t.data_ptr(), shape, dtype_of(t, tag.c_str()), tag,
                          std::make_shared<at::Tensor>(t));
}

// A rank's communicator and the tracker its tensors are counted by.
struct Group {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<MemoryTracker> tracker = std::make_shared<MemoryTracker>();
};

// A torch tensor over laga's memory; releasing it releases the laga tensor (to the group's tracker,
// which it keeps alive until then).
at::Tensor to_torch(const Tensor& t, const std::shared_ptr<MemoryTracker>& tracker) {
  struct Keep {
    std::shared_ptr<MemoryTracker> tracker;  // destroyed last
    std::shared_ptr<const void> storage;
  };
  auto keep = std::make_shared<Keep>(Keep{tracker, t.storage_owner()});
  std::vector<int64_t> sizes(t.shape().begin(), t.shape().end());
  const auto type = t.dtype() == DType::f32 ? at::kFloat : at::kBFloat16;
  return torch::from_blob(
      t.raw(), sizes, [keep](void*) mutable { keep.reset(); },
      torch::TensorOptions().dtype(type));
}

// What forward keeps for backward.
struct Step {
  std::vector<std::string> args;
  std::shared_ptr<Group> group;
  Weights weights;  // views of the module's parameters
  StackSaved saved;
  std::vector<double> indexer_loss;
  bool done = false;
};

Weights weights_of(const MlaConfig& c, const std::map<std::string, at::Tensor>& given) {
  Weights w;
  w.layers.resize(1);
  std::vector<std::string> expected;
  for (const auto& [name, shape] : layer_weight_shapes(c)) {
    expected.push_back(name);
    auto it = given.find(name);
    if (it == given.end()) throw py::value_error("weight " + name + " is missing");
    Tensor t = view_of(it->second, name);
    check_shape(t, shape, name.c_str());
    check_dtype(t, c.dtype, name.c_str());
    w.layers[0].by_name(name) = t;
  }
  for (const auto& [name, t] : given)
    if (std::find(expected.begin(), expected.end(), name) == expected.end())
      throw py::value_error("weight " + name + " is not one of this configuration's");
  return w;
}

template <class F>
auto on_group(Group& g, F&& f) {
  try {
    py::gil_scoped_release release;
    TrackerScope scope(*g.tracker);
    return f();
  } catch (const Error& e) {
    g.comm->abort(e.what());
    raise_for(e);
  } catch (const py::error_already_set&) {
    throw;
  } catch (const py::builtin_exception&) {
    g.comm->abort("bad input on a rank");
    throw;
  } catch (const std::exception& e) {
    g.comm->abort(e.what());
    throw std::runtime_error(e.what());
  }
}

py::tuple forward(const std::vector<std::string>& args, std::shared_ptr<Group> group,
                  const std::map<std::string, at::Tensor>& weights, const at::Tensor& x) {
  const Config c = config_of(args);
  LAGA_CHECK(c->sp == group->comm->size(), "config says --sp {} but the group has {} ranks", c->sp,
             group->comm->size());
  auto step = std::make_shared<Step>();
  step->args = args;
  step->group = group;
  step->weights = weights_of(*c, weights);
  Tensor xt = view_of(x, "x");
  Tensor y = on_group(*group, [&] {
    WorkLedger work;
    WorkScope recording(work);
    Tensor out = stack_forward(c, step->weights, xt, step->saved, *group->comm);
    if (form_of(*c).sparse())
      for (const LayerSaved& l : step->saved.layers)
        step->indexer_loss.push_back(form_of(*c).sparse_of(*l.core).indexer_loss);
    return out;
  });
  return py::make_tuple(to_torch(y, group->tracker), step);
}

py::tuple backward(std::shared_ptr<Step> step, const at::Tensor& dy, bool grad_sync) {
  if (step->done) throw py::value_error("backward ran twice on one forward");
  step->done = true;
  const Config c = config_of(step->args);
  Group& g = *step->group;
  Tensor dyt = view_of(dy, "dy");
  Weights grads;
  Tensor dx = on_group(g, [&] {
    WorkLedger work;
    WorkScope recording(work);
    grads = zero_grads(*c, "grads");
    Tensor out = stack_backward(c, step->weights, step->saved, dyt, grads, *g.comm);
    if (grad_sync)
      grads.for_each([&](const std::string&, Tensor& t) {
        g.comm->all_reduce(t.raw(), t.numel(), t.dtype(), "grad_sync");
      });
    return out;
  });
  py::dict gd;
  for (const auto& [name, shape] : layer_weight_shapes(*c))
    gd[py::str(name)] = to_torch(grads.layers[0].by_name(name), g.tracker);
  step->weights = Weights();
  return py::make_tuple(to_torch(dx, g.tracker), gd);
}

// Runs `laga ARGS...` in this process: (exit status, what it wrote to stderr). quiet: its stdout
// goes to /dev/null.
// With a group, the command's ranks are that group's (LaunchKind::host): every rank of it calls.
py::tuple run_command(const std::vector<std::string>& args, bool quiet, std::shared_ptr<Group> group) {
  std::vector<std::string> argv{"laga"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<const char*> ptrs;
  for (const auto& a : argv) ptrs.push_back(a.c_str());
  std::ostringstream out, err;
  int status;
  {
    py::gil_scoped_release release;
    std::fflush(stdout);
    int saved = -1;
    if (quiet) {
      saved = dup(1);
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      close(null);
    }
    std::optional<HostGroup> host;
    if (group) host.emplace(*group->comm);
    status = cli::run_cli(int(ptrs.size()), ptrs.data(), out, err);
    std::fflush(stdout);
    if (saved >= 0) {
      dup2(saved, 1);
      close(saved);
    }
  }
  return py::make_tuple(status, cli_message(err.str()));
}

std::string config_json(const std::vector<std::string>& args, bool validate) {
  try {
    const cli::CommonFlags f = parse_flags(args);
    if (validate) return (*cli::build_config(f)).to_json().dump();
    return cli::build_spec(f).to_json().dump();
  } catch (const Error& e) {
    raise_for(e);
  }
}

py::list forms() {
  py::list out;
  MlaConfig c = MlaConfig::preset("tiny");
  for (const Form* f : registered_forms()) {
    py::dict d;
    d["name"] = std::string(f->name());
    d["family"] = std::string(f->family());
    d["summary"] = std::string(f->summary());
    d["sparse"] = f->sparse();
    d["layout"] = std::string(token_layout_name(f->layout(as_form(c, f->name()))));
    d["output"] = f->output() == Form::Output::heads ? "heads" : "tokens";
    d["takes_ulysses"] = f->takes_ulysses();
    d["own_kernel"] = std::string(f->own_kernel());
    d["exact_at_one_rank"] = f->exact_at_one_rank();
    out.append(d);
  }
  return out;
}

// The token segments (pos0, len) that rank holds under the flags' config.
std::vector<std::pair<int64_t, int64_t>> segments(const std::vector<std::string>& args,
                                                  int64_t rank) {
  const Config c = config_of(args);
  if (rank < 0 || rank >= c->sp)
    throw py::value_error("rank " + std::to_string(rank) + " is not a rank of --sp " +
                          std::to_string(c->sp) + "; try 0 .. " + std::to_string(c->sp - 1));
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const TokenSegment& s : token_segments(*c, rank)) out.emplace_back(s.pos0, s.len);
  return out;
}

// (laga name, Hugging Face key, shape) of every weight of one layer of the flags' model.
py::list weights(const std::vector<std::string>& args) {
  try {
    const MlaConfig c = cli::build_spec(parse_flags(args));
    py::list out;
    for (const auto& [name, shape] : layer_weight_shapes(c))
      out.append(py::make_tuple(name, std::string(find_weight_spec(name)->hf_key), shape));
    return out;
  } catch (const Error& e) {
    raise_for(e);
  }
}

py::list ledger(const Group& g) {
  py::list out;
  for (const CollectiveRecord& r : g.comm->ledger().records()) {
    py::dict d;
    d["op"] = std::string(collective_name(r.op));
    d["tensor"] = r.tensor;
    d["dtype"] = std::string(dtype_name(r.dtype));
    d["tensor_bytes"] = r.tensor_bytes;
    d["wire_bytes"] = r.wire_bytes;
    d["seconds"] = r.seconds;
    d["wait_s"] = r.wait_s;
    out.append(d);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "laga's engine: the compiled half of the laga package";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(e.kind() == ErrorKind::usage ? PyExc_ValueError : PyExc_RuntimeError,
                      e.what());
    }
  });
  apply_isa_cap();
  m.def("set_binary", [](std::string path) { cli::set_self_exe(std::move(path)); });
  m.def("cli", &run_command, py::arg("args"), py::arg("quiet") = true, py::arg("group") = nullptr);
  m.def("config_json", &config_json, py::arg("args"), py::arg("validate") = true);
  m.def("forms", &forms);
  m.def("segments", &segments);
  m.def("weights", &weights);
  py::class_<Step, std::shared_ptr<Step>>(m, "Step")
      .def_readonly("indexer_loss", &Step::indexer_loss);
  py::class_<Group, std::shared_ptr<Group>>(m, "Group")
      .def_property_readonly("rank", [](const Group& g) { return g.comm->rank(); })
      .def_property_readonly("size", [](const Group& g) { return g.comm->size(); })
      .def_property_readonly("backend", [](const Group& g) { return g.comm->backend(); })
      .def("ledger", &ledger)
      .def("clear_ledger", [](Group& g) { g.comm->ledger().clear(); })
      .def("abort", [](Group& g, const std::string& reason) { g.comm->abort(reason); })
      .def("live_bytes", [](const Group& g) { return g.tracker->live_bytes(); })
      .def("peak_bytes", [](const Group& g) { return g.tracker->peak_bytes(); })
      .def("reset_peak", [](Group& g) { g.tracker->reset_peak(); });
  m.def("one_rank_group", [] {
    auto g = std::make_shared<Group>();
    g->comm = one_rank_communicator();
    return g;
  });
  m.def(
      "c10d_group",
      [](c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::intrusive_ptr<c10d::Store> store,
         const std::string& prefix, double timeout_s) {
        auto g = std::make_shared<Group>();
        try {
          g->comm = make_c10d_communicator(std::move(pg), std::move(store), prefix, timeout_s);
        } catch (const Error& e) {
          raise_for(e);
        }
        return g;
      },
      py::arg("pg"), py::arg("store"), py::arg("prefix"), py::arg("timeout_s") = 0.0);
  m.def("forward", &forward);
  m.def("backward", &backward);
}
