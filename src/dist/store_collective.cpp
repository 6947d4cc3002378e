// The ranks' exchange over c10d's TCPStore (libtorch): rank 0 (or torchrun's agent) serves it,
// every rank sets its payload under the exchange's sequence number and reads the others'.
// A heartbeat thread per rank lets the others tell a dead or hung rank from a slow one: a slow
// rank keeps beating while it computes, a killed one stops, and the waiting ranks fail naming
// it after the timeout instead of hanging.
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "headwise/core/error.hpp"
#include "headwise/dist/collective.hpp"

namespace headwise::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kHeartbeatPeriod = std::chrono::milliseconds(500);
constexpr auto kCheckEvery = std::chrono::milliseconds(250);
constexpr auto kPollCap = std::chrono::milliseconds(5);

std::vector<uint8_t> to_store(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string from_store(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}

class StoreCollective final : public Collective {
 private:
  static std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

  std::string key(int64_t round, int rank) const {
    return config_.key_prefix + "round/" + std::to_string(round) + "/" + std::to_string(rank);
  }
  std::string alive_key(int rank) const {
    return config_.key_prefix + "alive/" + std::to_string(rank);
  }

  template <typename Fn>
  auto guarded(const std::string& what, Fn&& fn) const {
    try {
      return fn();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(fmt::format(
          "rank {}: lost the rendezvous store at {}:{} while the ranks exchanged {} (rank 0 serves "
          "it: did it exit?): {}",
          config_.rank, config_.master_addr, config_.master_port, what, first_line(e.what())));
    }
  }

 public:
 public:
  explicit StoreCollective(const LaunchConfig& config) : config_(config) {
    store_ = open_store(config_.rank == 0 && !config_.agent_store);
    heartbeat_store_ = open_store(false);
    heartbeat_ = std::thread([this] { beat(); });
    all_gather(std::string(), "the start (every rank connected)");
    spdlog::info("rank {} of {}: connected through {}:{}", config_.rank, config_.world_size,
                 config_.master_addr, config_.master_port);
  }

  ~StoreCollective() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  int rank() const override { return config_.rank; }
  int world_size() const override { return config_.world_size; }
  std::string backend() const override { return "tcpstore"; }
  int64_t bytes_sent() const override { return bytes_sent_; }

  std::vector<std::string> all_gather(const std::string& local, const std::string& what) override {
    const int64_t round = ++round_;
    const std::string payload = what + '\0' + local;
    guarded(what, [&] { store_->set(key(round, config_.rank), to_store(payload)); });
    bytes_sent_ += static_cast<int64_t>(payload.size());
    std::vector<std::string> keys;
    for (int r = 0; r < config_.world_size; ++r) keys.push_back(key(round, r));
    wait_for(keys, what);
    std::vector<std::string> out;
    for (int r = 0; r < config_.world_size; ++r) {
      const std::string got =
          guarded(what, [&] { return from_store(store_->get(keys[static_cast<size_t>(r)])); });
      const size_t split = got.find('\0');
      const std::string their_what = got.substr(0, split);
      if (split == std::string::npos || their_what != what) {
        throw Error(
            fmt::format("distributed calibration out of step: rank {} exchanged '{}' while rank {} "
                        "exchanged '{}'",
                        config_.rank, what, r, their_what));
      }
      out.push_back(got.substr(split + 1));
    }
    // Every rank has set this round's key, so every rank has read round - 1's: drop ours.
    if (round > 1) guarded(what, [&] { store_->deleteKey(key(round - 1, config_.rank)); });
    return out;
  }

  void abort(const std::string& message) noexcept override {
    try {
      store_->set(config_.key_prefix + "failed",
                  to_store(fmt::format("rank {}: {}", config_.rank, message)));
      // Rank 0 serves the store: stay a moment so the others read why instead of a lost connection.
      if (config_.rank == 0 && !config_.agent_store)
        std::this_thread::sleep_for(std::chrono::seconds(2));
    } catch (...) {
    }
  }

  void finish() override {
    guarded("the end", [&] {
      store_->set(config_.key_prefix + "done/" + std::to_string(config_.rank), to_store("1"));
    });
    if (config_.rank != 0) return;
    std::vector<std::string> keys;
    for (int r = 0; r < config_.world_size; ++r)
      keys.push_back(config_.key_prefix + "done/" + std::to_string(r));
    wait_for(keys, "the end (every rank finished)");
  }

 private:
  c10::intrusive_ptr<c10d::TCPStore> open_store(bool server) const {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(config_.master_port);
    options.isServer = server;
    options.numWorkers = static_cast<size_t>(config_.world_size);
    options.waitWorkers = false;
    options.timeout = config_.timeout;
    try {
      return c10::make_intrusive<c10d::TCPStore>(config_.master_addr, options);
    } catch (const std::exception& e) {
      throw Error(fmt::format(
          "rank {}: cannot {} the rendezvous store at {}:{} (--master-addr/--master-port, or "
          "MASTER_ADDR/MASTER_PORT): {}",
          config_.rank, server ? "serve" : "reach", config_.master_addr, config_.master_port,
          first_line(e.what())));
    }
  }

  // Waits until every key exists; fails when a rank reported a failure or its heartbeat stopped.
  // Polls with a short pause (an exchange costs at most kPollCap more than the slowest rank) and
  // looks at the failure key and the heartbeats every kCheckEvery. (The store's own timed wait
  // logs a warning at every timeout, which would flood the log of a rank waiting for a slow one.)
  void wait_for(const std::vector<std::string>& keys, const std::string& what) {
    std::vector<int64_t> beats(keys.size(), -1);
    std::vector<Clock::time_point> heard(keys.size(), Clock::now());
    auto pause = std::chrono::microseconds(200);
    auto next_check = Clock::now();
    while (!guarded(what, [&] { return store_->check(keys); })) {
      if (Clock::now() >= next_check) {
        if (guarded(what, [&] { return store_->check({config_.key_prefix + "failed"}); })) {
          const std::string why =
              guarded(what, [&] { return from_store(store_->get(config_.key_prefix + "failed")); });
          throw Error(fmt::format(
              "distributed calibration stopped while the ranks exchanged {}: {}", what, why));
        }
        for (size_t r = 0; r < keys.size(); ++r)
          check_alive(static_cast<int>(r), keys[r], beats[r], heard[r], what);
        next_check = Clock::now() + kCheckEvery;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(kPollCap));
    }
  }

  void check_alive(int rank, const std::string& key, int64_t& beat, Clock::time_point& heard,
                   const std::string& what) {
    if (rank == config_.rank || guarded(what, [&] { return store_->check({key}); })) return;
    const int64_t now_beat = guarded(what, [&] { return store_->add(alive_key(rank), 0); });
    if (now_beat != beat) {
      beat = now_beat;
      heard = Clock::now();
      return;
    }
    if (Clock::now() - heard > config_.timeout) {
      throw Error(fmt::format(
          "rank {} stopped responding (no heartbeat for {} s, --dist-timeout) while the ranks "
          "exchanged {}; stopping",
          rank, config_.timeout.count(), what));
    }
  }

  void beat() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      try {
        heartbeat_store_->add(alive_key(config_.rank), 1);
      } catch (...) {
        // The store is gone (rank 0 exited): the main thread reports it at its next exchange.
      }
      lock.lock();
      wake_.wait_for(lock, kHeartbeatPeriod, [this] { return stopping_; });
    }
  }

  LaunchConfig config_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  c10::intrusive_ptr<c10d::TCPStore> heartbeat_store_;
  std::thread heartbeat_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  int64_t round_ = 0;
  int64_t bytes_sent_ = 0;
};

}  // namespace

std::unique_ptr<Collective> connect(const LaunchConfig& config) {
  if (config.world_size == 1) return nullptr;
  return std::make_unique<StoreCollective>(config);
}

}  // namespace headwise::dist
