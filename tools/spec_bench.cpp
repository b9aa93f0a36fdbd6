// replayssm bench --spec T: per verify step time of the baseline speculative path and of
// ReplaySSM (spec_verify + spec_commit), their modelled bytes, GB/s against the copy bandwidth
// measured in the same run, the speedup, and the per-slot footprint of each.
#include "spec_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <stdexcept>

#include "args.hpp"
#include "byte_model.hpp"
#include "json.hpp"
#include "machine.hpp"
#include "replayssm/mamba2_spec.hpp"

namespace replayssm::tool {
namespace {

constexpr int64_t kMaxLayers = 4096;
constexpr uint64_t kSeed = 1;

using Clock = std::chrono::steady_clock;

int32_t draw_accepted(const AcceptanceModel& model, int64_t window, Random& random) {
  if (model.fixed) return int32_t(std::min<double>(model.value, double(window)));
  if (window == 1) return 1;
  const double p = (model.value - 1) / double(window - 1);
  int32_t k = 1;
  for (int64_t i = 1; i < window; ++i) k += random.uniform(0.0, 1.0) < p ? 1 : 0;
  return k;
}

// The ring rule of mamba2_spec.hpp on the host: (origin, committed) after a commit of k.
void commit_on_host(double* ring, int32_t k, const SpecBenchConfig& c, int64_t ring_len, bool* flushed) {
  *flushed = spec_flushes(int64_t(ring[1]), c.window, c.buffer_len);
  if (*flushed) {
    ring[0] = double((int64_t(ring[0]) + int64_t(ring[1])) % ring_len);
    ring[1] = 0;
  }
  ring[1] += k;
}

}  // namespace

std::string AcceptanceModel::describe() const {
  char text[32];
  std::snprintf(text, sizeof text, fixed ? "fixed:%g" : "mean:%g", value);
  return text;
}

AcceptanceModel parse_acceptance(const std::string& flag, const std::string& text) {
  AcceptanceModel m;
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  if (colon == std::string::npos || (kind != "fixed" && kind != "mean"))
    throw UsageError(flag + ": expected fixed:K or mean:M, got '" + text + "'");
  m.fixed = kind == "fixed";
  try {
    size_t used = 0;
    m.value = std::stod(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) throw std::invalid_argument(text);
  } catch (const std::exception&) {
    throw UsageError(flag + ": '" + text + "' has no number after the colon");
  }
  if (m.value < 1 || (m.fixed && m.value != std::floor(m.value)))
    throw UsageError(flag + ": " + text + " must accept at least 1 token (a whole number for fixed)");
  return m;
}

SpecPlan plan_spec(const SpecBenchConfig& c) {
  SpecPlan plan;
  const int64_t ring_len = spec_ring_len(c.buffer_len, c.window);
  plan.steps = c.buffer_len;
  Random random(kSeed);
  for (int64_t i = 0; i < plan.steps * c.batch; ++i)
    plan.accepted.push_back(draw_accepted(c.acceptance, c.window, random));
  // Rows start from where a random number of earlier steps left them: desynchronised flushes.
  plan.start_ring.assign(size_t(2 * c.batch), 0.0);
  for (int64_t r = 0; r < c.batch; ++r) {
    double* ring = &plan.start_ring[size_t(2 * r)];
    ring[0] = double(r % ring_len);
    const int64_t warm_up = int64_t(random.uniform(0.0, double(c.buffer_len)));
    bool flushed = false;
    for (int64_t s = 0; s < warm_up; ++s)
      commit_on_host(ring, draw_accepted(c.acceptance, c.window, random), c, ring_len, &flushed);
  }
  // f and w over the timed windows (one warm-up window, then c.windows), as the graphs replay them.
  std::vector<double> ring = plan.start_ring;
  double flushes = 0, history = 0;
  const int64_t repeats = c.windows + 1;
  for (int64_t w = 0; w < repeats; ++w)
    for (int64_t s = 0; s < plan.steps; ++s)
      for (int64_t r = 0; r < c.batch; ++r) {
        double* row = &ring[size_t(2 * r)];
        history += row[1];
        bool flushed = false;
        commit_on_host(row, int32_t(plan.accepted[size_t(s * c.batch + r)]), c, ring_len, &flushed);
        flushes += flushed ? 1 : 0;
      }
  const double visits = double(repeats * plan.steps * c.batch);
  plan.flushes_per_step = flushes / visits;
  plan.mean_history = history / visits;
  return plan;
}

SpecLayer::SpecLayer(Memory& memory, const SpecBenchConfig& c, Random& random, const FillUniform& fill_large)
    : x(memory, c.act_dtype, {c.batch, c.window, c.geometry.heads, c.geometry.head_dim}),
      z(memory, c.act_dtype, {c.batch, c.window, c.geometry.heads, c.geometry.head_dim}),
      out(memory, c.act_dtype, {c.batch, c.window, c.geometry.heads, c.geometry.head_dim}),
      baseline_out(memory, c.act_dtype, {c.batch, c.window, c.geometry.heads, c.geometry.head_dim}),
      dt(memory, c.act_dtype, {c.batch, c.window, c.geometry.heads}),
      B(memory, c.act_dtype, {c.batch, c.window, c.geometry.groups, c.geometry.state_dim}),
      C(memory, c.act_dtype, {c.batch, c.window, c.geometry.groups, c.geometry.state_dim}),
      A(memory, DType::kFloat32, {c.geometry.heads}),
      D(memory, DType::kFloat32, {c.geometry.heads}),
      dt_bias(memory, DType::kFloat32, {c.geometry.heads}),
      checkpoint(memory, c.state_dtype, {c.batch, c.geometry.heads, c.geometry.head_dim, c.geometry.state_dim}),
      x_cache(memory, c.act_dtype,
              {c.batch, c.geometry.heads, spec_ring_len(c.buffer_len, c.window), c.geometry.head_dim}),
      B_cache(memory, c.act_dtype,
              {c.batch, c.geometry.groups, spec_ring_len(c.buffer_len, c.window), c.geometry.state_dim}),
      dt_cache(memory, DType::kFloat32, {c.batch, c.geometry.heads, spec_ring_len(c.buffer_len, c.window)}),
      baseline_state(memory, c.state_dtype,
                     {c.batch * c.window, c.geometry.heads, c.geometry.head_dim, c.geometry.state_dim}) {
  // The magnitudes of a trained layer (workload.hpp): A in [-8, -0.5], softplus(dt + bias) ~ 0.05.
  A.fill_uniform(random, -8.0, -0.5);
  D.fill_uniform(random, -1.0, 1.0);
  dt_bias.fill_uniform(random, -4.0, -2.0);
  for (Tensor* t : {&x, &z, &B, &C, &dt}) t->fill_uniform(random, -1.0, 1.0);
  for (Tensor* t : {&x_cache, &B_cache, &dt_cache, &checkpoint, &baseline_state}) fill_large(*t, -1.0, 1.0);
}

SpecModel::SpecModel(Memory& memory, const SpecBenchConfig& c, const SpecPlan& plan, int64_t layer_count,
                     const FillUniform& fill_large)
    : config(c),
      steps(plan.steps),
      ring(memory, DType::kInt32, {c.batch, 2}),
      accepted(memory, DType::kInt32, {plan.steps, c.batch}),
      slots(memory, DType::kInt32, {c.batch}),
      baseline_slots(memory, DType::kInt32, {c.batch, c.window}) {
  Random random(kSeed);
  for (int64_t i = 0; i < layer_count; ++i)
    layers.push_back(std::make_unique<SpecLayer>(memory, c, random, fill_large));
  ring.write(plan.start_ring);
  accepted.write(plan.accepted);
  std::vector<double> ids(size_t(c.batch * c.window));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = double(i);
  baseline_slots.write(ids);
  ids.resize(size_t(c.batch));
  slots.write(ids);
}

TensorView SpecModel::accepted_at(int64_t s) const {
  TensorView v = accepted.view();
  v.rank = 1;
  v.shape[0] = config.batch;
  v.strides[0] = 1;
  v.data = static_cast<int32_t*>(v.data) + s * config.batch;
  return v;
}

Mamba2Window SpecModel::window(const SpecLayer& layer, bool baseline) const {
  Mamba2Window w;
  w.x = layer.x.view();
  w.dt = layer.dt.view();
  w.A = layer.A.view();
  w.B = layer.B.view();
  w.C = layer.C.view();
  w.D = layer.D.view();
  w.z = layer.z.view();
  w.dt_bias = layer.dt_bias.view();
  w.dt_softplus = true;
  w.state_batch_indices = baseline ? baseline_slots.view() : slots.view();
  w.pad_slot_id = kPadSlot;
  w.out = baseline ? layer.baseline_out.view() : layer.out.view();
  return w;
}

void SpecModel::replay_step(int64_t s, const ExecOptions& options) const {
  for (const auto& layer : layers) {
    const SpecCache cache{layer->checkpoint.view(), layer->x_cache.view(), layer->B_cache.view(),
                          layer->dt_cache.view(), ring.view()};
    spec_verify(cache, window(*layer, false), config.buffer_len, options);
  }
  spec_commit(ring.view(), accepted_at(s), config.window, config.buffer_len, slots.view(), kPadSlot, options);
}

void SpecModel::baseline_step(int64_t s, const ExecOptions& options) const {
  // The accepted counts of the previous step pick each row's source state.
  const TensorView previous = accepted_at((s + steps - 1) % steps);
  for (const auto& layer : layers)
    spec_state_update(layer->baseline_state.view(), window(*layer, true), previous, options);
}

int64_t spec_layer_state_bytes(const SpecBenchConfig& c) {
  const Geometry& g = c.geometry;
  return (1 + c.window) * c.batch * g.heads * g.head_dim * g.state_dim * dtype_size(c.state_dtype);
}

namespace {

ConfigTiming time_cpu_spec_configuration(const SpecBenchConfig& config) {
  ConfigTiming timing;
  const int64_t layer_bytes = spec_layer_state_bytes(config);
  timing.cold_bytes = cold_bytes();
  timing.layers = std::clamp<int64_t>((timing.cold_bytes + layer_bytes - 1) / layer_bytes, 1, kMaxLayers);
  timing.rotated_state_bytes = timing.layers * layer_bytes;
  const std::unique_ptr<Memory> host = make_host_memory();
  const SpecPlan plan = plan_spec(config);
  Random random(kSeed + 1);
  const SpecModel model(*host, config, plan, timing.layers,
                        [&](Tensor& t, double lo, double hi) { t.fill_uniform(random, lo, hi); });
  ExecOptions options;
  options.backend = Backend::kCpu;
  auto time_window = [&](bool replay) {
    const Clock::time_point start = Clock::now();
    for (int64_t s = 0; s < model.steps; ++s) replay ? model.replay_step(s, options) : model.baseline_step(s, options);
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  time_alternating(timing, config.windows, double(model.steps * timing.layers), time_window);
  return timing;
}

std::vector<Option> spec_options() {
  std::vector<Option> options = {{"--device", "cpu|cuda|auto", "device to time", "auto"}};
  for (const Option& o : geometry_options()) options.push_back(o);
  options.insert(options.end(), {
      {"--spec", "T[,T...]", "tokens per verify window, 1..8", ""},
      {"--accept", "fixed:K|mean:M",
       "accepted tokens per row and step (bonus included): K, or random with mean M", "fixed:8"},
      {"--batch", "N[,N...]", "batch sizes", "1,8,32,128,256,512"},
      {"--L", "N[,N...]", "ReplaySSM buffer lengths (committed history + one window), 2T..64", "16"},
      {"--state-dtype", "T[,T...]", "state dtypes: fp32, fp16, bf16", "fp32,bf16"},
      {"--act-dtype", "T[,T...]", "activation dtypes: fp32, fp16, bf16", "bf16"},
      window_kernel_option(),
      {"--windows", "N", "timed windows per configuration (the median is reported)", "5"},
      {"--json", "FILE", "also write every result and the machine's description to FILE", ""},
  });
  return options;
}

constexpr const char* kSummary =
    "Speculative decoding: per verify step of T tokens per row, the time of the baseline\n"
    "(spec_state_update: the tokens one by one, a state written per position, the accepted one\n"
    "kept in place) and of ReplaySSM (spec_verify per layer copy, then one spec_commit of the\n"
    "shared ring per model step), each the median over windows of L verify steps (rows\n"
    "desynchronised, flushes included); the modelled bytes (method.md section 8, f = flushes per\n"
    "verify step and w = mean committed history, from the ring rule under the acceptance model),\n"
    "GB/s and share of the copy bandwidth measured in the same run, the speedup, and the per-slot\n"
    "footprint relative to standard decode's one state. fixed:K above T accepts T.";

struct SpecMeasurement {
  SpecBenchConfig config;
  SpecPlan plan;
  ConfigTiming timing;
  double baseline_bytes = 0, replay_bytes = 0;
  double standard_slot = 0, baseline_slot = 0, replay_slot = 0;
};


void write_json(std::ostream& file, const std::string& command_line, DeviceType device,
                const CopyBandwidth& copy, const std::vector<SpecMeasurement>& results) {
  JsonWriter json(file);
  write_run_header(json, "replayssm bench --spec", command_line, device, copy);
  json.key("method").string(kSummary);
  json.key("results").begin_array();
  for (const SpecMeasurement& r : results) {
    const Geometry& g = r.config.geometry;
    json.begin_object();
    json.key("geometry").begin_object()
        .key("name").string(g.name)
        .key("heads").integer(g.heads)
        .key("head_dim").integer(g.head_dim)
        .key("state_dim").integer(g.state_dim)
        .key("groups").integer(g.groups)
        .end_object();
    json.key("batch").integer(r.config.batch)
        .key("T").integer(r.config.window)
        .key("L").integer(r.config.buffer_len)
        .key("R").integer(spec_ring_len(r.config.buffer_len, r.config.window))
        .key("state_dtype").string(dtype_short_name(r.config.state_dtype))
        .key("act_dtype").string(dtype_short_name(r.config.act_dtype))
        .key("accept").string(r.config.acceptance.describe())
        .key("window_kernel").string(window_kernel_name(r.config.window_kernel))
        .key("flushes_per_step").number(r.plan.flushes_per_step)
        .key("mean_history").number(r.plan.mean_history)
        .key("verify_steps_per_window").integer(r.plan.steps)
        .key("layers").integer(r.timing.layers)
        .key("rotated_state_bytes").integer(r.timing.rotated_state_bytes)
        .key("states_exceed_caches").boolean(r.timing.rotated_state_bytes >= r.timing.cold_bytes);
    json.key("baseline");
    write_timing(json, r.timing.baseline_step_s, r.baseline_bytes, r.timing.baseline_window_s,
                 r.plan.steps * r.timing.layers, copy);
    json.key("replay");
    write_timing(json, r.timing.replay_step_s, r.replay_bytes, r.timing.replay_window_s,
                 r.plan.steps * r.timing.layers, copy);
    json.key("speedup").number(r.timing.baseline_step_s / r.timing.replay_step_s);
    json.key("slot_bytes").begin_object()
        .key("standard_decode").number(r.standard_slot)
        .key("baseline_spec").number(r.baseline_slot)
        .key("replay_spec").number(r.replay_slot)
        .key("baseline_spec_ratio").number(r.baseline_slot / r.standard_slot)
        .key("replay_spec_ratio").number(r.replay_slot / r.standard_slot)
        .end_object();
    json.end_object();
  }
  json.end_array().end_object();
}

}  // namespace

ConfigTiming time_spec_configuration(const SpecBenchConfig& config, DeviceType device) {
  if (device == DeviceType::kCuda) {
#if defined(REPLAYSSM_WITH_CUDA)
    return time_cuda_spec_configuration(config);
#else
    throw std::runtime_error("bench --device cuda needs a CUDA build of replayssm; run bench with --device cpu");
#endif
  }
  return time_cpu_spec_configuration(config);
}

int run_spec_bench(const std::vector<std::string>& argv, const std::string& command_line) {
  const std::vector<Option> options = spec_options();
  const Args args(options, argv);
  if (args.help_requested()) {
    std::fputs(format_help("replayssm bench --spec T[,T...] [options]", kSummary, options).c_str(), stdout);
    return 0;
  }
  const DeviceType device = parse_device("--device", args.get("--device"));
  const Geometry geometry = geometry_from_args(args);
  const std::vector<int64_t> windows_T = parse_int_list("--spec", args.get("--spec"), 1, kMaxSpecWindow);
  const AcceptanceModel acceptance = parse_acceptance("--accept", args.get("--accept"));
  const std::vector<int64_t> batches = parse_int_list("--batch", args.get("--batch"), 1, 65536);
  const std::vector<int64_t> buffer_lens = parse_int_list("--L", args.get("--L"), 2, 64);
  const std::vector<DType> state_dtypes = parse_dtype_list("--state-dtype", args.get("--state-dtype"));
  const std::vector<DType> act_dtypes = parse_dtype_list("--act-dtype", args.get("--act-dtype"));
  const WindowKernel window_kernel = parse_window_kernel("--window-kernel", args.get("--window-kernel"), device);
  const int windows = int(parse_int("--windows", args.get("--windows"), 1, 1000));
  for (int64_t T : windows_T) {
    for (int64_t L : buffer_lens)
      if (L < 2 * T) throw UsageError("--L " + std::to_string(L) + " must be at least 2T = " + std::to_string(2 * T));
    if (!acceptance.fixed && acceptance.value > double(T))
      throw UsageError("--accept " + acceptance.describe() + ": the mean cannot exceed T = " + std::to_string(T));
  }
  const std::string json_path = args.get("--json");
  std::ofstream json_file;
  if (!json_path.empty()) {
    json_file.open(json_path);
    if (!json_file) throw UsageError("--json: cannot write '" + json_path + "'");
  }

  const CopyBandwidth copy = measure_copy_bandwidth(device);
  std::printf("replayssm bench --spec: %s, device %s, accept %s, window kernel %s\n",
              geometry.describe().c_str(), device_name(device), acceptance.describe().c_str(),
              window_kernel_name(window_kernel));
  std::printf("copy bandwidth: %.1f GB/s best (bytes read + written)\n", copy.best_bytes_per_s / 1e9);
  std::printf("per layer per verify step, median of %d windows; f = flushes per step, w = mean committed "
              "history; slot = per-slot bytes / standard decode's\n\n",
              windows);
  std::printf("%-5s %-5s %6s %2s %2s %5s %5s %6s | %10s %8s %6s | %10s %8s %6s | %7s | %5s %5s\n", "state",
              "act", "batch", "T", "L", "f", "w", "layers", "base us", "GB/s", "%copy", "replay us", "GB/s",
              "%copy", "speedup", "bslot", "rslot");
  std::vector<SpecMeasurement> results;
  for (const DType state : state_dtypes)
    for (const DType act : act_dtypes)
      for (const int64_t T : windows_T)
        for (const int64_t buffer_len : buffer_lens)
          for (const int64_t batch : batches) {
            SpecMeasurement m;
            m.config =
                SpecBenchConfig{geometry, batch, T, buffer_len, state, act, acceptance, windows, window_kernel};
            m.plan = plan_spec(m.config);
            m.timing = time_spec_configuration(m.config, device);
            m.baseline_bytes = baseline_spec_bytes_per_step(geometry, batch, T, state, act);
            m.replay_bytes = replay_spec_bytes_per_step(geometry, batch, T, m.plan.flushes_per_step,
                                                        m.plan.mean_history, state, act);
            m.standard_slot = standard_slot_bytes(geometry, state);
            m.baseline_slot = baseline_spec_slot_bytes(geometry, T, state);
            m.replay_slot = replay_spec_slot_bytes(geometry, spec_ring_len(buffer_len, T), state, act);
            const double base_rate = m.baseline_bytes / m.timing.baseline_step_s;
            const double replay_rate = m.replay_bytes / m.timing.replay_step_s;
            std::printf("%-5s %-5s %6" PRId64 " %2" PRId64 " %2" PRId64 " %5.2f %5.1f %6" PRId64
                        " | %10.1f %8.1f %5.1f%% | %10.1f %8.1f %5.1f%% | %6.2fx | %4.2fx %4.2fx\n",
                        dtype_short_name(state), dtype_short_name(act), batch, T, buffer_len, m.plan.flushes_per_step,
                        m.plan.mean_history, m.timing.layers, m.timing.baseline_step_s * 1e6, base_rate / 1e9,
                        100 * base_rate / copy.best_bytes_per_s, m.timing.replay_step_s * 1e6, replay_rate / 1e9,
                        100 * replay_rate / copy.best_bytes_per_s, m.timing.baseline_step_s / m.timing.replay_step_s,
                        m.baseline_slot / m.standard_slot, m.replay_slot / m.standard_slot);
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
