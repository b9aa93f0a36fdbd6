// replayssm precision: how the error of a low-precision state evolves over a long rollout. The
// baseline (state rounded every step) and ReplaySSM (replay_decode + replay_advance, checkpoint
// rounded at each flush, to nearest or stochastically) run in lockstep on the CPU backend with the
// fp64 oracle (selective_state_update on the reference backend with a float64 state), fed the same
// inputs, from the same zero state. Every row starts at cursor 0, so all rows flush together. The
// baseline is selective_state_update; for the 8-bit formats, which it does not store, it is
// replay_decode with L = 1, which stores the state in the format at every step.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "args.hpp"
#include "byte_model.hpp"
#include "commands.hpp"
#include "geometry.hpp"
#include "json.hpp"
#include "machine.hpp"
#include "workload.hpp"

namespace replayssm::tool {
namespace {

constexpr int64_t kPointsPerCurve = 256;
constexpr int64_t kByteModelBatch = 128;
constexpr double kLateFraction = 0.1;  // "late mean": the mean over the last 10% of the steps

std::vector<Option> precision_options() {
  std::vector<Option> options = geometry_options();
  options.insert(options.end(), {
      {"--steps", "N", "decode steps", "8192"},
      {"--rows", "N", "batch rows, each with its own state", "1"},
      {"--L", "N,...", "ReplaySSM buffer lengths, 1..64", "4,8,16,32"},
      {"--state-dtype", "LIST", "state (checkpoint) dtypes, of fp32, fp16, bf16, int8, fp8 (e4m3)",
       "fp32,fp16,bf16,int8,fp8"},
      {"--rounding", "LIST", "ReplaySSM flush rounding, of nearest, stochastic (not for fp32)",
       "nearest,stochastic"},
      {"--act-dtype", "fp32|fp16|bf16", "activation dtype of x, dt, B, C and out", "bf16"},
      {"--seed", "S", "seed of every random value", "1"},
      {"--every", "K", "record every K-th step in the JSON", "steps / 256"},
      {"--json", "FILE", "write the curves and the summary as JSON", ""},
  });
  return options;
}

constexpr const char* kSummary =
    "Runs the baseline (state rounded to its dtype every step) and ReplaySSM (checkpoint rounded\n"
    "at each flush, every L steps, to nearest or stochastically) in lockstep with the fp64 oracle\n"
    "on the CPU backend, with fresh random inputs every step, and reports the error of each over\n"
    "time. The 8-bit baselines are replay_decode with L = 1 (the state stored every step).\n"
    "  out:   max |y - y_oracle| / max |y_oracle| over all rows at one step (y includes its\n"
    "         rounding to the activation dtype, so it has a floor of about half an ulp of it);\n"
    "  state: max |S - S_oracle| / max |S_oracle|, every step for the baseline and right after\n"
    "         each flush for ReplaySSM (its state only exists then); also within the worst\n"
    "         (row, head), as the global maximum is set by the heads with the largest states.\n"
    "Inputs: A = -U[1, 16]; dt_bias = softplus^-1 of a log-uniform dt in [1e-3, 1e-1] per head;\n"
    "raw dt, x, B, C ~ N(0, 1); D = U[0.5, 1.5]; no z; dt_softplus on.";

enum class ModeKind { kBaseline, kReplay };

// One state precision scheme under study, with its own state, caches and out.
struct Mode {
  Mode(ModeKind kind, DType state_dtype, int64_t buffer_len, bool stochastic, Memory& memory,
       const LayerShape& layer, DType act_dtype)
      : kind(kind),
        state_dtype(state_dtype),
        buffer_len(buffer_len),
        stochastic(stochastic),
        cache(memory, with_buffer_len(layer, buffer_len), state_dtype, act_dtype),
        out(make_out(memory, layer, act_dtype)) {}

  static LayerShape with_buffer_len(LayerShape layer, int64_t buffer_len) {
    layer.buffer_len = buffer_len;
    return layer;
  }

