#include "args.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "replayssm/runtime.hpp"

namespace replayssm::tool {
namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) items.push_back(item);
  if (!text.empty() && text.back() == ',') items.push_back("");
  return items;
}

}  // namespace

Args::Args(const std::vector<Option>& options, const std::vector<std::string>& argv) {
  for (const Option& o : options) defaults_[o.flag] = o.default_value;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string flag = arg.substr(0, eq);
    if (flag.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + arg + "'");
    if (defaults_.count(flag) == 0) throw UsageError("unknown option '" + flag + "'");
    if (values_.count(flag) != 0) throw UsageError("option '" + flag + "' is given twice");
    if (eq != std::string::npos) {
      values_[flag] = arg.substr(eq + 1);
    } else if (i + 1 < argv.size()) {
      values_[flag] = argv[++i];
    } else {
      throw UsageError("option '" + flag + "' needs a value");
    }
  }
}

const std::string& Args::get(const std::string& flag) const {
  const auto given_value = values_.find(flag);
  return given_value != values_.end() ? given_value->second : defaults_.at(flag);
}

std::string format_help(const std::string& usage, const std::string& summary,
                        const std::vector<Option>& options) {
  std::ostringstream os;
  os << "usage: " << usage << "\n\n" << summary << "\n\noptions:\n";
  for (const Option& o : options) {
    std::string left = "  " + o.flag + " " + o.value_name;
    left.resize(std::max<size_t>(left.size() + 2, 32), ' ');
    os << left << o.help;
    if (!o.default_value.empty()) os << " (default " << o.default_value << ")";
    os << "\n";
  }
  os << "  --help                        show this help\n";
  return os.str();
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    throw UsageError(flag + " expects an integer, got '" + text + "'");
  if (v < min || v > max)
    throw UsageError(flag + "=" + text + " is out of range: must be in [" + std::to_string(min) +
                     ", " + std::to_string(max) + "]");
  return v;
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text, int64_t min,
                                    int64_t max) {
  std::vector<int64_t> values;
  for (const std::string& item : split_commas(text)) values.push_back(parse_int(flag, item, min, max));
  if (values.empty()) throw UsageError(flag + " expects a comma-separated list of integers");
  return values;
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  if (text == "fp32") return DType::kFloat32;
  if (text == "fp16") return DType::kFloat16;
  if (text == "bf16") return DType::kBFloat16;
  throw UsageError(flag + " expects fp32, fp16 or bf16, got '" + text + "'");
}

DType parse_state_dtype(const std::string& flag, const std::string& text) {
  if (text == "int8") return DType::kInt8;
  if (text == "fp8") return DType::kFloat8E4M3;
  if (text == "fp32" || text == "fp16" || text == "bf16") return parse_dtype(flag, text);
  throw UsageError(flag + " expects fp32, fp16, bf16, int8 or fp8 (e4m3), got '" + text + "'");
}

std::vector<DType> parse_state_dtype_list(const std::string& flag, const std::string& text) {
  std::vector<DType> values;
  for (const std::string& item : split_commas(text)) values.push_back(parse_state_dtype(flag, item));
  if (values.empty())
    throw UsageError(flag + " expects a comma-separated list of fp32, fp16, bf16, int8, fp8");
  return values;
}

std::vector<DType> parse_dtype_list(const std::string& flag, const std::string& text) {
  std::vector<DType> values;
  for (const std::string& item : split_commas(text)) values.push_back(parse_dtype(flag, item));
  if (values.empty()) throw UsageError(flag + " expects a comma-separated list of fp32, fp16, bf16");
  return values;
}

std::vector<bool> parse_rounding_list(const std::string& flag, const std::string& text) {
  std::vector<bool> values;
  for (const std::string& item : split_commas(text)) {
    if (item != "nearest" && item != "stochastic")
      throw UsageError(flag + " expects nearest and/or stochastic, got '" + item + "'");
    values.push_back(item == "stochastic");
  }
  if (values.empty()) throw UsageError(flag + " expects a comma-separated list of nearest, stochastic");
  return values;
}

const char* dtype_short_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat64: return "fp64";
    case DType::kInt32: return "int32";
    case DType::kInt8: return "int8";
    case DType::kFloat8E4M3: return "fp8";
  }
  return "unknown";
}

DeviceType parse_device(const std::string& flag, const std::string& text) {
  if (text == "cpu") return DeviceType::kCpu;
  if (text == "cuda") return DeviceType::kCuda;
  if (text == "auto")
    return built_with_cuda() && cuda_device_count() > 0 ? DeviceType::kCuda : DeviceType::kCpu;
  throw UsageError(flag + " expects cpu, cuda or auto, got '" + text + "'");
}

ReplayRoute parse_route(const std::string& flag, const std::string& text) {
  for (ReplayRoute r : {ReplayRoute::kAuto, ReplayRoute::kOutputOnly, ReplayRoute::kStateAndOutput})
    if (text == route_name(r)) return r;
  throw UsageError(flag + " expects auto, output-only or state-and-output, got '" + text + "'");
}

const char* window_kernel_name(WindowKernel choice) {
  switch (choice) {
    case WindowKernel::kAuto: return "auto";
    case WindowKernel::kFused: return "fused";
    case WindowKernel::kSeparate: return "separate";
  }
  return "unknown";
}

Option window_kernel_option() {
  return {"--window-kernel", "K",
          "with --device cuda, the path of a replay given a workspace: auto, fused (one kernel), "
          "separate (the split path)",
          "auto"};
}

WindowKernel parse_window_kernel(const std::string& flag, const std::string& text, DeviceType device) {
  for (WindowKernel k : {WindowKernel::kAuto, WindowKernel::kFused, WindowKernel::kSeparate}) {
    if (text != window_kernel_name(k)) continue;
    if (k != WindowKernel::kAuto && device != DeviceType::kCuda)
      throw UsageError(flag + " " + text + ": only the CUDA backend has more than one path; use --device cuda");
    return k;
  }
  throw UsageError(flag + " expects auto, fused or separate, got '" + text + "'");
}

}  // namespace replayssm::tool
