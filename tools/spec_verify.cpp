// replayssm verify --spec T: ReplaySSM's speculative path (spec_verify + spec_commit) and the
// baseline speculative path (spec_state_update) over a rollout of verify steps with random accepted
// counts, in lockstep with the fp64 oracle, which decodes each window one token at a time from the
// state after the previously accepted tokens.
//
// Rows map to a shuffled set of slots, two more than the batch; every row carries T tokens and
// accepts a uniform random count in [1, T] each step, so the rows' rings drift apart.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "error_stats.hpp"
#include "geometry.hpp"
#include "replayssm/mamba2_spec.hpp"
#include "workload.hpp"

namespace replayssm::tool {
namespace {

constexpr double kFp32Limit = 1e-5;
constexpr double kLowPrecisionFloor = 1e-5;  // absolute slack of the 2x rule

std::vector<Option> spec_verify_options() {
  std::vector<Option> options = geometry_options();
  options.insert(options.end(), {
      {"--spec", "T", "tokens per verify window, 1..8", ""},
      {"--batch", "N", "batch rows", "4"},
      {"--steps", "N", "verify steps", "4 L / T + 8"},
      {"--L", "N", "ReplaySSM buffer length (committed history + one window), 2T..64", "16"},
      {"--state-dtype", "fp32|fp16|bf16", "state (checkpoint) dtype", "fp32"},
      {"--act-dtype", "fp32|fp16|bf16", "activation dtype of x, dt, B, C, z and out", "bf16"},
      {"--device", "cpu|cuda|auto", "backend of the checked paths", "auto"},
      {"--seed", "S", "seed of every random value", "1"},
  });
  return options;
}

constexpr const char* kSummary =
    "Runs ReplaySSM's speculative verify + commit and the baseline speculative path\n"
    "(spec_state_update) over a rollout of verify steps with random accepted counts (flushes\n"
    "included) and compares every output with the fp64 oracle, which decodes each window one token\n"
    "at a time; ReplaySSM's flushed checkpoints and the baseline's accepted states are compared with\n"
    "the oracle state at the same token. fp32 state: PASS when every error is <= 1e-5. 16-bit state:\n"
    "ReplaySSM within 2x the baseline's error, plus 1e-5. Exit code 0 iff both paths pass.";

// A (batch, T, ...) window tensor's position t as a (batch, ...) view.
TensorView position(const Tensor& window, int64_t t) {
  const TensorView& w = window.view();
  TensorView v;
  v.data = static_cast<char*>(w.data) + t * w.strides[1] * dtype_size(w.dtype);
  v.dtype = w.dtype;
  v.device = w.device;
  v.rank = w.rank - 1;
  v.shape[0] = w.shape[0];
  v.strides[0] = w.strides[0];
  for (int d = 2; d < w.rank; ++d) {
    v.shape[d - 1] = w.shape[d];
    v.strides[d - 1] = w.strides[d];
  }
  return v;
}

// The inputs of one window in one dtype, on one memory.
struct WindowInputs {
  WindowInputs(Memory& m, const Geometry& g, int64_t batch, int64_t T, DType act)
      : x(m, act, {batch, T, g.heads, g.head_dim}),
        z(m, act, {batch, T, g.heads, g.head_dim}),
        dt(m, act, {batch, T, g.heads}),
        B(m, act, {batch, T, g.groups, g.state_dim}),
        C(m, act, {batch, T, g.groups, g.state_dim}),
        A(m, DType::kFloat32, {g.heads}),
        D(m, DType::kFloat32, {g.heads}),
        dt_bias(m, DType::kFloat32, {g.heads}) {}
  Tensor x, z, dt, B, C, A, D, dt_bias;

