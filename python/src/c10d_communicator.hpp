// A Communicator over a PyTorch c10d ProcessGroup (torch 1.13, gloo): the caller's process group
// (torch.distributed's, TransformerEngine's `cp_group`) carries laga's collectives, so laga runs
// inside a torch.distributed job with no MPI. Raw byte movement only, like the threads and MPI
// backends (laga/comm/communicator.hpp): the reductions are the base class's, summed in fixed rank
// order, so results are bitwise those of the other backends. Not here: Python (the extension's
// bindings are in module.cpp), and any device (GPU) transport: tensors are CPU bytes.
//
// Lanes and groups. Lane 0 is `pg` itself (its rank and size are the communicator's). c10d matches
// a group's collectives by issue order, and the second phases of all_reduce are issued in an order
// of their own (lane 1), so lane 1 is a ProcessGroupGloo this backend makes over
// PrefixStore(prefix + "/lane1", store) with the same ranks; split() and first_ranks() make their
// groups the same way under prefix + "/split<k>/color<c>" and prefix + "/first<k>" (k counts the
// calls). New groups use pg's gloo devices and timeout when pg is a ProcessGroupGloo, else gloo's
// default device and c10d's default timeout. At P = 1 nothing is made and every operation is a
// local copy.
//
// Failure. abort() writes prefix + "/abort" (this rank of the outermost group and the reason; the
// first abort wins) into `store`; every rank of the family (the communicator, its splits, its
// first_ranks group) polls that key about every 10 ms while it waits, and its pending and later
// collectives throw laga::Error naming the aborting rank and its reason. A timeout aborts the same
// way, naming the collective and this rank. The waits poll Work::isCompleted and never block inside
// gloo, so no rank hangs on a peer that aborted.
//
// Limits. A gloo operation cannot be cancelled: after an abort or a timeout, an operation that was
// in flight on this rank keeps gloo's worker thread (and its hold on the caller's buffers, read and
// written without copies) until gloo ends it — when a peer's connection closes or gloo's own
// timeout passes — and destroying a group waits for that. As under MPI, a group that failed is for
// ending the job, not for reuse: the buffers of a collective abandoned in flight must outlive the
// groups. `prefix` must be new in `store` for each communicator made over it (a reused one is a
// usage error), and every rank passes the same.
#pragma once

#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "laga/comm/communicator.hpp"

namespace laga {

// The communicator of `pg`'s group: rank pg->getRank() of pg->getSize(), backend "c10d". Collective
// over pg (a barrier, then the lane-1 group's rendezvous in `store`). timeout_s > 0 bounds every
// wait inside a collective (0: forever, still ended by an abort). Usage error for null pg or store,
// a negative timeout, or a prefix already used in `store`.
std::unique_ptr<Communicator> make_c10d_communicator(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                                     c10::intrusive_ptr<c10d::Store> store,
                                                     const std::string& prefix, double timeout_s);

}  // namespace laga
