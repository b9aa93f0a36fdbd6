// Command line options: declaration, parsing and value conversion. Every mistake throws UsageError.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "replayssm/dtype.hpp"
#include "replayssm/mamba2.hpp"
#include "replayssm/tensor.hpp"

namespace replayssm::tool {

// A mistake on the command line; main reports it with a usage hint and exits with code 2.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

// One `--flag VALUE` option of a command.
struct Option {
  std::string flag;           // "--batch"
  std::string value_name;     // "N"
  std::string help;
  std::string default_value;  // "" when the option has no default
};

// The options given to one command, checked against the options it declares.
class Args {
 public:
  // Accepts `--flag VALUE`, `--flag=VALUE` and `--help` / `-h`.
  Args(const std::vector<Option>& options, const std::vector<std::string>& argv);

  bool help_requested() const { return help_; }
  bool given(const std::string& flag) const { return values_.count(flag) != 0; }
  // The value given for `flag`, else its default.
  const std::string& get(const std::string& flag) const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> defaults_;
  bool help_ = false;
};

// "usage: ...", the summary, then one line per option with its default.
std::string format_help(const std::string& usage, const std::string& summary,
                        const std::vector<Option>& options);

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max);
// A comma-separated list such as "1,8,64".
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text, int64_t min,
                                    int64_t max);

// fp32 | fp16 | bf16
DType parse_dtype(const std::string& flag, const std::string& text);
std::vector<DType> parse_dtype_list(const std::string& flag, const std::string& text);
// A state (checkpoint) dtype: fp32, fp16, bf16, int8 or fp8 (e4m3).
DType parse_state_dtype(const std::string& flag, const std::string& text);
std::vector<DType> parse_state_dtype_list(const std::string& flag, const std::string& text);
// Flush roundings, "nearest" and/or "stochastic": true for stochastic.
std::vector<bool> parse_rounding_list(const std::string& flag, const std::string& text);
const char* dtype_short_name(DType dtype);

// cpu | cuda | auto; auto is cuda when this build has CUDA and a device is present, else cpu.
DeviceType parse_device(const std::string& flag, const std::string& text);

// auto | output-only | state-and-output
ReplayRoute parse_route(const std::string& flag, const std::string& text);

// The path a CUDA replay given a workspace takes: auto | fused | separate (the Python names);
// other than auto, a usage error on a device with one path only (the CPU).
Option window_kernel_option();
WindowKernel parse_window_kernel(const std::string& flag, const std::string& text, DeviceType device);
const char* window_kernel_name(WindowKernel choice);

}  // namespace replayssm::tool
