// replayssm bench: per-step time of the baseline and of ReplaySSM, the modelled bytes of each, the
// achieved bandwidth against the copy bandwidth measured in the same run, and the speedup.
#include "bench.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "args.hpp"
#include "byte_model.hpp"
#include "commands.hpp"
#include "json.hpp"
#include "machine.hpp"
#include "spec_bench.hpp"
#include "workload.hpp"

namespace replayssm::tool {
namespace {

constexpr int64_t kMinColdBytes = int64_t(256) << 20;
constexpr int64_t kMaxLayers = 4096;  // tiny custom shapes stop here, possibly short of cold
constexpr int kCopyRepetitions = 7;
constexpr uint64_t kSeed = 1;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}


#if !defined(REPLAYSSM_WITH_CUDA)
[[noreturn]] void no_cuda_timing() {
  throw std::runtime_error(
      "bench --device cuda needs a CUDA build of replayssm; run bench with --device cpu");
}
#endif

CopyBandwidth measure_cpu_copy_bandwidth() {
  const std::unique_ptr<Memory> host = make_host_memory();
  CopyBandwidth result;
  result.buffer_bytes = cold_bytes();
  result.threads = backend_thread_count();
  result.repetitions = kCopyRepetitions;
  const Tensor src(*host, DType::kInt32, {result.buffer_bytes / 4});
  const Tensor dst(*host, DType::kInt32, {result.buffer_bytes / 4});
  const auto* from = static_cast<const char*>(src.view().data);  // (buffer_bytes)
  auto* to = static_cast<char*>(dst.view().data);                // (buffer_bytes)

  // Each thread copies one contiguous share, as the CPU backend splits its work over its threads.
  const int64_t share = (result.buffer_bytes / result.threads + 63) / 64 * 64;
  auto copy_once = [&] {
    std::vector<std::thread> threads;
    for (int t = 0; t < result.threads; ++t) {
      const int64_t begin = std::min(t * share, result.buffer_bytes);
      const int64_t end = std::min(begin + share, result.buffer_bytes);
      threads.emplace_back([=] { std::memcpy(to + begin, from + begin, size_t(end - begin)); });
    }
    for (std::thread& t : threads) t.join();
  };
  copy_once();  // warm-up
  std::vector<double> rates;
  for (int r = 0; r < result.repetitions; ++r) {
    const Clock::time_point start = Clock::now();
    copy_once();
    rates.push_back(2.0 * double(result.buffer_bytes) / seconds_since(start));
  }
  result.best_bytes_per_s = *std::max_element(rates.begin(), rates.end());
  result.median_bytes_per_s = median(rates);
  return result;
}

}  // namespace

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

void time_alternating(ConfigTiming& timing, int windows, double steps,
                      const std::function<double(bool replay)>& time_window) {
  time_window(false);
  time_window(true);
  for (int w = 0; w < windows; ++w) {
    timing.baseline_window_s.push_back(time_window(false));
    timing.replay_window_s.push_back(time_window(true));
  }
  timing.baseline_step_s = median(timing.baseline_window_s) / steps;
  timing.replay_step_s = median(timing.replay_window_s) / steps;
}

void print_cache_note(const ConfigTiming& timing) {
  if (timing.rotated_state_bytes < timing.cold_bytes)
    std::printf("  (only %" PRId64 " MiB of state rotated: some steps may hit the caches)\n",
                timing.rotated_state_bytes >> 20);
}

void finish_json(std::ofstream& file, const std::string& path) {
  file.close();
  if (!file) throw std::runtime_error("writing '" + path + "' failed");
  std::printf("\nwrote %s\n", path.c_str());
}

int64_t cold_bytes() { return std::max(kMinColdBytes, 4 * last_level_cache_bytes()); }

DType default_baseline_state_dtype(DType checkpoint) {
  return is_scaled_checkpoint(checkpoint) ? DType::kBFloat16 : checkpoint;
}

LayerShape layer_shape(const BenchConfig& config) {
  LayerShape shape;
  shape.geometry = config.geometry;
  shape.batch = config.batch;
  shape.slots = config.batch;
  shape.buffer_len = config.buffer_len;
  return shape;
}

