// replayssm verify: runs the baseline and both ReplaySSM routes over a multi-step rollout, in
// lockstep with the fp64 oracle (selective_state_update on the reference backend with a float64
// state), and checks every output and every checkpoint written by a flush.
//
// Rows are desynchronised: row r joins the rollout (until then its state_batch_indices entry is the
// pad slot) so that every row reaches a different cursor when the last one joins. Rows map to a
// shuffled set of slots, two more than the batch.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "error_stats.hpp"
#include "geometry.hpp"
#include "workload.hpp"

namespace replayssm::tool {
namespace {

constexpr double kFp32Limit = 1e-5;
constexpr double kLowPrecisionFloor = 1e-5;  // absolute slack of the 2x rule
constexpr double kInfinity = std::numeric_limits<double>::infinity();

std::vector<Option> verify_options() {
  std::vector<Option> options = geometry_options();
  options.insert(options.end(), {
      {"--batch", "N", "batch rows", "4"},
      {"--steps", "N", "decode steps after the last row has joined", "3 L"},
      {"--L", "N", "ReplaySSM buffer length, 1..64", "16"},
      {"--state-dtype", "fp32|fp16|bf16", "state (checkpoint) dtype", "fp32"},
      {"--act-dtype", "fp32|fp16|bf16", "activation dtype of x, dt, B, C, z and out", "bf16"},
      {"--device", "cpu|cuda|auto", "backend of the checked paths", "auto"},
      {"--seed", "S", "seed of every random value", "1"},
  });
  return options;
}

constexpr const char* kSummary =
    "Runs the baseline (selective_state_update) and ReplaySSM (replay_decode + replay_advance,\n"
    "routes output-only and state-and-output) over a rollout that crosses several flushes, with\n"
    "rows at different buffer positions, and compares them with the fp64 oracle.\n"
    "fp32 state: PASS when the output and checkpoint errors are <= 1e-5. 16-bit state: the\n"
    "baseline must stay within 2x the error of the reference backend with the same state dtype,\n"
    "and ReplaySSM within 2x the baseline's, plus 1e-5. Exit code 0 iff every path passes.\n"
    "With --spec T: speculative decoding instead (see 'replayssm verify --spec 4 --help').";

enum class PathKind { kBaseline, kReplay, kReference };

// One implementation under check, with its own state, caches and out.
struct Path {
  Path(std::string name, PathKind kind, ReplayRoute route, Backend backend, const StepInputs& inputs,
       Memory& memory, const LayerShape& shape, DType state_dtype, DType act_dtype)
      : name(std::move(name)),
        kind(kind),
        route(route),
        backend(backend),
        inputs(&inputs),
        out_dtype(act_dtype),
        cache(memory, shape, state_dtype, act_dtype),
        out(make_out(memory, shape, act_dtype)) {}

  std::string name;
  PathKind kind;
  ReplayRoute route;
  Backend backend;
  const StepInputs* inputs;  // the activation-dtype inputs, or the oracle's fp32 copies
  DType out_dtype;
  SlotCache cache;
  Tensor out;

