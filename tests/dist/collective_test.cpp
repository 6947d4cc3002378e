// The ranks' exchange (dist/collective.hpp) in one process: a thread per rank, each with its own
// connection to the store, as separate processes would have. The end-to-end runs of several
// headwise-calc processes are in distributed_test.cpp.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <future>
#include <thread>

#include "headwise/core/error.hpp"
#include "headwise/dist/collective.hpp"
#include "port.hpp"

using namespace headwise;
using Clock = std::chrono::steady_clock;

namespace {

dist::LaunchConfig config_for(int rank, int world, int port, int timeout_seconds = 30) {
  dist::LaunchConfig c;
  c.rank = rank;
  c.world_size = world;
  c.master_port = port;
  c.timeout = std::chrono::seconds(timeout_seconds);
  return c;
}

}  // namespace

TEST_CASE("shards are whole micro-batches, dealt round-robin", "[dist]") {
  using V = std::vector<size_t>;
  CHECK(dist::shard_sequences(5, 1, 0, 3) == V{0, 3});
  CHECK(dist::shard_sequences(5, 1, 1, 3) == V{1, 4});
  CHECK(dist::shard_sequences(5, 1, 2, 3) == V{2});
  // Micro-batches of 2: {0,1} {2,3} {4}; a prefix of the sequences (the probe's) is spread too.
  CHECK(dist::shard_sequences(5, 2, 0, 2) == V{0, 1, 4});
  CHECK(dist::shard_sequences(5, 2, 1, 2) == V{2, 3});
  CHECK(dist::shard_sequences(4, 4, 0, 1) == V{0, 1, 2, 3});
  // Fewer micro-batches than ranks: an error naming the flag.
  CHECK_THROWS_WITH(dist::shard_sequences(4, 2, 0, 3),
                    Catch::Contains("--micro-batch 2") && Catch::Contains("3 ranks"));
}

TEST_CASE("launch settings come from the flags, else torchrun's environment", "[dist]") {
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("RANK", "3", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("MASTER_ADDR", "10.0.0.7", 1);
  ::setenv("MASTER_PORT", "29555", 1);
  dist::LaunchConfig c = dist::launch_config({});
  CHECK((c.world_size == 4 && c.rank == 3 && c.local_rank == 1 && c.master_addr == "10.0.0.7" &&
         c.master_port == 29555));
  dist::LaunchFlags flags;
  flags.rank = 0;
  flags.world_size = 2;
  flags.master_port = 1234;
  c = dist::launch_config(flags);
  CHECK((c.world_size == 2 && c.rank == 0 && c.master_port == 1234));
  ::setenv("RANK", "4", 1);
  CHECK_THROWS_WITH(dist::launch_config({}), Catch::Contains("RANK") && Catch::Contains("[0, 4)"));
  ::setenv("RANK", "x", 1);
  CHECK_THROWS_WITH(dist::launch_config({}), Catch::Contains("RANK: 'x' is not an integer"));
  for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    ::unsetenv(v);
  flags = {};
  flags.master_port = 70000;
  CHECK_THROWS_WITH(dist::launch_config(flags), Catch::Contains("--master-port"));
  c = dist::launch_config({});
  CHECK((c.world_size == 1 && c.rank == 0));
  CHECK(dist::connect(c) == nullptr);  // one process needs no store
}

TEST_CASE("all_gather returns every rank's bytes in rank order", "[dist]") {
  const int port = testing::free_port();
  auto run_rank = [port](int rank) {
    auto world = dist::connect(config_for(rank, 3, port));
    std::vector<std::vector<std::string>> rounds;
    for (int round = 0; round < 3; ++round) {
      rounds.push_back(world->all_gather(
          std::string(static_cast<size_t>(rank + round), 'a' + static_cast<char>(rank)),
          "round " + std::to_string(round)));
    }
    const int64_t sent = world->bytes_sent();
    const int64_t total = dist::sum_all(*world, int64_t{rank + 1}, "sum");
    ExactSum local;
    local.add(rank == 0 ? 1e300 : rank == 1 ? 1.0 : -1e300);
    const double exact = dist::sum_all(*world, local, "exact").value();
    // Element-wise: element i gets rank + i from each rank, and the 1e300 cancellation in
    // element 1.
    std::vector<ExactSum> each(3);
    for (size_t i = 0; i < each.size(); ++i)
      each[i].add(static_cast<double>(rank) + static_cast<double>(i));
    each[1].add(rank == 0 ? 1e300 : rank == 2 ? -1e300 : 0.0);
    std::vector<double> each_total;
    for (const auto& e : dist::sum_all(*world, each, "each")) each_total.push_back(e.value());
    world->finish();
    return std::make_tuple(rounds, sent, total, exact, each_total);
  };
  auto r1 = std::async(std::launch::async, run_rank, 1);
  auto r2 = std::async(std::launch::async, run_rank, 2);
  const auto [rounds, sent, total, exact, each_total] = run_rank(0);
  // Assertions on this thread only (Catch2 is not thread-safe): every rank holds the same sums.
  CHECK(std::get<4>(r1.get()) == each_total);
  CHECK(std::get<4>(r2.get()) == each_total);
  CHECK(each_total == std::vector<double>{3.0, 6.0, 9.0});
  CHECK(rounds[2] == std::vector<std::string>{"aa", "bbb", "cccc"});
  CHECK(rounds[0] == std::vector<std::string>{"", "b", "cc"});
  CHECK(sent > 0);
  CHECK(total == 6);
  CHECK(exact == 1.0);  // merged exactly, whatever the order
}

TEST_CASE("ranks that call different exchanges fail naming both", "[dist]") {
  const int port = testing::free_port();
  auto other = std::async(std::launch::async, [port] {
    auto world = dist::connect(config_for(1, 2, port));
    try {
      world->all_gather("x", "layer 3: block-mse sums");
    } catch (const Error&) {
    }
  });
  auto world = dist::connect(config_for(0, 2, port));
  CHECK_THROWS_WITH(world->all_gather("x", "layer 1: block-mse sums"),
                    Catch::Contains("out of step") && Catch::Contains("layer 3: block-mse sums"));
  other.get();
}

TEST_CASE(
    "a rank that stops beating is named within the timeout; a failing rank's reason reaches the "
    "others",
    "[dist]") {
  const int port = testing::free_port();
  std::promise<void> failed_seen;
  auto other = std::async(std::launch::async, [port] {
    auto world = dist::connect(config_for(1, 3, port, 1));
    world->all_gather("", "first");
    // Rank 1 goes away without a word (its heartbeat stops with it).
  });
  auto third = std::async(std::launch::async, [port] {
    auto world = dist::connect(config_for(2, 3, port, 1));
    world->all_gather("", "first");
    try {
      world->all_gather("", "second");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  });
  auto world = dist::connect(config_for(0, 3, port, 1));
  world->all_gather("", "first");
  other.get();
  const auto start = Clock::now();
  std::string error;
  try {
    world->all_gather("", "second");
  } catch (const Error& e) {
    error = e.what();
    world->abort(error);
  }
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK_THAT(error, Catch::Contains("rank 1 stopped responding") && Catch::Contains("second"));
  CHECK(waited < 10.0);
  // Rank 2 either noticed rank 1 itself or read rank 0's reason.
  CHECK_THAT(third.get(), Catch::Contains("rank 1"));
}