  std::string name() const {
    const std::string dtype = dtype_short_name(state_dtype);
    return kind == ModeKind::kBaseline
               ? "baseline " + dtype
               : "replay " + dtype + " L=" + std::to_string(buffer_len) + (stochastic ? " SR" : "");
  }

  ModeKind kind;
  DType state_dtype;
  int64_t buffer_len;  // 1 for the baseline
  bool stochastic;     // stochastic rounding at flush
  SlotCache cache;
  Tensor out;

  std::vector<double> out_error;         // (steps)
  std::vector<int64_t> state_steps;       // the steps at which the state was compared
  std::vector<double> state_error;        // (state_steps)
  std::vector<double> head_state_error;   // (state_steps): in the worst (row, head)
  double bytes_per_step = 0;              // modelled, at kByteModelBatch rows
};

// Normal(0, 1) by the Box-Muller transform.
std::vector<double> normal_values(Random& random, int64_t count) {
  std::vector<double> values(static_cast<size_t>(count));
  for (double& v : values) {
    const double u1 = 1.0 - random.uniform(0.0, 1.0);  // (0, 1]
    const double u2 = random.uniform(0.0, 1.0);
    v = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  return values;
}

// Mamba-2 initialisation ranges: A in [-16, -1]; softplus(dt_bias) log-uniform in [1e-3, 1e-1].
ParameterValues study_parameters(const Geometry& g, Random& random) {
  ParameterValues p;
  for (int64_t h = 0; h < g.heads; ++h) {
    p.A.push_back(-random.uniform(1.0, 16.0));
    p.D.push_back(random.uniform(0.5, 1.5));
    const double dt = std::exp(random.uniform(std::log(1e-3), std::log(1e-1)));
    p.dt_bias.push_back(std::log(std::expm1(dt)));  // the inverse of softplus
  }
  p.A = round_to(p.A, DType::kFloat32);
  p.D = round_to(p.D, DType::kFloat32);
  p.dt_bias = round_to(p.dt_bias, DType::kFloat32);
  return p;
}

ActivationValues study_activations(const LayerShape& layer, DType act, Random& random) {
  const Geometry& g = layer.geometry;
  const int64_t rows = layer.batch;
  ActivationValues a;
  a.x = round_to(normal_values(random, rows * g.heads * g.head_dim), act);
  a.dt = round_to(normal_values(random, rows * g.heads), act);
  a.B = round_to(normal_values(random, rows * g.groups * g.state_dim), act);
  a.C = round_to(normal_values(random, rows * g.groups * g.state_dim), act);
  return a;
}

// The step of a mode without z (write_activations leaves z unused when its values are empty).
Mamba2Step study_step(const StepInputs& inputs, const Tensor& out) {
  Mamba2Step step = make_step(inputs, out);
  step.z = TensorView{};
  return step;
}

// Accumulates max |got - expected| and max |expected|; NaN counts as an infinite error.
struct RelativeError {
  double max_error = 0, max_expected = 0;
  void add(double got, double expected) {
    const double error = std::fabs(got - expected);
    if (!(error <= max_error)) max_error = std::isnan(error) ? INFINITY : error;
    max_expected = std::max(max_expected, std::fabs(expected));
  }
  double value() const { return max_expected > 0 ? max_error / max_expected : max_error; }
};

double relative_error(const std::vector<double>& got, const std::vector<double>& expected) {
  RelativeError e;
  for (size_t i = 0; i < got.size(); ++i) e.add(got[i], expected[i]);
  return e.value();
}

// The state error over the whole state, and in the worst (row, head): the global maximum is set by
// the heads with the largest states, the per-head one also shows the heads with small states.
struct StateError {
  double global = 0, worst_head = 0;
};

// `decode(i)` is element i of the state as a double.
template <typename Decode>
StateError compare_state(Decode decode, const double* expected, int64_t count, int64_t head_elems) {
  RelativeError all;
  StateError result;
  for (int64_t first = 0; first < count; first += head_elems) {
    RelativeError head;
    for (int64_t i = first; i < first + head_elems; ++i) head.add(decode(i), expected[i]);
    all.max_error = std::max(all.max_error, head.max_error);
    all.max_expected = std::max(all.max_expected, head.max_expected);
    result.worst_head = std::max(result.worst_head, head.value());
  }
  result.global = all.value();
  return result;
}

// A host state against the oracle's, read in place: the states are large and compared at every
// step. fp16 is decoded through a table of all 65536 values, as fp16_to_float branches per element.
StateError state_error(const SlotCache& cache, const Tensor& oracle_state, int64_t head_elems,
                       int64_t state_dim) {
  const Tensor& state = cache.state;
  const void* data = state.view().data;                                          // (slots, H, P, N)
  const auto* expected = static_cast<const double*>(oracle_state.view().data);  // (slots, H, P, N)
  const auto* scale = static_cast<const float*>(cache.state_scale.view().data);  // (slots, H, P)
  const int64_t count = state.numel();
  switch (state.view().dtype) {
    case DType::kInt8: {
      const auto* got = static_cast<const int8_t*>(data);
      return compare_state([=](int64_t i) { return double(scale[i / state_dim]) * got[i]; }, expected,
                           count, head_elems);
    }
    case DType::kFloat8E4M3: {
      const auto* got = static_cast<const Float8E4M3*>(data);
      return compare_state([=](int64_t i) { return double(scale[i / state_dim]) * to_float(got[i]); },
                           expected, count, head_elems);
    }
    case DType::kFloat32: {
      const auto* got = static_cast<const float*>(data);
      return compare_state([got](int64_t i) { return double(got[i]); }, expected, count, head_elems);
    }
    case DType::kFloat16: {
      static const std::vector<float> table = [] {
        std::vector<float> values(size_t(1) << 16);
        for (size_t bits = 0; bits < values.size(); ++bits)
          values[bits] = fp16_to_float(uint16_t(bits));
        return values;
      }();
      const auto* got = static_cast<const Half*>(data);
      return compare_state([got](int64_t i) { return double(table[got[i].bits]); }, expected,
                           count, head_elems);
    }
    case DType::kBFloat16: {
      const auto* got = static_cast<const BFloat16*>(data);
      return compare_state([got](int64_t i) { return double(to_float(got[i])); }, expected, count,
                           head_elems);
    }
    default: throw std::logic_error("state_error: unsupported state dtype");
  }
}

// The first step of the last 10% of a run of `steps` steps.
int64_t late_start(int64_t steps) {
  return steps - std::max<int64_t>(1, int64_t(kLateFraction * double(steps)));
}

struct Summary {
  double final_value = 0, max_value = 0, late_mean = 0;
};

// `values` measured at `steps`; the late mean covers the values at steps >= late_first_step.
Summary summarize(const std::vector<double>& values, const std::vector<int64_t>& steps,
                  int64_t late_first_step) {
  Summary s;
  if (values.empty()) return s;
  s.final_value = values.back();
  double late_sum = 0;
  int64_t late_count = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    s.max_value = std::max(s.max_value, values[i]);
    if (steps[i] < late_first_step) continue;
    late_sum += values[i];
    ++late_count;
  }
  s.late_mean = late_count ? late_sum / double(late_count) : values.back();
  return s;
}

// The indices of the points kept in the JSON: the first point at or after each multiple of every.
std::vector<size_t> recorded_points(const std::vector<int64_t>& steps, int64_t every) {
  std::vector<size_t> kept;
  int64_t next = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i] < next && i + 1 != steps.size()) continue;
    kept.push_back(i);
    next = (steps[i] / every + 1) * every;
  }
  return kept;
}

