#include "headwise/eval/schedule.hpp"

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "headwise/core/error.hpp"

namespace headwise::eval {
namespace {

// What decides a run's numbers: the windows, the sink tokens and, for the eviction baselines, the
// rule with its parameters (their details). Names and a static baseline's provenance do not.
std::string run_key(const MethodWindows& m) {
  nlohmann::json key = nlohmann::json::object();
  for (const auto& [layer, heads] : m.windows) key["windows"][std::to_string(layer)] = heads;
  key["eviction"] = m.eviction ? m.details : nlohmann::json(nullptr);
  key["sink_tokens"] = m.sink_tokens ? nlohmann::json(*m.sink_tokens) : nlohmann::json(nullptr);
  return key.dump();
}

struct Job {
  size_t policy = 0;
  size_t index = 0;
  MethodWindows method;    // a copy: the builder keeps growing the lists while workers run
  bool reference = false;  // the full-KV run every other run's KL is measured against
};

// Restores the calling thread's intra-op thread count on scope exit.
class ThreadCountGuard {
 public:
  explicit ThreadCountGuard(std::optional<int> threads)
      : saved_(at::get_num_threads()), changed_(threads.has_value()) {
    if (changed_) at::set_num_threads(*threads);
  }
  ~ThreadCountGuard() {
    if (changed_) at::set_num_threads(saved_);
  }
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int saved_;
  bool changed_;
};

class Scheduler {
 public:
  Scheduler(size_t policies, const memory::MemoryOptions& options,
            const std::vector<EvalSample>& samples, const RunOptions& run)
      : options_(options), samples_(samples), run_(run), methods_(policies), reused_(policies) {}

  void push_reference(const arch::ModelSpec& spec) {
    Job job{0, 0, {"full", memory::full_kv_windows(spec)}, true};
    const std::lock_guard lock(mutex_);
    queue_.push_back(std::move(job));
  }

  void emit(size_t policy, size_t index, MethodWindows method) {
    HEADWISE_CHECK(policy < methods_.size(), "method for policy {} of {}", policy, methods_.size());
    const std::lock_guard lock(mutex_);
    // A worker failed: stop building too (the builder's caller keeps the first error).
    if (stop_) throw_input_error("eval stopped: another job failed");
    HEADWISE_CHECK(methods_[policy].emplace(index, method).second,
                   "method slot {} of policy {} emitted twice", index, policy);
    if (method.name == "full") return;  // answered by the reference run
    if (method.does_not_fit) return;    // not run: its result stays empty but for the name
    const std::string key = run_key(method);
    if (const auto first = first_run_.find(key); first != first_run_.end()) {
      spdlog::info("eval: {} has the windows and rule of {} (policy {}): its run is reused",
                   method.name, methods_[first->second.first].at(first->second.second).name,
                   first->second.first + 1);
      reused_[policy][index] = first->second;
      return;
    }
    first_run_.emplace(key, std::make_pair(policy, index));
    queue_.push_back({policy, index, std::move(method), false});
    ready_.notify_all();
  }

  void building_done() {
    const std::lock_guard lock(mutex_);
    building_ = false;
    ready_.notify_all();
  }

  void fail(std::exception_ptr error) {
    const std::lock_guard lock(mutex_);
    if (!error_) error_ = error;
    stop_ = true;
    ready_.notify_all();
  }

  // Takes jobs until the queue is empty and the builder is done (or another worker failed).
  void work(arch::DecoderModel& model) {
    try {
      for (std::optional<Job> job = next(); job; job = next()) run(model, *job);
    } catch (...) {
      fail(std::current_exception());
    }
  }

  ScheduledRuns finish() {
    if (error_) std::rethrow_exception(error_);
    HEADWISE_CHECK(reference_.has_value(), "eval: the full-KV reference did not run");
    ScheduledRuns out;
    out.full = std::move(*reference_);
    out.runs_executed = static_cast<int64_t>(results_.size()) + 1;
    out.methods.resize(methods_.size());
    for (size_t p = 0; p < methods_.size(); ++p) {
      for (auto& [slot, method] : methods_[p]) {
        HEADWISE_CHECK(slot == out.methods[p].size(), "policy {} has no method in slot {}", p,
                       out.methods[p].size());
        out.methods[p].push_back(std::move(method));
      }
    }
    out.results.resize(out.methods.size());
    for (size_t p = 0; p < out.methods.size(); ++p) {
      for (size_t i = 0; i < out.methods[p].size(); ++i) {
        const MethodWindows& m = out.methods[p][i];
        MethodResult r;
        if (m.name == "full") {
          r = out.full;
        } else if (m.does_not_fit) {
          r.name = m.name;
        } else if (const auto reused = reused_[p].find(i); reused != reused_[p].end()) {
          r = results_.at(reused->second);
          r.name = m.name;
          ++out.runs_reused;
        } else {
          r = results_.at({p, i});
        }
        out.results[p].push_back(std::move(r));
      }
    }
    return out;
  }

