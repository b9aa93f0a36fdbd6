// The subcommands of the replayssm tool. Each returns the process exit code; command line mistakes
// throw UsageError.
#pragma once

#include <string>
#include <vector>

namespace replayssm::tool {

// Checks the baseline and both ReplaySSM routes against the fp64 oracle over a rollout.
int run_verify(const std::vector<std::string>& args);

// The --spec mode of verify: ReplaySSM's speculative verify / commit and the baseline speculative
// path against the fp64 oracle, with random accepted counts.
int run_spec_verify(const std::vector<std::string>& args);

// Times the baseline and ReplaySSM per decode step. `command_line` is recorded in the JSON.
int run_bench(const std::vector<std::string>& args, const std::string& command_line);

// Measures how the error of fp32 / fp16 / bf16 states evolves over a long rollout, for the
// baseline and ReplaySSM, against the fp64 oracle. `command_line` is recorded in the JSON.
int run_precision(const std::vector<std::string>& args, const std::string& command_line);

}  // namespace replayssm::tool
