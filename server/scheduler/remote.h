// What the scheduler needs to hand runs to remote workers, without the
// worker protocol: the observer a remote executor reports to, and the
// capacity the scheduler's remote slots ask for (workers.h implements it).
#pragma once

#include <cstdint>
#include <string>

#include "server/engine/api.h"

namespace circuitlab::scheduler {

// What a remote executor needs from the observer of a run beyond the
// engine's interface: the run's id and a place to say where it trains. The
// scheduler's observers implement it.
class PlacedObserver : public engine::TrainObserver {
 public:
  virtual int64_t run_id() const = 0;
  // The step it starts from (its resume checkpoint's; 0 when fresh).
  virtual int64_t start_step() const = 0;
  // The run is now training on `device` (e.g. "w3 slurm:4711@node1 cpu").
  virtual void OnPlaced(const std::string& device) = 0;
  // Its worker was lost (`why`); the attempt then ends kPreempted.
  // `counts`: the loss is charged to the run (--max-lost-leases): its worker
  // went away while it trained, which a run that crashes workers causes; a
  // worker that went silent, or never reported on the lease, is charged
  // itself instead (WorkerBroker's quarantine), and `counts` is false.
  virtual void OnLost(const std::string& why, bool counts) = 0;
};

// Slots of remote workers, as the scheduler counts them.
class WorkerCapacity {
 public:
  virtual ~WorkerCapacity() = default;
  // Holds one free worker slot for a run the caller is about to start: a
  // GPU worker's when `gpu` (a remote GPU slot: runs that ask for CUDA).
  virtual bool TryAcquire(bool gpu) = 0;
  virtual void Release(bool gpu) = 0;
};

}  // namespace circuitlab::scheduler
