// replayssm: the command line tool. Dispatches to a subcommand and maps errors to exit codes:
// 0 success, 1 failure (a check failed, or the library or the device reported an error),
// 2 a mistake on the command line.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"

namespace {

constexpr const char* kUsage =
    "usage: replayssm <command> [options]\n"
    "\n"
    "Mamba-2 decode with ReplaySSM: checks and benchmarks.\n"
    "\n"
    "commands:\n"
    "  verify     check the baseline and both ReplaySSM routes against the fp64 oracle\n"
    "             (--spec T: the speculative verify / commit and the baseline speculative path)\n"
    "  bench      time the baseline and ReplaySSM per decode step: bytes, bandwidth, speedup\n"
    "             (--spec T: per verify step of T tokens)\n"
    "  precision  error of fp32 / fp16 / bf16 states over a long rollout, against the fp64 oracle\n"
    "\n"
    "Run 'replayssm <command> --help' for the options of a command.\n";

std::string quoted_command_line(int argc, char** argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool plain = !arg.empty() && arg.find_first_of(" \t\"'\\$") == std::string::npos;
    line += (i ? " " : "") + (plain ? arg : "'" + arg + "'");
  }
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace replayssm::tool;
  std::string help_hint = "replayssm --help";
  try {
    if (argc < 2) throw UsageError("missing command");
    const std::string command = argv[1];
    const std::vector<std::string> args(argv + 2, argv + argc);
    if (command == "--help" || command == "-h" || command == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (command == "verify" || command == "bench" || command == "precision") help_hint = "replayssm " + command + " --help";
    if (command == "verify") return run_verify(args);
    if (command == "bench") return run_bench(args, quoted_command_line(argc, argv));
    if (command == "precision") return run_precision(args, quoted_command_line(argc, argv));
    throw UsageError("unknown command '" + command + "'");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "replayssm: %s\nRun '%s' for usage.\n", e.what(), help_hint.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "replayssm: error: %s\n", e.what());
    return 1;
  }
}