 private:
  std::optional<Job> next() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return stop_ || !queue_.empty() || !building_; });
    if (stop_ || queue_.empty()) return std::nullopt;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    // Every KL is measured against full KV's log-probabilities: wait for them.
    if (!job.reference) ready_.wait(lock, [&] { return stop_ || reference_.has_value(); });
    if (stop_) return std::nullopt;
    return job;
  }

  void run(arch::DecoderModel& model, const Job& job) {
    spdlog::info(
        "eval: {}{} ({} global-KV bytes)", job.method.name,
        job.reference ? "" : fmt::format(" of policy {}", job.policy + 1),
        global_kv_bytes(model.spec(), job.method.windows, method_options(job.method, options_)));
    const MethodResult* reference = nullptr;
    if (!job.reference) {
      const std::lock_guard lock(mutex_);
      reference = &*reference_;  // set once before any other run starts, never moved until finish()
    }
    MethodResult result = run_method(model, job.method, options_, samples_, run_, reference);
    const std::lock_guard lock(mutex_);
    if (job.reference) {
      reference_ = std::move(result);
    } else {
      results_.emplace(std::make_pair(job.policy, job.index), std::move(result));
    }
    ready_.notify_all();
  }

  const memory::MemoryOptions& options_;
  const std::vector<EvalSample>& samples_;
  const RunOptions& run_;

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Job> queue_;
  bool building_ = true;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::map<size_t, MethodWindows>> methods_;  // per policy: slot → method
  // Per policy: method index → the (policy, index) whose run it reuses.
  std::vector<std::map<size_t, std::pair<size_t, size_t>>> reused_;
  std::map<std::string, std::pair<size_t, size_t>> first_run_;
  std::optional<MethodResult> reference_;
  std::map<std::pair<size_t, size_t>, MethodResult> results_;
};

}  // namespace

ScheduledRuns run_scheduled(const std::vector<std::unique_ptr<arch::DecoderModel>>& models,
                            size_t policies, const BuildMethods& build,
                            const memory::MemoryOptions& options,
                            const std::vector<EvalSample>& samples, const RunOptions& run,
                            const ScheduleOptions& schedule) {
  HEADWISE_CHECK(!models.empty(), "eval needs at least one model instance");
  for (const auto& m : models) HEADWISE_CHECK(m != nullptr, "eval: a worker has no model");
  if (schedule.threads_per_worker < 0) {
    throw_field_error("threads_per_worker", " must be positive, got {}",
                      schedule.threads_per_worker);
  }
  const auto workers = static_cast<int>(models.size());
  std::optional<int> threads;
  if (workers > 1) {
    threads = schedule.threads_per_worker > 0 ? static_cast<int>(schedule.threads_per_worker)
                                              : std::max(1, at::get_num_threads() / workers);
    spdlog::info("eval: {} jobs at {} intra-op thread{} each", workers, *threads,
                 *threads == 1 ? "" : "s");
  }

  Scheduler scheduler(policies, options, samples, run);
  scheduler.push_reference(models.front()->spec());
  std::vector<std::thread> helpers;
  for (int w = 1; w < workers; ++w) {
    helpers.emplace_back([&, w] {
      const ThreadCountGuard thread_count(threads);
      scheduler.work(*models[static_cast<size_t>(w)]);
    });
  }
  {
    const ThreadCountGuard thread_count(threads);
    try {
      build(*models.front(), [&](size_t policy, size_t slot, MethodWindows method) {
        scheduler.emit(policy, slot, std::move(method));
      });
    } catch (...) {
      scheduler.fail(std::current_exception());
    }
    scheduler.building_done();
    scheduler.work(*models.front());
  }
  for (auto& t : helpers) t.join();
  return scheduler.finish();
}

}  // namespace headwise::eval