  Mamba2Window window(const Tensor& indices, const Tensor& out) const {
    Mamba2Window w;
    w.x = x.view();
    w.dt = dt.view();
    w.A = A.view();
    w.B = B.view();
    w.C = C.view();
    w.D = D.view();
    w.z = z.view();
    w.dt_bias = dt_bias.view();
    w.dt_softplus = true;
    w.state_batch_indices = indices.view();
    w.pad_slot_id = kPadSlot;
    w.out = out.view();
    return w;
  }
  // Position t of every row as one decode step.
  Mamba2Step position_step(int64_t t, const Tensor& indices, const Tensor& out) const {
    Mamba2Step s;
    s.x = position(x, t);
    s.dt = position(dt, t);
    s.A = A.view();
    s.B = position(B, t);
    s.C = position(C, t);
    s.D = D.view();
    s.z = position(z, t);
    s.dt_bias = dt_bias.view();
    s.dt_softplus = true;
    s.state_batch_indices = indices.view();
    s.pad_slot_id = kPadSlot;
    s.out = out.view();
    return s;
  }
};

void write_activations(WindowInputs& inputs, const ActivationValues& a) {
  inputs.x.write(a.x);
  inputs.z.write(a.z);
  inputs.dt.write(a.dt);
  inputs.B.write(a.B);
  inputs.C.write(a.C);
}

struct PathResult {
  ErrorStat out_error, state_error;
  double out_limit = 0, state_limit = 0;
  bool passes() const { return out_error.relative() <= out_limit && state_error.relative() <= state_limit; }
};

}  // namespace

int run_spec_verify(const std::vector<std::string>& argv) {
  const std::vector<Option> options = spec_verify_options();
  const Args args(options, argv);
  if (args.help_requested()) {
    std::fputs(format_help("replayssm verify --spec T [options]", kSummary, options).c_str(), stdout);
    return 0;
  }
  const Geometry g = geometry_from_args(args);
  const int64_t T = parse_int("--spec", args.get("--spec"), 1, kMaxSpecWindow);
  const int64_t batch = parse_int("--batch", args.get("--batch"), 1, 4096);
  const int64_t L = parse_int("--L", args.get("--L"), 2 * T, 64);
  const int64_t steps = args.given("--steps") ? parse_int("--steps", args.get("--steps"), 1, 100000) : 4 * L / T + 8;
  const DType state_dtype = parse_dtype("--state-dtype", args.get("--state-dtype"));
  const DType act = parse_dtype("--act-dtype", args.get("--act-dtype"));
  const DeviceType device = parse_device("--device", args.get("--device"));
  const uint64_t seed = uint64_t(parse_int("--seed", args.get("--seed"), 0, INT64_MAX));
  const int64_t R = spec_ring_len(L, T), slots = batch + 2;
  const int64_t n = g.heads * g.head_dim * g.state_dim;  // state elements per slot

  const std::unique_ptr<Memory> host = make_host_memory();
  const std::unique_ptr<Memory> memory = make_memory(device);
  ExecOptions on_device;
  on_device.backend = device == DeviceType::kCuda ? Backend::kCuda : Backend::kCpu;
  ExecOptions reference;
  reference.backend = Backend::kReference;

  Random random(seed);
  std::vector<int64_t> slot_order(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) slot_order[size_t(s)] = s;
  for (size_t i = slot_order.size() - 1; i > 0; --i) std::swap(slot_order[i], slot_order[random.next() % (i + 1)]);
  std::vector<double> row_slot(slot_order.begin(), slot_order.begin() + batch);

  WindowInputs inputs(*memory, g, batch, T, act), oracle_inputs(*host, g, batch, T, DType::kFloat32);
  const ParameterValues parameters = random_parameters(g, random);
  for (WindowInputs* w : {&inputs, &oracle_inputs}) {
    w->A.write(parameters.A);
    w->D.write(parameters.D);
    w->dt_bias.write(parameters.dt_bias);
  }
  Tensor indices(*memory, DType::kInt32, {batch});
  Tensor baseline_indices(*memory, DType::kInt32, {batch, T});
  Tensor accepted(*memory, DType::kInt32, {batch}), previous_accepted(*memory, DType::kInt32, {batch});
  Tensor oracle_indices(*host, DType::kInt32, {batch});
  indices.write(row_slot);
  oracle_indices.write(row_slot);
  std::vector<double> baseline_slot_ids;
  for (double s : row_slot)
    for (int64_t t = 0; t < T; ++t) baseline_slot_ids.push_back(s * double(T) + double(t));
  baseline_indices.write(baseline_slot_ids);

  // ReplaySSM's cache, the baseline's T states per slot, the fp64 oracle's committed state.
  Tensor checkpoint(*memory, state_dtype, {slots, g.heads, g.head_dim, g.state_dim});
  Tensor x_cache(*memory, act, {slots, g.heads, R, g.head_dim});
  Tensor B_cache(*memory, act, {slots, g.groups, R, g.state_dim});
  Tensor dt_cache(*memory, DType::kFloat32, {slots, g.heads, R});
  Tensor ring(*memory, DType::kInt32, {slots, 2});
  Tensor baseline_state(*memory, state_dtype, {slots * T, g.heads, g.head_dim, g.state_dim});
  Tensor out(*memory, act, {batch, T, g.heads, g.head_dim});
  Tensor baseline_out(*memory, act, {batch, T, g.heads, g.head_dim});
  Tensor oracle_state(*host, DType::kFloat64, {slots, g.heads, g.head_dim, g.state_dim});
  Tensor scratch_state(*host, DType::kFloat64, {slots, g.heads, g.head_dim, g.state_dim});
  Tensor oracle_out(*host, DType::kFloat32, {batch, g.heads, g.head_dim});
  Tensor all_slots(*memory, DType::kInt32, {slots});
  // On the CUDA backend verify gets a workspace, as in the bench: it takes the split path where
  // the automatic choice does (large batches).
  Tensor workspace(*memory, DType::kInt8, {spec_verify_workspace_bytes(batch, T, g.heads, g.head_dim)});
  ExecOptions verify_options = on_device;
  if (device == DeviceType::kCuda) verify_options.workspace = workspace.view();
  for (int64_t s = 0; s < slots; ++s) {
    std::vector<double> initial(static_cast<size_t>(n));
    for (double& e : initial) e = random.uniform(-1.0, 1.0);
    initial = round_to(initial, state_dtype);
    oracle_state.write(initial, s * n);
    checkpoint.write(initial, s * n);
    baseline_state.write(initial, s * T * n);  // column 0
  }
  std::vector<double> ids(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) ids[size_t(s)] = double(s);
  all_slots.write(ids);
  spec_reset(ring.view(), all_slots.view(), kPadSlot, on_device);
  std::vector<double> expected_ring(size_t(2 * slots), 0.0), previous(size_t(batch), 1.0);

  std::printf("replayssm verify --spec: %s, batch %" PRId64 " over %" PRId64 " slots, T %" PRId64 ", L %" PRId64
              " (ring %" PRId64 "), state %s, act %s, device %s, %" PRId64 " verify steps, seed %" PRIu64 "\n",
              g.describe().c_str(), batch, slots, T, L, R, dtype_short_name(state_dtype), dtype_short_name(act),
              device_name(device), steps, seed);
  std::fflush(stdout);

  PathResult replay, baseline;
  int64_t flushes = 0, accepted_total = 0;
  LayerShape tokens;  // the window's batch * T tokens as rows, for random_activations
  tokens.geometry = g;
  tokens.batch = batch * T;
  for (int64_t step = 0; step < steps; ++step) {
    const ActivationValues a = random_activations(tokens, act, random);
    write_activations(inputs, a);
    write_activations(oracle_inputs, a);
    std::vector<double> k(static_cast<size_t>(batch));
    for (double& v : k) v = double(1 + int64_t(random.uniform(0.0, double(T))) % T);
    accepted.write(k);
    previous_accepted.write(previous);

    const SpecCache cache{checkpoint.view(), x_cache.view(), B_cache.view(), dt_cache.view(), ring.view()};
    spec_verify(cache, inputs.window(indices, out), L, verify_options);
    Mamba2Window baseline_window = inputs.window(baseline_indices, baseline_out);
    spec_state_update(baseline_state.view(), baseline_window, previous_accepted.view(), on_device);
    spec_commit(ring.view(), accepted.view(), T, L, indices.view(), kPadSlot, on_device);

    // Flushed checkpoints hold the state after the committed tokens: the oracle state now.
    for (int64_t row = 0; row < batch; ++row) {
      const int64_t slot = int64_t(row_slot[size_t(row)]);
      double* r = &expected_ring[size_t(2 * slot)];
      if (!spec_flushes(int64_t(r[1]), T, L)) continue;
      ++flushes;
      const std::vector<double> got = checkpoint.read(slot * n, n), exact = oracle_state.read(slot * n, n);
      for (size_t i = 0; i < got.size(); ++i) replay.state_error.add(std::fabs(got[i] - exact[i]), exact[i]);
    }

    // The oracle: token by token from the committed state; the accepted position's state is kept.
    scratch_state.write(oracle_state.read());
    const std::vector<double> got = out.read(), got_baseline = baseline_out.read();
    const int64_t row_elems = g.heads * g.head_dim;
    for (int64_t t = 0; t < T; ++t) {
      selective_state_update(scratch_state.view(), oracle_inputs.position_step(t, oracle_indices, oracle_out),
                             reference);
      const std::vector<double> exact = oracle_out.read();
      for (int64_t row = 0; row < batch; ++row) {
        for (int64_t i = 0; i < row_elems; ++i) {
          const double e = exact[size_t(row * row_elems + i)];
          const size_t at = size_t((row * T + t) * row_elems + i);
          replay.out_error.add(rounding_excess(got[at], e, act), e);
          baseline.out_error.add(rounding_excess(got_baseline[at], e, act), e);
        }
        if (int64_t(k[size_t(row)]) - 1 != t) continue;
        const int64_t slot = int64_t(row_slot[size_t(row)]);
        oracle_state.write(scratch_state.read(slot * n, n), slot * n);
      }
    }
    // The baseline keeps the accepted position's state in its slot.
    for (int64_t row = 0; row < batch; ++row) {
      const int64_t slot = int64_t(row_slot[size_t(row)]), kept = slot * T + int64_t(k[size_t(row)]) - 1;
      const std::vector<double> state = baseline_state.read(kept * n, n), exact = oracle_state.read(slot * n, n);
      for (size_t i = 0; i < state.size(); ++i) baseline.state_error.add(std::fabs(state[i] - exact[i]), exact[i]);
      double* r = &expected_ring[size_t(2 * slot)];
      if (spec_flushes(int64_t(r[1]), T, L)) {
        r[0] = double((int64_t(r[0]) + int64_t(r[1])) % R);
        r[1] = 0;
      }
      r[1] += k[size_t(row)];
      accepted_total += int64_t(k[size_t(row)]);
    }
    previous = k;
  }
  const bool ring_ok = ring.read() == expected_ring;

  if (state_dtype == DType::kFloat32) {
    replay.out_limit = replay.state_limit = baseline.out_limit = baseline.state_limit = kFp32Limit;
  } else {
    baseline.out_limit = baseline.state_limit = std::numeric_limits<double>::infinity();  // the bar
    replay.out_limit = 2 * baseline.out_error.relative() + kLowPrecisionFloor;
    replay.state_limit = 2 * baseline.state_error.relative() + kLowPrecisionFloor;
  }
  const bool pass = replay.passes() && baseline.passes() && ring_ok;
  std::printf("  %" PRId64 " tokens accepted over %" PRId64 " row steps (mean %.2f of %" PRId64 "), %" PRId64
              " row flushes\n\n",
              accepted_total, steps * batch, double(accepted_total) / double(steps * batch), T, flushes);
  std::printf("%-10s %-10s %-10s %-10s %-10s %s\n", "path", "out_err", "limit", "state_err", "limit", "result");
  auto row = [&](const char* name, const PathResult& r) {
    auto limit = [](double v) {
      char text[16];
      std::snprintf(text, sizeof text, std::isinf(v) ? "-" : "%.2e", v);
      return std::string(text);
    };
    std::printf("%-10s %-10.2e %-10s %-10.2e %-10s %s\n", name, r.out_error.relative(), limit(r.out_limit).c_str(),
                r.state_error.relative(), limit(r.state_limit).c_str(), r.passes() ? "PASS" : "FAIL");
  };
  row("replay", replay);
  row("baseline", baseline);
  if (!ring_ok) std::printf("  the rings differ from the contract's values after the last commit\n");
  std::printf(
      "\nout_err: max |out - oracle| beyond the rounding of out to %s, over max |oracle out|, every position\n"
      "state_err: replay, flushed checkpoints vs the oracle state at the same token; baseline, the\n"
      "accepted position's state after each step\n",
      dtype_short_name(act));
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace replayssm::tool