int64_t state_bytes(const BenchConfig& config) {
  const Geometry& g = config.geometry;
  const int64_t element = std::min(dtype_size(config.state_dtype), dtype_size(config.baseline_state_dtype));
  return config.batch * g.heads * g.head_dim * g.state_dim * element;
}

BenchLayer::BenchLayer(Memory& memory, const LayerShape& shape, const BenchConfig& config,
                       Random& random, const FillUniform& fill_large)
    : inputs(memory, shape, config.act_dtype),
      cache(memory, shape, config.state_dtype, config.act_dtype),
      out(make_out(memory, shape, config.act_dtype)) {
  fill_benchmark_inputs(inputs, shape, config.act_dtype, random);
  fill_large(cache.state, -1.0, 1.0);
  if (is_scaled_checkpoint(config.state_dtype)) fill_large(cache.state_scale, 0.005, 0.01);
  if (config.baseline_state_dtype != config.state_dtype) {
    const Geometry& g = shape.geometry;
    baseline_state =
        Tensor(memory, config.baseline_state_dtype, {shape.slots, g.heads, g.head_dim, g.state_dim});
    fill_large(baseline_state, -1.0, 1.0);
  }
  for (Tensor* t : {&cache.x_cache, &cache.B_cache, &cache.dt_cache}) fill_large(*t, -1.0, 1.0);
}

BenchModel::BenchModel(Memory& memory, const BenchConfig& c, int64_t layer_count,
                       const FillUniform& fill_large)
    : config(c), cursors(memory, DType::kInt32, {c.batch}) {
  const LayerShape shape = layer_shape(c);
  Random random(kSeed);
  for (int64_t i = 0; i < layer_count; ++i)
    layers.push_back(std::make_unique<BenchLayer>(memory, shape, c, random, fill_large));
  std::vector<double> start_cursors(size_t(shape.slots));
  for (int64_t r = 0; r < shape.slots; ++r) start_cursors[size_t(r)] = double(r % c.buffer_len);
  cursors.write(start_cursors);
}

void BenchModel::baseline_step(const ExecOptions& options) const {
  for (const auto& layer : layers)
    selective_state_update(layer->baseline().view(), make_step(layer->inputs, layer->out), options);
}

void BenchModel::replay_step(const ExecOptions& options) const {
  for (const auto& layer : layers) {
    ReplayCache cache = make_cache(layer->cache);
    cache.cursors = cursors.view();
    replay_decode(cache, make_step(layer->inputs, layer->out), config.route, options);
  }
  replay_advance(cursors.view(), config.buffer_len, layers.front()->inputs.state_batch_indices.view(),
                 kPadSlot, options);
}