  ErrorStat out_error;      // beyond the rounding of out
  ErrorStat out_raw_error;  // including it
  ErrorStat state_error;    // after each flush
  int64_t pad_rows_written = 0;
  int64_t cursor_mismatches = 0;
  double out_limit = kInfinity, state_limit = kInfinity;
};

void run_step(Path& path, int64_t buffer_len) {
  const Mamba2Step step = make_step(*path.inputs, path.out);
  ExecOptions options;
  options.backend = path.backend;
  if (path.kind == PathKind::kReplay) {
    replay_decode(make_cache(path.cache), step, path.route, options);
    replay_advance(path.cache.cursors.view(), buffer_len, step.state_batch_indices, kPadSlot, options);
  } else {
    selective_state_update(path.cache.state.view(), step, options);
  }
}

// Which slot each row uses, and when it joins.
struct Rollout {
  LayerShape shape;
  std::vector<int64_t> slot_of_row;   // (batch)
  std::vector<int64_t> start_cursor;  // (batch): cursor of each row when the last one joins
  int64_t join_steps() const { return shape.buffer_len - 1; }
  int64_t join_step(int64_t row) const { return join_steps() - start_cursor[size_t(row)]; }
};

// A shuffled, non-identity row -> slot map over batch + 2 slots, and cursors spread over [0, L).
Rollout plan_rollout(const LayerShape& shape_in, Random& random) {
  Rollout r;
  r.shape = shape_in;
  const int64_t batch = r.shape.batch, L = r.shape.buffer_len;
  r.shape.slots = batch + 2;
  std::vector<int64_t> slots(size_t(r.shape.slots));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = int64_t(i);
  for (size_t i = slots.size() - 1; i > 0; --i) std::swap(slots[i], slots[random.next() % (i + 1)]);
  r.slot_of_row.assign(slots.begin(), slots.begin() + batch);
  bool identity = true;
  for (int64_t row = 0; row < batch; ++row) identity = identity && r.slot_of_row[size_t(row)] == row;
  if (identity) std::reverse(r.slot_of_row.begin(), r.slot_of_row.end());
  if (identity && batch == 1) r.slot_of_row[0] = 1;
  // Row 0 flushes on the first step after the join; the others are spread over the window.
  const int64_t spacing = std::max<int64_t>(1, L / batch);
  for (int64_t row = 0; row < batch; ++row) r.start_cursor.push_back((L - 1 + row * spacing) % L);
  return r;
}

// Compares out of every active row with the oracle's; pad rows must keep their NaN poison.
void check_out(Path& path, const std::vector<double>& oracle_out,
               const std::vector<int64_t>& row_slots, int64_t row_elems) {
  const std::vector<double> out = path.out.read();
  for (size_t row = 0; row < row_slots.size(); ++row) {
    const size_t first = row * size_t(row_elems);
    if (row_slots[row] == kPadSlot) {
      for (size_t i = first; i < first + size_t(row_elems); ++i)
        if (!std::isnan(out[i])) {
          ++path.pad_rows_written;
          break;
        }
      continue;
    }
    for (size_t i = first; i < first + size_t(row_elems); ++i) {
      const double raw = std::isnan(out[i]) ? kInfinity : std::fabs(out[i] - oracle_out[i]);
      path.out_raw_error.add(raw, oracle_out[i]);
      path.out_error.add(rounding_excess(out[i], oracle_out[i], path.out_dtype), oracle_out[i]);
    }
  }
}

void check_state(Path& path, int64_t slot, const std::vector<double>& oracle_state) {
  const int64_t elems = int64_t(oracle_state.size());
  const std::vector<double> state = path.cache.state.read(slot * elems, elems);
  for (size_t i = 0; i < state.size(); ++i)
    path.state_error.add(std::fabs(state[i] - oracle_state[i]), oracle_state[i]);
}

// fp32 state: a fixed limit. 16-bit state: the 2x rule, the baseline against the reference
// backend with the same state dtype and ReplaySSM against the baseline.
void set_limits(std::vector<Path>& paths, DType state_dtype) {
  const Path* baseline = nullptr;
  const Path* reference = nullptr;
  for (const Path& p : paths) {
    if (p.kind == PathKind::kBaseline) baseline = &p;
    if (p.kind == PathKind::kReference) reference = &p;
  }
  for (Path& p : paths) {
    if (state_dtype == DType::kFloat32) {
      p.out_limit = p.state_limit = kFp32Limit;
      continue;
    }
    const Path* bar = p.kind == PathKind::kBaseline ? reference
                      : p.kind == PathKind::kReplay ? baseline
                                                    : nullptr;
    if (bar == nullptr) continue;
    p.out_limit = 2 * bar->out_error.relative() + kLowPrecisionFloor;
    p.state_limit = 2 * bar->state_error.relative() + kLowPrecisionFloor;
  }
}

bool passes(const Path& p) {
  return p.out_error.relative() <= p.out_limit && p.state_error.relative() <= p.state_limit &&
         p.pad_rows_written == 0 && p.cursor_mismatches == 0;
}

std::string format_limit(double limit) {
  if (std::isinf(limit)) return "-";
  char text[16];
  std::snprintf(text, sizeof text, "%.2e", limit);
  return text;
}

}  // namespace

int run_verify(const std::vector<std::string>& argv) {
  for (const std::string& arg : argv)
    if (arg == "--spec" || arg.rfind("--spec=", 0) == 0) return run_spec_verify(argv);
  const std::vector<Option> options = verify_options();
  const Args args(options, argv);
  if (args.help_requested()) {
    std::fputs(format_help("replayssm verify [options]", kSummary, options).c_str(), stdout);
    return 0;
  }
  LayerShape shape;
  shape.geometry = geometry_from_args(args);
  shape.batch = parse_int("--batch", args.get("--batch"), 1, 4096);
  shape.buffer_len = parse_int("--L", args.get("--L"), 1, 64);
  const int64_t steps = args.given("--steps") ? parse_int("--steps", args.get("--steps"), 1, 100000)
                                              : 3 * shape.buffer_len;
  const DType state_dtype = parse_dtype("--state-dtype", args.get("--state-dtype"));
  const DType act_dtype = parse_dtype("--act-dtype", args.get("--act-dtype"));
  const DeviceType device = parse_device("--device", args.get("--device"));
  const uint64_t seed = uint64_t(parse_int("--seed", args.get("--seed"), 0, INT64_MAX));

  Random random(seed);
  Rollout plan = plan_rollout(shape, random);
  shape = plan.shape;
  const Geometry& g = shape.geometry;
  const int64_t L = shape.buffer_len;
  const int64_t state_elems_per_slot = g.heads * g.head_dim * g.state_dim;
  const int64_t out_elems_per_row = g.heads * g.head_dim;

  const std::unique_ptr<Memory> host = make_host_memory();
  const std::unique_ptr<Memory> device_memory = make_memory(device);
  const Backend device_backend = device == DeviceType::kCuda ? Backend::kCuda : Backend::kCpu;

  // The checked paths read the activations in their dtype; the oracle (and the same-dtype
  // reference bar) read exact fp32 copies, so that its outputs are not rounded to 16 bits.
  StepInputs inputs(*device_memory, shape, act_dtype);
  StepInputs oracle_inputs(*host, shape, DType::kFloat32);
  const ParameterValues parameters = random_parameters(g, random);
  write_parameters(inputs, parameters);
  write_parameters(oracle_inputs, parameters);

  Tensor oracle_state(*host, DType::kFloat64, {shape.slots, g.heads, g.head_dim, g.state_dim});
  Tensor oracle_out = make_out(*host, shape, DType::kFloat32);

  std::vector<Path> paths;
  paths.reserve(4);
  paths.emplace_back("baseline", PathKind::kBaseline, ReplayRoute::kAuto, device_backend, inputs,
                     *device_memory, shape, state_dtype, act_dtype);
  for (ReplayRoute route : {ReplayRoute::kOutputOnly, ReplayRoute::kStateAndOutput})
    paths.emplace_back(std::string("replay ") + route_name(route), PathKind::kReplay, route,
                       device_backend, inputs, *device_memory, shape, state_dtype, act_dtype);
  if (state_dtype != DType::kFloat32)
    paths.emplace_back(std::string("reference ") + dtype_short_name(state_dtype) + " state (bar)",
                       PathKind::kReference, ReplayRoute::kAuto, Backend::kReference,
                       oracle_inputs, *host, shape, state_dtype, DType::kFloat32);

  // Every path starts from the same state, representable in the state dtype.
  const std::vector<double> initial_state =
      round_to([&] {
        std::vector<double> v(size_t(shape.slots * state_elems_per_slot));
        for (double& e : v) e = random.uniform(-1.0, 1.0);
        return v;
      }(), state_dtype);
  oracle_state.write(initial_state);
  for (Path& p : paths) p.cache.state.write(initial_state);

  std::printf("replayssm verify: %s, batch %" PRId64 " over %" PRId64
              " slots, L %" PRId64 ", state %s, act %s, device %s, seed %" PRIu64 "\n",
              g.describe().c_str(), shape.batch, shape.slots, L, dtype_short_name(state_dtype),
              dtype_short_name(act_dtype), device_name(device), seed);
  std::printf("  rows join over %" PRId64 " steps so that their cursors are then", plan.join_steps());
  for (int64_t c : plan.start_cursor) std::printf(" %" PRId64, c);
  std::printf("; %" PRId64 " steps follow\n", steps);
  std::printf("  oracle: selective_state_update, reference backend, float64 state\n");
  std::fflush(stdout);

  const std::vector<double> poison(size_t(shape.batch * out_elems_per_row),
                                   std::numeric_limits<double>::quiet_NaN());
  std::vector<int64_t> cursors(size_t(shape.slots), 0);  // what the cursors must be
  int64_t flushes = 0;
  const int64_t total_steps = plan.join_steps() + steps;
  for (int64_t k = 0; k < total_steps; ++k) {
    std::vector<int64_t> row_slots(size_t(shape.batch));
    for (int64_t row = 0; row < shape.batch; ++row)
      row_slots[size_t(row)] = k >= plan.join_step(row) ? plan.slot_of_row[size_t(row)] : kPadSlot;
    const std::vector<double> row_slot_values(row_slots.begin(), row_slots.end());
    inputs.state_batch_indices.write(row_slot_values);
    oracle_inputs.state_batch_indices.write(row_slot_values);
    const ActivationValues activations = random_activations(shape, act_dtype, random);
    write_activations(inputs, activations);
    write_activations(oracle_inputs, activations);

    ExecOptions oracle_options;
    oracle_options.backend = Backend::kReference;
    selective_state_update(oracle_state.view(), make_step(oracle_inputs, oracle_out), oracle_options);
    const std::vector<double> expected_out = oracle_out.read();

    for (Path& p : paths) {
      p.out.write(poison);
      run_step(p, L);
      check_out(p, expected_out, row_slots, out_elems_per_row);
    }
    for (const int64_t slot : row_slots) {
      if (slot == kPadSlot) continue;
      int64_t& cursor = cursors[size_t(slot)];
      if (cursor == L - 1) {
        ++flushes;
        const std::vector<double> expected_state =
            oracle_state.read(slot * state_elems_per_slot, state_elems_per_slot);
        for (Path& p : paths) check_state(p, slot, expected_state);
      }
      cursor = (cursor + 1) % L;
    }
  }
  for (Path& p : paths) {
    if (p.kind != PathKind::kReplay) continue;
    const std::vector<double> got = p.cache.cursors.read();
    for (size_t slot = 0; slot < got.size(); ++slot)
      if (int64_t(got[slot]) != cursors[slot]) ++p.cursor_mismatches;
  }

  set_limits(paths, state_dtype);
  std::printf("\n%-30s %-10s %-10s %-10s %-10s %-10s %s\n", "path", "out_err", "limit",
              "state_err", "limit", "out_raw", "result");
  bool all_pass = true;
  for (const Path& p : paths) {
    const bool is_bar = p.kind == PathKind::kReference;
    const bool pass = passes(p);
    if (!is_bar) all_pass = all_pass && pass;
    std::printf("%-30s %-10.2e %-10s %-10.2e %-10s %-10.2e %s\n", p.name.c_str(),
                p.out_error.relative(), format_limit(p.out_limit).c_str(), p.state_error.relative(),
                format_limit(p.state_limit).c_str(), p.out_raw_error.relative(),
                is_bar ? "bar" : pass ? "PASS" : "FAIL");
    if (p.pad_rows_written > 0)
      std::printf("  %s wrote out on %" PRId64 " padded rows\n", p.name.c_str(), p.pad_rows_written);
    if (p.cursor_mismatches > 0)
      std::printf("  %s left %" PRId64 " cursors at a wrong value\n", p.name.c_str(),
                  p.cursor_mismatches);
  }
  std::printf(
      "\nout_err: max |out - oracle| beyond the rounding of out to %s, over max |oracle out|\n"
      "out_raw: the same without discounting that rounding (not checked)\n"
      "state_err: max |state - oracle state| over max |oracle state|, right after each of the "
      "%" PRId64 " row flushes\n",
      dtype_short_name(act_dtype), flushes);
  std::printf("%s\n", all_pass ? "PASS" : "FAIL");
  return all_pass ? 0 : 1;
}

}  // namespace replayssm::tool