void write_curve(JsonWriter& json, const std::vector<double>& values,
                 const std::vector<int64_t>& steps, int64_t every, int64_t late_first_step) {
  std::vector<double> kept_steps, kept_values;
  for (size_t i : recorded_points(steps, every)) {
    kept_steps.push_back(double(steps[i]));
    kept_values.push_back(values[i]);
  }
  const Summary s = summarize(values, steps, late_first_step);
  json.begin_object()
      .key("final").number(s.final_value)
      .key("max").number(s.max_value)
      .key("late_mean").number(s.late_mean)
      .key("steps").numbers(kept_steps)
      .key("values").numbers(kept_values)
      .end_object();
}

struct StudyConfig {
  std::string command_line;
  LayerShape layer;
  int64_t steps = 0, every = 0;
  DType act_dtype = DType::kBFloat16;
  uint64_t seed = 0;
  double run_seconds = 0;
};

void write_json(std::ostream& file, const StudyConfig& c, const std::vector<Mode>& modes,
                const std::vector<int64_t>& all_steps) {
  const Geometry& g = c.layer.geometry;
  const int64_t late = late_start(c.steps);
  JsonWriter json(file);
  json.begin_object()
      .key("tool").string("replayssm precision")
      .key("date").string(utc_timestamp())
      .key("command_line").string(c.command_line)
      .key("run_seconds").number(c.run_seconds);
  json.key("geometry").begin_object()
      .key("name").string(g.name)
      .key("heads").integer(g.heads)
      .key("head_dim").integer(g.head_dim)
      .key("state_dim").integer(g.state_dim)
      .key("groups").integer(g.groups)
      .end_object();
  json.key("rows").integer(c.layer.batch)
      .key("steps").integer(c.steps)
      .key("every").integer(c.every)
      .key("act_dtype").string(dtype_short_name(c.act_dtype))
      .key("seed").integer(int64_t(c.seed));
  json.key("method").begin_object()
      .key("oracle").string("selective_state_update, reference backend, float64 state, fp32 "
                            "copies of the same rounded activations")
      .key("backend").string("cpu")
      .key("initial_state").string("zeros")
      .key("inputs").string("A = -U[1,16]; dt_bias = softplus^-1(dt), dt log-uniform in "
                            "[1e-3, 1e-1]; raw dt, x, B, C ~ N(0,1); D = U[0.5,1.5]; no z; "
                            "dt_softplus on; fresh every step")
      .key("out_error").string("max |y - y_oracle| / max |y_oracle| over all rows at one step, y "
                               "rounded to act_dtype")
      .key("state_error").string("max |S - S_oracle| / max |S_oracle| over all rows; baseline "
                                 "every step, replay right after each flush")
      .key("state_worst_head").string("max over (row, head) of max |S - S_oracle| / max "
                                      "|S_oracle| within that head")
      .key("late_mean").string("mean over the points at steps >= steps - steps / 10")
      .key("bytes_per_step").string("tools/byte_model, batch 128, per layer per step")
      .end_object();
  json.key("modes").begin_array();
  for (const Mode& m : modes) {
    json.begin_object()
        .key("name").string(m.name())
        .key("kind").string(m.kind == ModeKind::kBaseline ? "baseline" : "replay")
        .key("state_dtype").string(dtype_short_name(m.state_dtype))
        .key("L").integer(m.buffer_len)
        .key("stochastic_rounding").boolean(m.stochastic)
        .key("bytes_per_step").number(m.bytes_per_step);
    json.key("out");
    write_curve(json, m.out_error, all_steps, c.every, late);
    json.key("state");
    write_curve(json, m.state_error, m.state_steps, c.every, late);
    json.key("state_worst_head");
    write_curve(json, m.head_state_error, m.state_steps, c.every, late);
    json.end_object();
  }
  json.end_array().end_object();
}

