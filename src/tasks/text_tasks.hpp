#pragma once
// One function per generator task; each builds record `index` of a request.
#include <nlohmann/json.hpp>

#include "haystack.hpp"

namespace headwise::tasks {

struct TaskContext {
  const GeneratorRequest& request;
  const TokenCounter& counter;
  const Haystack& haystack;
  int64_t index;  // sample number: sets the needle depth
  Rng& rng;       // seeded for this sample only
};

nlohmann::json make_niah(const TaskContext& ctx, int keys, int values, int queries);
nlohmann::json make_variable_tracking(const TaskContext& ctx);
nlohmann::json make_common_words(const TaskContext& ctx);
nlohmann::json make_qa_distractors(const TaskContext& ctx);
nlohmann::json make_locomo(const TaskContext& ctx);

}  // namespace headwise::tasks
