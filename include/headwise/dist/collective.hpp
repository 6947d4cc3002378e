#pragma once
// Data-parallel calibration: each rank measures its shard of the calibration sequences, and
// the ranks combine what they measured at every point where a single process would sum over
// sequences. The combination must not depend on the number of ranks, so a distributed run
// gives the same policy bytes as a single process:
// - sums are exact until the final rounding (core/exact_sum.hpp) and merge in any order;
// - per-answer records are gathered and put back in the single process's order.
// So the only primitive needed is an all-gather of small byte strings, in rank order. The
// payloads are KBs per global layer (docs/distributed.md), which is why they travel through
// c10d's TCPStore instead of a Gloo/NCCL ring: a ring all-reduce of doubles sums in an order
// that depends on the world size, and could not give byte-identical policies.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "headwise/core/exact_sum.hpp"

namespace headwise::dist {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;
  // Every rank's `local`, in rank order. Every rank makes the same calls in the same order;
  // `what` names the exchange in errors ("layer 3: block-mse sums"), and ranks that disagree
  // on it fail naming both.
  virtual std::vector<std::string> all_gather(const std::string& local,
                                              const std::string& what) = 0;
  virtual int64_t bytes_sent() const = 0;
  // Tells the other ranks this one failed, so they stop waiting and exit naming it.
  virtual void abort(const std::string& message) noexcept = 0;
  // A successful end: returns once every rank has finished (rank 0 hosts the store and must
  // outlive the others' last reads).
  virtual void finish() = 0;
};

// The world of one process: all_gather returns {local}.
Collective& single_process();

// How a rank finds the others: torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT), or the flags that override it.
struct LaunchConfig {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // A rank silent this long (no heartbeat) is declared dead; also the connection timeout.
  std::chrono::seconds timeout{300};
  bool agent_store = false;  // torchrun's agent already serves the store at MASTER_PORT
  std::string key_prefix = "headwise/";
};

struct LaunchFlags {
  int rank = -1;  // -1: from the environment
  int world_size = -1;
  std::string master_addr;
  int master_port = -1;
  int64_t timeout_seconds = 300;
};

// Flags first, then the environment; InputError naming the flag or variable when a value is
// malformed or inconsistent (rank outside [0, world size), world size < 1, port outside 1-65535).
LaunchConfig launch_config(const LaunchFlags& flags);

// world_size 1: single_process(); otherwise connects to the store (rank 0 serves it unless
// torchrun's agent does) and waits for every rank. Error naming the address on failure.
std::unique_ptr<Collective> connect(const LaunchConfig& config);

// Helpers over all_gather.
ExactSum sum_all(Collective& c, const ExactSum& local, const std::string& what);
// Each element summed over the ranks (every rank passes as many); one message per rank.
std::vector<ExactSum> sum_all(Collective& c, std::vector<ExactSum> local, const std::string& what);
int64_t sum_all(Collective& c, int64_t local, const std::string& what);
int64_t min_all(Collective& c, int64_t local, const std::string& what);

// The global micro-batches of `sequences` (consecutive runs of `micro_batch`) that rank `rank`
// of `world` measures: m with m % world == rank, so a prefix of the sequences (the probe's) is
// spread over the ranks too. Returns the sequence indices, in order. InputError naming
// --micro-batch when there are fewer micro-batches than ranks.
std::vector<size_t> shard_sequences(size_t sequences, int64_t micro_batch, int rank, int world);

}  // namespace headwise::dist