namespace {

ConfigTiming time_cpu_configuration(const BenchConfig& config) {
  const int64_t layer_state_bytes = state_bytes(config);

  ConfigTiming timing;
  timing.layers = std::clamp<int64_t>((cold_bytes() + layer_state_bytes - 1) / layer_state_bytes, 1, kMaxLayers);
  timing.rotated_state_bytes = timing.layers * layer_state_bytes;
  timing.cold_bytes = cold_bytes();
  const std::unique_ptr<Memory> host = make_host_memory();
  Random random(kSeed + 1);
  const BenchModel model(*host, config, timing.layers,
                         [&](Tensor& t, double lo, double hi) { t.fill_uniform(random, lo, hi); });

  ExecOptions options;
  options.backend = Backend::kCpu;
  auto time_window = [&](bool replay) {
    const Clock::time_point start = Clock::now();
    for (int64_t s = 0; s < config.buffer_len; ++s)
      replay ? model.replay_step(options) : model.baseline_step(options);
    return seconds_since(start);
  };
  // Where the baseline has no state of its own it overwrites the checkpoints ReplaySSM uses:
  // timing does not depend on the values, and both keep them bounded.
  time_alternating(timing, config.windows, double(config.buffer_len * timing.layers), time_window);
  return timing;
}

std::vector<Option> bench_options() {
  std::vector<Option> options = {{"--device", "cpu|cuda|auto", "device to time", "auto"}};
  for (const Option& o : geometry_options()) options.push_back(o);
  options.insert(options.end(), {
      {"--batch", "N[,N...]", "batch sizes", "1,8,64"},
      {"--L", "N[,N...]", "ReplaySSM buffer lengths, 1..64", "16"},
      {"--state-dtype", "T[,T...]",
       "state dtypes: fp32, fp16, bf16, int8, fp8 (e4m3; the 8-bit ones are ReplaySSM checkpoints "
       "only)", "fp32"},
      {"--baseline-state-dtype", "T",
       "the baseline's state dtype, for every state dtype: fp32, fp16, bf16 (default: the state "
       "dtype; bf16 for int8 and fp8)", ""},
      {"--act-dtype", "T[,T...]", "activation dtypes: fp32, fp16, bf16", "bf16"},
      {"--route", "R", "ReplaySSM route: auto, output-only, state-and-output", "auto"},
      window_kernel_option(),
      {"--windows", "N", "timed windows per configuration (the median is reported)", "5"},
      {"--json", "FILE", "also write every result and the machine's description to FILE", ""},
  });
  return options;
}

constexpr const char* kSummary =
    "Per configuration: the per-step time of the baseline (selective_state_update) and of\n"
    "ReplaySSM (replay_decode + replay_advance), each the median over windows of L steps\n"
    "(flushes included, rows desynchronised), the modelled bytes per step (method.md section 8,\n"
    "whole layer), the achieved GB/s and its share of the copy bandwidth measured in the same\n"
    "run, and the speedup. Layer copies are rotated so that every step reads its state (and on\n"
    "CUDA its history) from memory. With --spec T: speculative decoding instead (see\n"
    "'replayssm bench --spec 4 --help').";

// --baseline-state-dtype: selective_state_update keeps no 8-bit state.
DType parse_baseline_state_dtype(const std::string& flag, const std::string& text) {
  if (text == "int8" || text == "fp8")
    throw UsageError(flag + " " + text + ": 8-bit states are ReplaySSM checkpoints only; the "
                     "baseline's state is fp32, fp16 or bf16");
  return parse_dtype(flag, text);
}

struct Measurement {
  BenchConfig config;
  ConfigTiming timing;
  double baseline_bytes = 0, replay_bytes = 0;  // modelled, per step
};


void write_json(std::ostream& file, const std::string& command_line, DeviceType device,
                const CopyBandwidth& copy, const std::vector<Measurement>& results) {
  JsonWriter json(file);
  write_run_header(json, "replayssm bench", command_line, device, copy);
  json.key("method").begin_object()
      .key("step").string("baseline: selective_state_update per layer copy; replay: replay_decode "
                          "per layer copy, then one replay_advance per model step (shared cursors)")
      .key("window").string("L steps of every rotated layer copy, flushes included")
      .key("rows").string("desynchronised: row r starts at cursor r % L")
      .key("statistic").string("median window after one warm-up window; windows alternate")
      .key("byte_model").string("method.md section 8, per (row, head) times batch * H")
      .key("percent_basis").string("best copy bandwidth")
      .end_object();
  json.key("results").begin_array();
  for (const Measurement& r : results) {
    const Geometry& g = r.config.geometry;
    const int64_t steps_per_window = r.config.buffer_len * r.timing.layers;
    json.begin_object();
    json.key("geometry").begin_object()
        .key("name").string(g.name)
        .key("heads").integer(g.heads)
        .key("head_dim").integer(g.head_dim)
        .key("state_dim").integer(g.state_dim)
        .key("groups").integer(g.groups)
        .end_object();
    json.key("batch").integer(r.config.batch)
        .key("L").integer(r.config.buffer_len)
        .key("state_dtype").string(dtype_short_name(r.config.state_dtype))
        .key("baseline_state_dtype").string(dtype_short_name(r.config.baseline_state_dtype))
        .key("act_dtype").string(dtype_short_name(r.config.act_dtype))
        .key("route").string(route_name(r.config.route))
        .key("window_kernel").string(window_kernel_name(r.config.window_kernel))
        .key("layers").integer(r.timing.layers)
        .key("rotated_state_bytes").integer(r.timing.rotated_state_bytes)
        .key("cold_bytes").integer(r.timing.cold_bytes)
        .key("states_exceed_caches").boolean(r.timing.rotated_state_bytes >= r.timing.cold_bytes)
        .key("windows").integer(r.config.windows);
    json.key("baseline");
    write_timing(json, r.timing.baseline_step_s, r.baseline_bytes, r.timing.baseline_window_s,
               steps_per_window, copy);
    json.key("replay");
    write_timing(json, r.timing.replay_step_s, r.replay_bytes, r.timing.replay_window_s,
               steps_per_window, copy);
    json.key("speedup").number(r.timing.baseline_step_s / r.timing.replay_step_s);
    json.end_object();
  }
  json.end_array().end_object();
}

}  // namespace

