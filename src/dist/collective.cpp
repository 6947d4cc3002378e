#include "headwise/dist/collective.hpp"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "headwise/core/error.hpp"

namespace headwise::dist {
namespace {

class SingleProcess final : public Collective {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "none"; }
  std::vector<std::string> all_gather(const std::string& local, const std::string&) override {
    return {local};
  }
  int64_t bytes_sent() const override { return 0; }
  void abort(const std::string&) noexcept override {}
  void finish() override {}
};

std::string int_bytes(int64_t v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}

int64_t int_from_bytes(const std::string& bytes) {
  HEADWISE_CHECK(bytes.size() == sizeof(int64_t), "integer image of {} bytes", bytes.size());
  int64_t v = 0;
  std::memcpy(&v, bytes.data(), sizeof v);
  return v;
}

// An integer from the environment variable `name`, or nullopt when unset.
std::optional<int64_t> env_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  int64_t value = 0;
  const char* end = text + std::strlen(text);
  const auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end)
    throw_input_error("environment variable {}: '{}' is not an integer", name, text);
  return value;
}

}  // namespace

Collective& single_process() {
  static SingleProcess world;
  return world;
}

LaunchConfig launch_config(const LaunchFlags& flags) {
  LaunchConfig config;
  const auto pick = [](int flag, const char* variable, int fallback) -> int64_t {
    if (flag >= 0) return flag;
    return env_int(variable).value_or(fallback);
  };
  const int64_t world = pick(flags.world_size, "WORLD_SIZE", 1);
  const int64_t rank = pick(flags.rank, "RANK", 0);
  if (world < 1 || world > 65536) {
    throw_field_error("world_size", " (or WORLD_SIZE): {} is not a number of processes (1 or more)",
                      world);
  }
  if (rank < 0 || rank >= world)
    throw_field_error("rank", " (or RANK): {} is outside [0, {})", rank, world);
  config.world_size = static_cast<int>(world);
  config.rank = static_cast<int>(rank);
  const int64_t local_rank = env_int("LOCAL_RANK").value_or(0);
  if (local_rank < 0)
    throw_input_error("environment variable LOCAL_RANK: {} is negative", local_rank);
  config.local_rank = static_cast<int>(local_rank);
  if (!flags.master_addr.empty()) {
    config.master_addr = flags.master_addr;
  } else if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    config.master_addr = addr;
  }
  const int64_t port =
      flags.master_port >= 0 ? flags.master_port : env_int("MASTER_PORT").value_or(29500);
  if (port < 1 || port > 65535)
    throw_field_error("master_port", " (or MASTER_PORT): {} is not a TCP port", port);
  config.master_port = static_cast<int>(port);
  if (flags.timeout_seconds < 1)
    throw_field_error("dist_timeout", ": {} s must be at least 1", flags.timeout_seconds);
  config.timeout = std::chrono::seconds(flags.timeout_seconds);
  // torchrun's agent serves a TCPStore at MASTER_PORT for its workers; a restarted job must not
  // read the keys of the attempt before it.
  if (const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE"); agent != nullptr) {
    config.agent_store = std::string(agent) == "True" || std::string(agent) == "1";
  }
  config.key_prefix =
      "headwise/" + std::to_string(env_int("TORCHELASTIC_RESTART_COUNT").value_or(0)) + "/";
  return config;
}

ExactSum sum_all(Collective& c, const ExactSum& local, const std::string& what) {
  if (c.world_size() == 1) return local;
  ExactSum total;
  for (const auto& bytes : c.all_gather(local.to_bytes(), what))
    total.merge(ExactSum::from_bytes(bytes));
  return total;
}

std::vector<ExactSum> sum_all(Collective& c, std::vector<ExactSum> local, const std::string& what) {
  if (c.world_size() == 1) return local;
  std::string mine;
  for (const auto& s : local) {
    const std::string b = s.to_bytes();
    const auto n = static_cast<uint32_t>(b.size());
    mine.append(reinterpret_cast<const char*>(&n), sizeof n);
    mine += b;
  }
  const auto all = c.all_gather(mine, what);
  for (size_t r = 0; r < all.size(); ++r) {
    if (static_cast<int>(r) == c.rank()) continue;
    size_t at = 0;
    for (auto& sum : local) {
      uint32_t n = 0;
      HEADWISE_CHECK(at + sizeof n <= all[r].size(), "{}: short message from rank {}", what, r);
      std::memcpy(&n, all[r].data() + at, sizeof n);
      at += sizeof n;
      HEADWISE_CHECK(at + n <= all[r].size(), "{}: short message from rank {}", what, r);
      sum.merge(ExactSum::from_bytes(std::string_view(all[r]).substr(at, n)));
      at += n;
    }
    HEADWISE_CHECK(at == all[r].size(), "{}: rank {} sent {} sums' worth of bytes too many", what,
                   r, all[r].size() - at);
  }
  return local;
}

int64_t sum_all(Collective& c, int64_t local, const std::string& what) {
  int64_t total = 0;
  for (const auto& bytes : c.all_gather(int_bytes(local), what)) total += int_from_bytes(bytes);
  return total;
}

int64_t min_all(Collective& c, int64_t local, const std::string& what) {
  int64_t least = std::numeric_limits<int64_t>::max();
  for (const auto& bytes : c.all_gather(int_bytes(local), what))
    least = std::min(least, int_from_bytes(bytes));
  return least;
}

std::vector<size_t> shard_sequences(size_t sequences, int64_t micro_batch, int rank, int world) {
  HEADWISE_CHECK(micro_batch > 0 && world > 0 && rank >= 0 && rank < world, "shard {} of {}", rank,
                 world);
  const auto mb = static_cast<size_t>(micro_batch);
  const size_t micro_batches = (sequences + mb - 1) / mb;
  if (micro_batches < static_cast<size_t>(world)) {
    throw_field_error("micro_batch",
                      " {} splits {} sequences into {} micro-batches, fewer than the {} ranks: "
                      "every rank needs at "
                      "least one; lower {} or add {}",
                      micro_batch, sequences, micro_batches, world, field_ref("micro_batch"),
                      field_ref("samples"));
  }
  std::vector<size_t> indices;
  for (size_t m = static_cast<size_t>(rank); m < micro_batches; m += static_cast<size_t>(world)) {
    for (size_t s = m * mb; s < std::min(sequences, (m + 1) * mb); ++s) indices.push_back(s);
  }
  return indices;
}

}  // namespace headwise::dist