void run_mode_step(Mode& mode, const StepInputs& inputs) {
  const Mamba2Step step = study_step(inputs, mode.out);
  ExecOptions options;
  options.backend = Backend::kCpu;
  // The 8-bit baseline: replay with L = 1 stores the state in the format at every step.
  if (mode.kind == ModeKind::kReplay || is_scaled_checkpoint(mode.state_dtype)) {
    replay_decode(make_cache(mode.cache, mode.stochastic), step, ReplayRoute::kAuto, options);
    replay_advance(mode.cache.cursors.view(), mode.buffer_len, step.state_batch_indices, kPadSlot,
                   options);
  } else {
    selective_state_update(mode.cache.state.view(), step, options);
  }
}

}  // namespace

int run_precision(const std::vector<std::string>& argv, const std::string& command_line) {
  const std::vector<Option> options = precision_options();
  const Args args(options, argv);
  if (args.help_requested()) {
    std::fputs(format_help("replayssm precision [options]", kSummary, options).c_str(), stdout);
    return 0;
  }
  StudyConfig config;
  config.command_line = command_line;
  config.layer.geometry = geometry_from_args(args);
  config.layer.batch = parse_int("--rows", args.get("--rows"), 1, 4096);
  config.layer.slots = config.layer.batch;
  config.steps = parse_int("--steps", args.get("--steps"), 1, 10000000);
  config.every = args.given("--every")
                     ? parse_int("--every", args.get("--every"), 1, 10000000)
                     : std::max<int64_t>(1, config.steps / kPointsPerCurve);
  const std::vector<int64_t> buffer_lens = parse_int_list("--L", args.get("--L"), 1, 64);
  const std::vector<DType> state_dtypes =
      parse_state_dtype_list("--state-dtype", args.get("--state-dtype"));
  const std::vector<bool> roundings = parse_rounding_list("--rounding", args.get("--rounding"));
  config.act_dtype = parse_dtype("--act-dtype", args.get("--act-dtype"));
  config.seed = uint64_t(parse_int("--seed", args.get("--seed"), 0, INT64_MAX));
  const std::string json_path = args.get("--json");
  std::ofstream json_file;
  if (!json_path.empty()) {
    json_file.open(json_path);  // now, so that a bad path fails before the run
    if (!json_file) throw UsageError("--json: cannot write '" + json_path + "'");
  }

  const LayerShape& layer = config.layer;
  const Geometry& g = layer.geometry;
  const DType act = config.act_dtype;
  const std::unique_ptr<Memory> host = make_host_memory();

  // The modes read the activations in their dtype; the oracle reads exact fp32 copies of the same
  // rounded values, so that only the state precision differs.
  StepInputs inputs(*host, layer, act);
  StepInputs oracle_inputs(*host, layer, DType::kFloat32);
  Random random(config.seed);
  const ParameterValues parameters = study_parameters(g, random);
  write_parameters(inputs, parameters);
  write_parameters(oracle_inputs, parameters);
  std::vector<double> row_slots(size_t(layer.batch));
  for (int64_t r = 0; r < layer.batch; ++r) row_slots[size_t(r)] = double(r);
  inputs.state_batch_indices.write(row_slots);
  oracle_inputs.state_batch_indices.write(row_slots);

  Tensor oracle_state(*host, DType::kFloat64, {layer.slots, g.heads, g.head_dim, g.state_dim});
  Tensor oracle_out = make_out(*host, layer, DType::kFloat32);

  std::vector<Mode> modes;
  modes.reserve(state_dtypes.size() * (1 + buffer_lens.size() * roundings.size()));
  for (const DType dtype : state_dtypes) {
    modes.emplace_back(ModeKind::kBaseline, dtype, 1, false, *host, layer, act);
    modes.back().bytes_per_step = baseline_bytes_per_step(g, kByteModelBatch, dtype, act);
  }
  for (const DType dtype : state_dtypes)
    for (const bool stochastic : roundings) {
      if (stochastic && dtype == DType::kFloat32) continue;  // nothing to round
      for (const int64_t L : buffer_lens) {
        modes.emplace_back(ModeKind::kReplay, dtype, L, stochastic, *host, layer, act);
        modes.back().bytes_per_step = replay_bytes_per_step(g, kByteModelBatch, L, dtype, act);
        // One key per mode: the seed, and the mode's index.
        modes.back().cache.rounding_seed.write({double(config.seed % 0x7fffffff), double(modes.size())});
      }
    }

  std::printf("replayssm precision: %s, rows %" PRId64 ", %" PRId64 " steps, act %s, seed %" PRIu64
              ", cpu backend\n",
              g.describe().c_str(), layer.batch, config.steps, dtype_short_name(act), config.seed);
  std::printf("  oracle: selective_state_update, reference backend, float64 state; all states start "
              "at zero\n");
  std::fflush(stdout);

  const auto start = std::chrono::steady_clock::now();
  std::vector<int64_t> all_steps;
  ExecOptions oracle_options;
  oracle_options.backend = Backend::kReference;
  for (int64_t k = 0; k < config.steps; ++k) {
    const ActivationValues activations = study_activations(layer, act, random);
    write_activations(inputs, activations);
    write_activations(oracle_inputs, activations);
    selective_state_update(oracle_state.view(), study_step(oracle_inputs, oracle_out),
                           oracle_options);
    const std::vector<double> expected_out = oracle_out.read();
    all_steps.push_back(k);
    // Every row starts at cursor 0, so after step k all rows have flushed iff (k + 1) % L == 0.
    for (Mode& m : modes) {
      run_mode_step(m, inputs);
      m.out_error.push_back(relative_error(m.out.read(), expected_out));
      if ((k + 1) % m.buffer_len != 0) continue;
      m.state_steps.push_back(k);
      const StateError e = state_error(m.cache, oracle_state, g.head_dim * g.state_dim, g.state_dim);
      m.state_error.push_back(e.global);
      m.head_state_error.push_back(e.worst_head);
    }
    if ((k + 1) % std::max<int64_t>(1, config.steps / 8) == 0) {
      std::printf("  step %" PRId64 " / %" PRId64 "\n", k + 1, config.steps);
      std::fflush(stdout);
    }
  }
  config.run_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const int64_t late = late_start(config.steps);
  std::printf("\n%-21s | %8s %8s %8s | %8s %8s %8s | %8s %8s %8s | %7s\n", "mode", "out end",
              "out max", "out late", "st end", "st max", "st late", "head end", "head max",
              "headlate", "MB/step");
  for (const Mode& m : modes) {
    const Summary out = summarize(m.out_error, all_steps, late);
    const Summary state = summarize(m.state_error, m.state_steps, late);
    const Summary head = summarize(m.head_state_error, m.state_steps, late);
    std::printf("%-21s | %8.2e %8.2e %8.2e | %8.2e %8.2e %8.2e | %8.2e %8.2e %8.2e | %7.1f\n",
                m.name().c_str(), out.final_value, out.max_value, out.late_mean, state.final_value,
                state.max_value, state.late_mean, head.final_value, head.max_value, head.late_mean,
                m.bytes_per_step / 1e6);
  }
  std::printf(
      "\nout: max |y - y_oracle| / max |y_oracle| per step (y rounded to %s); st: max |S - "
      "S_oracle| / max |S_oracle|,\nevery step (baseline) or after each flush (replay); head: the "
      "same within the worst (row, head).\nend = last step, max = over the run, late = mean over "
      "the last 10%% of steps. MB/step: modelled\nbytes of one layer step at batch %" PRId64
      ".\nrun time %.1f s\n",
      dtype_short_name(act), kByteModelBatch, config.run_seconds);
  if (!json_path.empty()) {
    write_json(json_file, config, modes, all_steps);
    json_file.close();
    if (!json_file) throw std::runtime_error("writing '" + json_path + "' failed");
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace replayssm::tool