void write_timing(JsonWriter& json, double step_s, double bytes, const std::vector<double>& windows,
                int64_t steps_per_window, const CopyBandwidth& copy) {
  std::vector<double> window_us;
  for (double w : windows) window_us.push_back(w * 1e6);
  json.begin_object()
      .key("us_per_step").number(step_s * 1e6)
      .key("modelled_bytes_per_step").number(bytes)
      .key("GBps").number(bytes / step_s / 1e9)
      .key("percent_of_copy_bandwidth").number(100 * bytes / step_s / copy.best_bytes_per_s)
      .key("steps_per_window").integer(steps_per_window)
      .key("window_us").numbers(window_us)
      .end_object();
}

void write_run_header(JsonWriter& json, const char* tool, const std::string& command_line,
                      DeviceType device, const CopyBandwidth& copy) {
  const MachineInfo m = machine_info();
  json.begin_object()
      .key("tool").string(tool)
      .key("date").string(utc_timestamp())
      .key("command_line").string(command_line)
      .key("device").string(device_name(device));
  json.key("machine").begin_object()
      .key("cpu_model").string(m.cpu_model)
      .key("hardware_threads").integer(m.hardware_threads)
      .key("backend_threads").integer(m.backend_threads)
      .key("last_level_cache_bytes").integer(m.last_level_cache_bytes)
      .key("memory_bytes").integer(m.memory_bytes)
      .key("built_with_cuda").boolean(m.built_with_cuda)
      .key("cuda_devices").integer(m.cuda_devices)
      .key("compiler").string(m.compiler)
      .end_object();
  json.key("copy_bandwidth").begin_object()
      .key("counts").string("bytes read + written")
      .key("buffer_bytes").integer(copy.buffer_bytes)
      .key("threads").integer(copy.threads)
      .key("repetitions").integer(copy.repetitions)
      .key("best_GBps").number(copy.best_bytes_per_s / 1e9)
      .key("median_GBps").number(copy.median_bytes_per_s / 1e9)
      .end_object();
}

CopyBandwidth measure_copy_bandwidth(DeviceType device) {
#if defined(REPLAYSSM_WITH_CUDA)
  if (device == DeviceType::kCuda) return measure_cuda_copy_bandwidth();
#else
  if (device == DeviceType::kCuda) no_cuda_timing();
#endif
  return measure_cpu_copy_bandwidth();
}

ConfigTiming time_configuration(const BenchConfig& config, DeviceType device) {
#if defined(REPLAYSSM_WITH_CUDA)
  if (device == DeviceType::kCuda) return time_cuda_configuration(config);
#else
  if (device == DeviceType::kCuda) no_cuda_timing();
#endif
  return time_cpu_configuration(config);
}

int run_bench(const std::vector<std::string>& argv, const std::string& command_line) {
  for (const std::string& arg : argv)
    if (arg == "--spec" || arg.rfind("--spec=", 0) == 0) return run_spec_bench(argv, command_line);
  const std::vector<Option> options = bench_options();
  const Args args(options, argv);
  if (args.help_requested()) {
    std::fputs(format_help("replayssm bench [options]", kSummary, options).c_str(), stdout);
    return 0;
  }
  const DeviceType device = parse_device("--device", args.get("--device"));
  const Geometry geometry = geometry_from_args(args);
  const std::vector<int64_t> batches = parse_int_list("--batch", args.get("--batch"), 1, 65536);
  const std::vector<int64_t> buffer_lens = parse_int_list("--L", args.get("--L"), 1, 64);
  const std::vector<DType> state_dtypes =
      parse_state_dtype_list("--state-dtype", args.get("--state-dtype"));
  std::optional<DType> baseline_dtype;  // unset: each state dtype's default
  if (args.given("--baseline-state-dtype"))
    baseline_dtype = parse_baseline_state_dtype("--baseline-state-dtype", args.get("--baseline-state-dtype"));
  const std::vector<DType> act_dtypes = parse_dtype_list("--act-dtype", args.get("--act-dtype"));
  const ReplayRoute route = parse_route("--route", args.get("--route"));
  const WindowKernel window_kernel = parse_window_kernel("--window-kernel", args.get("--window-kernel"), device);
  const int windows = int(parse_int("--windows", args.get("--windows"), 1, 1000));
  const std::string json_path = args.get("--json");
  std::ofstream json_file;
  if (!json_path.empty()) {
    json_file.open(json_path);  // now, so that a bad path fails before the measurements
    if (!json_file) throw UsageError("--json: cannot write '" + json_path + "'");
  }

  const CopyBandwidth copy = measure_copy_bandwidth(device);
  const MachineInfo machine = machine_info();
  std::printf("replayssm bench: %s, device %s (%s, %d threads), route %s, window kernel %s\n",
              geometry.describe().c_str(), device_name(device), machine.cpu_model.c_str(),
              machine.backend_threads, route_name(route), window_kernel_name(window_kernel));
  std::printf("copy bandwidth: %.1f GB/s best, %.1f GB/s median (%d copies of %" PRId64
              " MiB, %d threads, bytes read + written)\n",
              copy.best_bytes_per_s / 1e9, copy.median_bytes_per_s / 1e9, copy.repetitions,
              copy.buffer_bytes >> 20, copy.threads);
  std::printf("per layer per step, median of %d windows of L steps; %%copy = GB/s of the modelled "
              "bytes / best copy bandwidth\n\n",
              windows);
  std::printf("%-5s %-5s %-5s %6s %3s %6s | %11s %8s %7s %6s | %11s %8s %7s %6s | %7s\n", "state",
              "base", "act", "batch", "L", "layers", "base us", "base MB", "GB/s", "%copy",
              "replay us", "rep MB", "GB/s", "%copy", "speedup");

  std::vector<Measurement> results;
  for (const DType state : state_dtypes)
    for (const DType act : act_dtypes)
      for (const int64_t batch : batches)
        for (const int64_t L : buffer_lens) {
          Measurement m;
          const DType base = baseline_dtype.value_or(default_baseline_state_dtype(state));
          m.config = BenchConfig{geometry, batch, L, state, base, act, route, windows, window_kernel};
          m.timing = time_configuration(m.config, device);
          m.baseline_bytes = baseline_bytes_per_step(geometry, batch, base, act);
          m.replay_bytes = replay_bytes_per_step(geometry, batch, L, state, act);
          const double base_rate = m.baseline_bytes / m.timing.baseline_step_s;
          const double replay_rate = m.replay_bytes / m.timing.replay_step_s;
          std::printf("%-5s %-5s %-5s %6" PRId64 " %3" PRId64 " %6" PRId64
                      " | %11.1f %8.2f %7.1f %5.1f%% | %11.1f %8.2f %7.1f %5.1f%% | %6.2fx\n",
                      dtype_short_name(state), dtype_short_name(base), dtype_short_name(act), batch,
                      L, m.timing.layers, m.timing.baseline_step_s * 1e6, m.baseline_bytes / 1e6,
                      base_rate / 1e9, 100 * base_rate / copy.best_bytes_per_s,
                      m.timing.replay_step_s * 1e6, m.replay_bytes / 1e6, replay_rate / 1e9,
                      100 * replay_rate / copy.best_bytes_per_s,
                      m.timing.baseline_step_s / m.timing.replay_step_s);
          print_cache_note(m.timing);
          std::fflush(stdout);
          results.push_back(m);
        }
  if (!json_path.empty()) {
    write_json(json_file, command_line, device, copy, results);
    finish_json(json_file, json_path);
  }
  return 0;
}

}  // namespace replayssm::tool
