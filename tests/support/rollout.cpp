#include "support/rollout.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>

#include "common/mamba2_math.hpp"

namespace replayssm::test {
namespace {

// fp32 state: outputs and flushed checkpoints match the exact recurrence to this relative error
// (max abs error / max abs exact value), the project's promise for every backend.
constexpr double kFp32Tolerance = 1e-5;

// 16-bit state: the 2x-naive rule, replay error <= 2 x the error of the same backend's baseline,
// which rounds the state at every step (the naive same-precision implementation). Over the
// rollout (max over all steps) the rule holds as is. One step compares the max over a few hundred
// elements, which fluctuates (ratios up to ~3 seen on the small shapes): there the bound gets a
// floor of one unit roundoff of the state format, relative to max |y|, about what one rounding of
// the checkpoint moves an output. Before the first flush neither side has rounded a state at all
// and both errors are fp32 arithmetic (~1e-7), where a ratio means nothing.
constexpr double kStepFloorRoundoffs = 1.0;

// 8-bit checkpoints have no baseline to compare with (no kernel stores an 8-bit state every step),
// so their bound comes from the format. A flush moves each element by at most half a step of its
// row's scale (a whole step with stochastic rounding): u x the row's absmax, with u = 0.5 / 127
// for int8 and 2^-4 (half the spacing of 3 mantissa bits, relative) for e4m3, doubled with
// stochastic rounding. Carried forward with decays <= 1, after k flushes a state element is off
// by at most k u of its row's absmax. An output is a dot product of a state row with C; its error
// mixes those element errors with the same weights as the exact output mixes the state, so
// relative to max |y| it stays within a small multiple of k u. The bound allows twice k u.
constexpr double kDriftRoundoffs = 2.0;

double relative_rounding(DType checkpoint, bool stochastic) {
  const double u = checkpoint == DType::kInt8 ? 0.5 / 127 : std::ldexp(1.0, -4);
  return stochastic ? 2 * u : u;
}

constexpr size_t kMaxMessages = 12;
// What a workspace holds before its first call (check_split_path).
constexpr uint8_t kWorkspaceFill = 0xa5;

std::string index_string(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::ostringstream os;
  os << "(";
  for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << ")";
  return os.str();
}

std::string bits_string(uint64_t bits) {
  std::ostringstream os;
  os << "0x" << std::hex << bits;
  return os.str();
}

// First element whose bits differ in [begin, end), or -1.
int64_t first_difference(const HostTensor& a, const HostTensor& b, int64_t begin, int64_t end) {
  const int64_t size = dtype_size(a.dtype());
  if (std::memcmp(a.bytes().data() + begin * size, b.bytes().data() + begin * size,
                  size_t((end - begin) * size)) == 0)
    return -1;
  for (int64_t i = begin; i < end; ++i)
    if (a.bits(i) != b.bits(i)) return i;
  return -1;
}

HostTensor download_tensor(const Buffer& buffer, DType dtype, std::vector<int64_t> shape) {
  HostTensor t(dtype, std::move(shape));
  buffer.download(t.data(), 0, t.bytes().size());
  return t;
}

const char* route_tag(ReplayRoute route) {
  switch (route) {
    case ReplayRoute::kAuto: return "autoroute";
    case ReplayRoute::kOutputOnly: return "outputonly";
    case ReplayRoute::kStateAndOutput: return "stateandoutput";
  }
  return "unknown";
}

}  // namespace

std::string RolloutConfig::name() const {
  std::ostringstream os;
  os << geometry.name << "_L" << buffer_len << "_" << route_tag(route) << "_s"
     << short_dtype_name(state_dtype) << "_a" << short_dtype_name(act_dtype);
  if (dt_float32) os << "_dtf32";
  if (param_dtype != DType::kFloat32) os << "_params" << short_dtype_name(param_dtype);
  if (!with_D) os << "_noD";
  if (!with_z) os << "_noz";
  if (!with_dt_bias) os << "_nobias";
  if (!dt_softplus) os << "_nosoftplus";
  if (dt_per_channel) os << "_dtHP";
  if (A_per_element) os << "_AHPN";
  if (packed_xbc) os << "_packedxbc";
  if (stochastic_rounding) os << "_sr";
  if (workspace) os << "_workspace";
  if (mapping == SlotMapping::kIdentity)
    os << (foreign_slots == 0 ? "_identity" : "_identityextraslots");
  if (steps > 0) os << "_steps" << steps;
  if (recycles != 1) os << "_recycles" << recycles;
  if (pad_slot_id != -1) os << "_padid" << (pad_slot_id < 0 ? "minus" : "") << std::llabs(pad_slot_id);
  return os.str();
}

void PrintTo(const RolloutConfig& config, std::ostream* os) {
  *os << config.name() << " on " << backend_name(config.backend);
}

const char* check_name(Check check) {
  switch (check) {
    case Check::kOutputError: return "output error";
    case Check::kOutputNotWritten: return "output not written";
    case Check::kPadRowWritten: return "pad row written";
    case Check::kCache: return "cache contents";
    case Check::kCheckpointTouched: return "checkpoint touched without a flush";
    case Check::kFlushedCheckpoint: return "flushed checkpoint";
    case Check::kCursor: return "cursors";
    case Check::kBaselineStateTouched: return "baseline touched an unused slot";
    case Check::kFlushCounts: return "flush counts";
    case Check::kSplitPathNotTaken: return "split path not taken";
    case Check::kCount: break;
  }
  return "unknown";
}

void Report::fail(Check check, const std::string& message) {
  ++failures[int(check)];
  if (messages.size() < kMaxMessages) messages.push_back(std::string(check_name(check)) + ": " + message);
}

bool Report::passed() const {
  for (int64_t f : failures)
    if (f != 0) return false;
  return true;
}

std::string Report::summary() const {
  std::ostringstream os;
  os << steps << " steps, " << flush_rows << " flush rows, " << nonflush_rows
     << " buffered rows, " << recycled_slots << " recycled slots; max relative output error: replay "
     << max_replay_error << ", baseline " << max_baseline_error << "; max flushed checkpoint error "
     << max_checkpoint_error;
  for (int c = 0; c < int(Check::kCount); ++c)
    if (failures[c]) os << "\n  " << failures[c] << " x " << check_name(Check(c));
  for (const std::string& m : messages) os << "\n  " << m;
  return os.str();
}

struct Rollout::StepInputs {
  std::vector<int32_t> row_slot;  // (batch): slot of each row, pad_slot_id for a pad row
  bool pass_indices = true;       // false: state_batch_indices absent (row i uses slot i)
  HostTensor x, dt, B, C, z;          // as the backend under test reads them
  HostTensor x32, dt32, B32, C32, z32;  // the same values widened to fp32, for the oracle
  HostTensor indices;                 // (batch) int32

  bool is_pad(int64_t row, int64_t pad_slot_id) const { return row_slot[row] == pad_slot_id; }
};

Rollout::Rollout(const RolloutConfig& config)
    : config_(config),
      H_(config.geometry.nheads),
      P_(config.geometry.head_dim),
      N_(config.geometry.state_dim),
      G_(config.geometry.ngroups),
      L_(config.buffer_len),
      batch_(config.requests + (config.mapping == SlotMapping::kShuffled ? config.pad_rows : 0)),
      slots_(config.requests + config.foreign_slots),
      dt_dtype_(config.dt_float32 ? DType::kFloat32 : config.act_dtype),
      device_(device_for(config.backend)),
      rng_(config.seed) {
  // Requests start at steps spread over the first window, in random order, so that their rows sit
  // at different buffer positions (and flush at different steps) for the whole run.
  const int64_t R = config.requests;
  for (int64_t i = 0; i < R; ++i) request_start_.push_back(i * L_ / R);
  std::shuffle(request_start_.begin(), request_start_.end(), rng_);
  last_start_ = *std::max_element(request_start_.begin(), request_start_.end());
  total_steps_ = config.steps > 0 ? config.steps : std::max<int64_t>(last_start_ + 3 * L_ + 1, 12);
  for (int64_t k = 1; k <= config.recycles; ++k)
    recycle_steps_.push_back(last_start_ + k * (total_steps_ - last_start_) / (config.recycles + 1));

  std::vector<int64_t> slot_order(static_cast<size_t>(slots_));
  std::iota(slot_order.begin(), slot_order.end(), 0);
  if (config.mapping == SlotMapping::kShuffled) std::shuffle(slot_order.begin(), slot_order.end(), rng_);
  request_slot_.assign(slot_order.begin(), slot_order.begin() + R);

  const DType act = config.act_dtype, state = config.state_dtype;
  const int64_t act_size = dtype_size(act);
  checkpoint_ = Buffer(device_, size_t(slots_ * H_ * P_ * N_ * dtype_size(state)));
  if (config.workspace) {
    workspace_ = Buffer(device_, size_t(replay_decode_workspace_bytes(batch_, H_, P_)));
    workspace_.upload(std::vector<uint8_t>(workspace_.bytes(), kWorkspaceFill));
  }
  if (has_baseline()) baseline_state_ = Buffer(device_, checkpoint_.bytes());
  if (is_scaled_checkpoint(state)) checkpoint_scale_ = Buffer(device_, size_t(slots_ * H_ * P_ * 4));
  if (config.stochastic_rounding) {
    // Any seed and any starting counts: the key is whatever they hold.
    const int32_t seed[2] = {int32_t(rng_()), int32_t(rng_())};
    rounding_seed_ = Buffer(device_, sizeof(seed));
    rounding_seed_.upload(seed, 0, sizeof(seed));
    for (int64_t slot = 0; slot < slots_; ++slot) expected_flush_counts_.push_back(int32_t(rng_() % 1000));
    flush_counts_ = Buffer(device_, size_t(slots_ * 4));
    flush_counts_.upload(expected_flush_counts_.data(), 0, flush_counts_.bytes());
  }
  x_cache_ = Buffer(device_, size_t(slots_ * H_ * L_ * P_ * act_size));
  B_cache_ = Buffer(device_, size_t(slots_ * G_ * L_ * N_ * act_size));
  dt_cache_ = Buffer(device_, size_t(slots_ * H_ * L_ * 4));
  cursors_ = Buffer(device_, size_t(slots_ * 4));
  if (config.packed_xbc) {
    xbc_ = Buffer(device_, size_t(batch_ * (H_ * P_ + 2 * G_ * N_) * act_size));
  } else {
    x_ = Buffer(device_, size_t(batch_ * H_ * P_ * act_size));
    B_ = Buffer(device_, size_t(batch_ * G_ * N_ * act_size));
    C_ = Buffer(device_, size_t(batch_ * G_ * N_ * act_size));
  }
  if (config.with_z) z_ = Buffer(device_, size_t(batch_ * H_ * P_ * act_size));
  dt_ = Buffer(device_, size_t(batch_ * H_ * dtype_size(dt_dtype_)));
  indices_ = Buffer(device_, size_t(batch_ * 4));
  out_ = Buffer(device_, size_t(batch_ * H_ * P_ * act_size));
  baseline_out_ = Buffer(device_, out_.bytes());

  initialise_parameters();

  oracle_state_ = HostTensor(DType::kFloat64, {slots_, H_, P_, N_});
  window_oracle_state_ = HostTensor(DType::kFloat64, {slots_, H_, P_, N_});
  for (int64_t slot = 0; slot < slots_; ++slot) write_initial_state(slot, random_state(), random_scales());

  // Caches start as canaries: a kernel that reads past the cursor turns an output into NaN.
  expected_x_cache_ = HostTensor(act, {slots_, H_, L_, P_});
  expected_B_cache_ = HostTensor(act, {slots_, G_, L_, N_});
  expected_dt_cache_ = HostTensor(DType::kFloat32, {slots_, H_, L_});
  for (HostTensor* t : {&expected_x_cache_, &expected_B_cache_, &expected_dt_cache_})
    t->fill_bits(canary_bits(t->dtype()));
  x_cache_.upload(expected_x_cache_);
  B_cache_.upload(expected_B_cache_);
  dt_cache_.upload(expected_dt_cache_);

  // Cursors start anywhere; the requests' slots are reset as a serving engine would.
  std::uniform_int_distribution<int32_t> any_cursor(0, int32_t(L_ - 1));
  expected_cursors_.resize(size_t(slots_));
  for (int32_t& c : expected_cursors_) c = any_cursor(rng_);
  cursors_.upload(expected_cursors_.data(), 0, cursors_.bytes());
  std::vector<int32_t> request_slots(request_slot_.begin(), request_slot_.end());
  request_slots.push_back(int32_t(config.pad_slot_id));
  reset_cursors(request_slots);
}

void Rollout::initialise_parameters() {
  std::uniform_real_distribution<double> decay_rate(-8.0, -0.5);
  std::normal_distribution<double> unit_normal;
  // With softplus the bias shifts raw dt ~ N(-2, 1); without it dt + bias must stay positive.
  std::uniform_real_distribution<double> bias(config_.dt_softplus ? -1.0 : 0.0,
                                              config_.dt_softplus ? 1.0 : 0.05);
  HostTensor A(config_.param_dtype, {H_}), D(config_.param_dtype, {H_}), dt_bias(config_.param_dtype, {H_});
  A32_ = HostTensor(DType::kFloat32, {H_});
  D32_ = HostTensor(DType::kFloat32, {H_});
  dt_bias32_ = HostTensor(DType::kFloat32, {H_});
  for (int64_t h = 0; h < H_; ++h) {
    A.set(h, decay_rate(rng_));
    D.set(h, unit_normal(rng_));
    dt_bias.set(h, bias(rng_));
    A32_.set(h, A.get(h));
    D32_.set(h, D.get(h));
    dt_bias32_.set(h, dt_bias.get(h));
  }
  A_ = upload_copy(device_, A);
  if (config_.with_D) D_ = upload_copy(device_, D);
  if (config_.with_dt_bias) dt_bias_ = upload_copy(device_, dt_bias);
}

HostTensor Rollout::random_state() {
  std::normal_distribution<double> unit_normal;
  // 8-bit: stored values spread over the format's range (their scales make them ~N(0, 1)).
  const double spread = config_.state_dtype == DType::kInt8 ? 40 : config_.state_dtype == DType::kFloat8E4M3 ? 100 : 1;
  HostTensor s(config_.state_dtype, {H_, P_, N_});
  for (int64_t i = 0; i < s.numel(); ++i) s.set(i, spread * unit_normal(rng_));
  return s;
}

HostTensor Rollout::random_scales() {
  if (!is_scaled_checkpoint(config_.state_dtype)) return HostTensor();
  const double typical = config_.state_dtype == DType::kInt8 ? 1.0 / 40 : 1.0 / 100;
  std::uniform_real_distribution<double> factor(0.5, 2.0);
  HostTensor scales(DType::kFloat32, {H_, P_});
  for (int64_t i = 0; i < scales.numel(); ++i) scales.set(i, typical * factor(rng_));
  return scales;
}

void Rollout::write_initial_state(int64_t slot, const HostTensor& state, const HostTensor& scales) {
  const int64_t n = H_ * P_ * N_;
  const size_t bytes = state.bytes().size();
  checkpoint_.upload(state.data(), size_t(slot) * bytes, bytes);
  if (has_baseline()) baseline_state_.upload(state.data(), size_t(slot) * bytes, bytes);
  if (!scales.bytes().empty())
    checkpoint_scale_.upload(scales.data(), size_t(slot) * scales.bytes().size(), scales.bytes().size());
  for (int64_t i = 0; i < n; ++i) {
    const double value = !scales.bytes().empty() ? scales.get(i / N_) * state.get(i) : state.get(i);
    oracle_state_.set(slot * n + i, value);
    window_oracle_state_.set(slot * n + i, value);
  }
}

void Rollout::reset_cursors(const std::vector<int32_t>& slots) {
  reset_slots_ = Buffer(device_, slots.size() * 4);
  reset_slots_.upload(slots.data(), 0, reset_slots_.bytes());
  replay_reset(cursors_.view(DType::kInt32, {slots_}),
               reset_slots_.view(DType::kInt32, {int64_t(slots.size())}), config_.pad_slot_id,
               ExecOptions{config_.backend});
  for (int32_t s : slots)
    if (s != config_.pad_slot_id) expected_cursors_[size_t(s)] = 0;
}

void Rollout::recycle_one_slot() {
  // Prefer a request with tokens in its buffer, so that the reset has something to forget.
  const int64_t R = config_.requests;
  int64_t chosen = -1;
  for (int64_t k = 0; k < R && chosen < 0; ++k) {
    const int64_t q = (next_recycle_request_ + k) % R;
    if (step_ >= request_start_[q] && expected_cursors_[size_t(request_slot_[q])] != 0) chosen = q;
  }
  for (int64_t q = 0; q < R && chosen < 0; ++q)
    if (step_ >= request_start_[q]) chosen = q;
  next_recycle_request_ = chosen + 1;
  const int64_t slot = request_slot_[chosen];
  write_initial_state(slot, random_state(), random_scales());
  reset_cursors({int32_t(config_.pad_slot_id), int32_t(slot)});
  ++report_.recycled_slots;
}

int64_t Rollout::slot_with_history() const {
  for (size_t q = 0; q < request_slot_.size(); ++q)
    if (step_ >= request_start_[q] && expected_cursors_[size_t(request_slot_[q])] > 0)
      return request_slot_[q];
  return -1;
}

void Rollout::choose_rows(StepInputs& in) {
  const int32_t pad = int32_t(config_.pad_slot_id);
  in.row_slot.assign(size_t(batch_), pad);
  if (config_.mapping == SlotMapping::kShuffled) {
    std::vector<int64_t> order(static_cast<size_t>(batch_));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng_);
    for (int64_t row = 0; row < batch_; ++row) {
      const int64_t q = order[row];
      if (q < config_.requests && step_ >= request_start_[q]) in.row_slot[row] = int32_t(request_slot_[q]);
    }
    in.pass_indices = true;
  } else {
    for (int64_t row = 0; row < batch_; ++row)
      if (step_ >= request_start_[row]) in.row_slot[row] = int32_t(request_slot_[row]);
    in.pass_indices = step_ < last_start_;  // indices are needed while some rows are padding
  }
  in.indices = HostTensor(DType::kInt32, {batch_});
  for (int64_t row = 0; row < batch_; ++row) in.indices.set(row, in.row_slot[row]);
}

void Rollout::generate_inputs(StepInputs& in) {
  const DType act = config_.act_dtype;
  std::normal_distribution<double> unit_normal;
  std::normal_distribution<double> raw_dt(-2.0, 1.0);
  auto fill = [&](HostTensor& t, HostTensor& t32, DType dtype, std::vector<int64_t> shape, auto draw) {
    t = HostTensor(dtype, shape);
    t32 = HostTensor(DType::kFloat32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      t.set(i, draw());
      t32.set(i, t.get(i));  // exact: the oracle reads the rounded value
    }
  };
  auto normal = [&] { return unit_normal(rng_); };
  fill(in.x, in.x32, act, {batch_, H_, P_}, normal);
  fill(in.B, in.B32, act, {batch_, G_, N_}, normal);
  fill(in.C, in.C32, act, {batch_, G_, N_}, normal);
  fill(in.z, in.z32, act, {batch_, H_, P_}, normal);
  // Without softplus the caller passes dt already positive.
  fill(in.dt, in.dt32, dt_dtype_, {batch_, H_}, [&] {
    const double v = raw_dt(rng_);
    return config_.dt_softplus ? v : softplus(v);
  });
}

void Rollout::upload_inputs(const StepInputs& in) {
  if (config_.packed_xbc) {
    const int64_t width = H_ * P_ + 2 * G_ * N_;
    HostTensor xbc(config_.act_dtype, {batch_, width});
    for (int64_t row = 0; row < batch_; ++row) {
      for (int64_t i = 0; i < H_ * P_; ++i) xbc.set_bits(row * width + i, in.x.bits(row * H_ * P_ + i));
      for (int64_t i = 0; i < G_ * N_; ++i) {
        xbc.set_bits(row * width + H_ * P_ + i, in.B.bits(row * G_ * N_ + i));
        xbc.set_bits(row * width + H_ * P_ + G_ * N_ + i, in.C.bits(row * G_ * N_ + i));
      }
    }
    xbc_.upload(xbc);
  } else {
    x_.upload(in.x);
    B_.upload(in.B);
    C_.upload(in.C);
  }
  if (config_.with_z) z_.upload(in.z);
  dt_.upload(in.dt);
  indices_.upload(in.indices);
}

Mamba2Step Rollout::step_under_test(const StepInputs& in, const Buffer& out) const {
  const DType act = config_.act_dtype;
  Mamba2Step s;
  if (config_.packed_xbc) {
    const int64_t width = H_ * P_ + 2 * G_ * N_;
    s.x = xbc_.view(act, {batch_, H_, P_}, {width, P_, 1});
    s.B = xbc_.view(act, {batch_, G_, N_}, {width, N_, 1}, H_ * P_);
    s.C = xbc_.view(act, {batch_, G_, N_}, {width, N_, 1}, H_ * P_ + G_ * N_);
  } else {
    s.x = x_.view(act, {batch_, H_, P_});
    s.B = B_.view(act, {batch_, G_, N_});
    s.C = C_.view(act, {batch_, G_, N_});
  }
  s.dt = config_.dt_per_channel ? dt_.view(dt_dtype_, {batch_, H_, P_}, {H_, 1, 0})
                                : dt_.view(dt_dtype_, {batch_, H_});
  const DType param = config_.param_dtype;
  s.A = config_.A_per_element ? A_.view(param, {H_, P_, N_}, {1, 0, 0}) : A_.view(param, {H_});
  auto per_head = [&](const Buffer& b) {
    return config_.dt_per_channel ? b.view(param, {H_, P_}, {1, 0}) : b.view(param, {H_});
  };
  if (config_.with_D) s.D = per_head(D_);
  if (config_.with_z) s.z = z_.view(act, {batch_, H_, P_});
  if (config_.with_dt_bias) s.dt_bias = per_head(dt_bias_);
  s.dt_softplus = config_.dt_softplus;
  if (in.pass_indices) s.state_batch_indices = indices_.view(DType::kInt32, {batch_});
  s.pad_slot_id = config_.pad_slot_id;
  s.out = out.view(act, {batch_, H_, P_});
  return s;
}

Mamba2Step Rollout::step_for_oracle(StepInputs& in, HostTensor& out) {
  Mamba2Step s;
  s.x = in.x32.view();
  s.dt = in.dt32.view();
  s.A = A32_.view();
  s.B = in.B32.view();
  s.C = in.C32.view();
  if (config_.with_D) s.D = D32_.view();
  if (config_.with_z) s.z = in.z32.view();
  if (config_.with_dt_bias) s.dt_bias = dt_bias32_.view();
  s.dt_softplus = config_.dt_softplus;
  if (in.pass_indices) s.state_batch_indices = in.indices.view();
  s.pad_slot_id = config_.pad_slot_id;
  s.out = out.view();
  return s;
}

void Rollout::run() {
  while (!done()) step();
  check_rollout_error();
  check_split_path();
}

void Rollout::step() {
  if (done()) return;
  if (std::find(recycle_steps_.begin(), recycle_steps_.end(), step_) != recycle_steps_.end())
    recycle_one_slot();

  StepInputs in;
  choose_rows(in);
  generate_inputs(in);
  upload_inputs(in);
  std::vector<bool> flushes(size_t(batch_), false);
  for (int64_t row = 0; row < batch_; ++row)
    if (!in.is_pad(row, config_.pad_slot_id))
      flushes[row] = expected_cursors_[size_t(in.row_slot[row])] == L_ - 1;

  const DType act = config_.act_dtype, state = config_.state_dtype;
  const std::vector<int64_t> out_shape{batch_, H_, P_}, state_shape{slots_, H_, P_, N_};
  HostTensor canaries(act, out_shape);
  canaries.fill_bits(canary_bits(act));
  out_.upload(canaries);
  baseline_out_.upload(canaries);
  const std::vector<int64_t> scale_shape{slots_, H_, P_};
  const bool scaled = is_scaled_checkpoint(state);
  const HostTensor checkpoint_before = download_tensor(checkpoint_, state, state_shape);
  const HostTensor scale_before = scaled ? download_tensor(checkpoint_scale_, DType::kFloat32, scale_shape) : HostTensor();
  const HostTensor baseline_before = has_baseline() ? download_tensor(baseline_state_, state, state_shape) : HostTensor();

  ExecOptions options{config_.backend};
  if (config_.workspace) {
    options.workspace = workspace_.view(DType::kInt8, {int64_t(workspace_.bytes())});
    options.window_kernel = WindowKernel::kSeparate;  // small batches would otherwise not take it
  }
  ReplayCache cache;
  cache.state = checkpoint_.view(state, state_shape);
  cache.x_cache = x_cache_.view(act, {slots_, H_, L_, P_});
  cache.B_cache = B_cache_.view(act, {slots_, G_, L_, N_});
  cache.dt_cache = dt_cache_.view(DType::kFloat32, {slots_, H_, L_});
  cache.cursors = cursors_.view(DType::kInt32, {slots_});
  if (scaled) cache.state_scale = checkpoint_scale_.view(DType::kFloat32, scale_shape);
  if (config_.stochastic_rounding) {
    cache.stochastic_rounding = true;
    cache.rounding_seed = rounding_seed_.view(DType::kInt32, {2});
    cache.flush_counts = flush_counts_.view(DType::kInt32, {slots_});
  }
  replay_decode(cache, step_under_test(in, out_), config_.route, options);
  replay_advance(cache.cursors, L_,
                 in.pass_indices ? indices_.view(DType::kInt32, {batch_}) : TensorView{},
                 config_.pad_slot_id, options);
  if (has_baseline())
    selective_state_update(baseline_state_.view(state, state_shape), step_under_test(in, baseline_out_),
                           options);

  HostTensor oracle_out(DType::kFloat32, out_shape), window_out(DType::kFloat32, out_shape);
  const ExecOptions reference{Backend::kReference};
  selective_state_update(oracle_state_.view(), step_for_oracle(in, oracle_out), reference);
  selective_state_update(window_oracle_state_.view(), step_for_oracle(in, window_out), reference);

  record_expected_caches(in, flushes);
  advance_expected_cursors(in);

  const HostTensor out = download_tensor(out_, act, out_shape);
  const HostTensor baseline_out = download_tensor(baseline_out_, act, out_shape);
  check_canaries(in, out, "replay out");
  if (has_baseline()) check_canaries(in, baseline_out, "baseline out");
  check_outputs(in, out, baseline_out, oracle_out);
  check_replay_against_checkpoint(in, out, window_out);
  check_caches();
  check_checkpoint(in, flushes, checkpoint_before, download_tensor(checkpoint_, state, state_shape),
                   scale_before,
                   scaled ? download_tensor(checkpoint_scale_, DType::kFloat32, scale_shape) : HostTensor());
  check_flush_counts(in, flushes);
  check_cursors();
  if (has_baseline())
    check_baseline_state(in, baseline_before, download_tensor(baseline_state_, state, state_shape));
  ++report_.steps;
  ++step_;
}

void Rollout::record_expected_caches(const StepInputs& in, const std::vector<bool>& flushes) {
  for (int64_t row = 0; row < batch_; ++row) {
    if (in.is_pad(row, config_.pad_slot_id)) continue;
    if (flushes[row]) {
      ++report_.flush_rows;
      continue;
    }
    ++report_.nonflush_rows;
    const int64_t slot = in.row_slot[row], pos = expected_cursors_[size_t(slot)];
    for (int64_t h = 0; h < H_; ++h) {
      for (int64_t p = 0; p < P_; ++p)
        expected_x_cache_.set_bits(((slot * H_ + h) * L_ + pos) * P_ + p, in.x.bits((row * H_ + h) * P_ + p));
      expected_dt_cache_.set((slot * H_ + h) * L_ + pos, in.dt.get(row * H_ + h));
    }
    for (int64_t g = 0; g < G_; ++g)
      for (int64_t n = 0; n < N_; ++n)
        expected_B_cache_.set_bits(((slot * G_ + g) * L_ + pos) * N_ + n, in.B.bits((row * G_ + g) * N_ + n));
  }
}

void Rollout::advance_expected_cursors(const StepInputs& in) {
  auto advance = [&](int64_t slot) {
    int32_t& c = expected_cursors_[size_t(slot)];
    c = int32_t((c + 1) % L_);
  };
  if (!in.pass_indices) {
    for (int64_t slot = 0; slot < slots_; ++slot) advance(slot);
    return;
  }
  for (int64_t row = 0; row < batch_; ++row)
    if (!in.is_pad(row, config_.pad_slot_id)) advance(in.row_slot[row]);
}

void Rollout::check_canaries(const StepInputs& in, const HostTensor& out, const char* what) {
  const uint64_t canary = canary_bits(config_.act_dtype);
  const int64_t row_size = H_ * P_;
  for (int64_t row = 0; row < batch_; ++row) {
    const bool pad = in.is_pad(row, config_.pad_slot_id);
    for (int64_t i = row * row_size; i < (row + 1) * row_size; ++i) {
      const bool untouched = out.bits(i) == canary;
      if (pad == untouched) continue;
      std::ostringstream os;
      os << "step " << step_ << ": " << what << index_string(out.shape(), i)
         << (pad ? " of a pad row was written" : " was not written");
      report_.fail(pad ? Check::kPadRowWritten : Check::kOutputNotWritten, os.str());
      break;
    }
  }
}

namespace {

// (max |out - exact| beyond out's own rounding) / max |exact| over the non-pad rows. The excess
// over half an ulp of out is the error of the computation before its final rounding, so a 16-bit
// out that is the correct rounding of a value within e of the exact one scores at most e.
struct OutputError {
  double relative = 0;
  int64_t worst = -1;  // flat index of the worst element
};

}  // namespace

// The replay computes its outputs in fp32 from the checkpoint as stored and the buffer, so it
// matches the exact recurrence restarted from that checkpoint (the window oracle) as closely as
// an fp32 state matches the oracle, whatever the checkpoint's format.
void Rollout::check_replay_against_checkpoint(const StepInputs& in, const HostTensor& out,
                                              const HostTensor& window_out) {
  const int64_t row_size = H_ * P_;
  double max_exact = 0, worst = 0;
  int64_t worst_index = -1;
  for (int64_t row = 0; row < batch_; ++row) {
    if (in.is_pad(row, config_.pad_slot_id)) continue;
    for (int64_t i = row * row_size; i < (row + 1) * row_size; ++i) {
      const double v = out.get(i), exact = window_out.get(i);
      max_exact = std::max(max_exact, std::fabs(exact));
      double excess = std::fabs(v - exact) - 0.5 * ulp(config_.act_dtype, v);
      if (!std::isfinite(v)) excess = INFINITY;
      if (excess > worst) {
        worst = excess;
        worst_index = i;
      }
    }
  }
  if (max_exact == 0 || worst / max_exact <= kFp32Tolerance) return;
  std::ostringstream os;
  os << "step " << step_ << ": replay out" << index_string(out.shape(), worst_index) << " = "
     << out.get(worst_index) << ", exact from the stored checkpoint " << window_out.get(worst_index)
     << ": relative error " << worst / max_exact << " > " << kFp32Tolerance;
  report_.fail(Check::kOutputError, os.str());
}

void Rollout::check_outputs(const StepInputs& in, const HostTensor& out, const HostTensor& baseline_out,
                            const HostTensor& oracle_out) {
  const int64_t row_size = H_ * P_;
  double max_exact = 0;
  for (int64_t row = 0; row < batch_; ++row)
    if (!in.is_pad(row, config_.pad_slot_id))
      for (int64_t i = row * row_size; i < (row + 1) * row_size; ++i)
        max_exact = std::max(max_exact, std::fabs(oracle_out.get(i)));
  if (max_exact == 0) return;  // no row in this step

  auto error_of = [&](const HostTensor& y) {
    OutputError e;
    double worst = -1;
    for (int64_t row = 0; row < batch_; ++row) {
      if (in.is_pad(row, config_.pad_slot_id)) continue;
      for (int64_t i = row * row_size; i < (row + 1) * row_size; ++i) {
        const double v = y.get(i), exact = oracle_out.get(i);
        double excess = std::fabs(v - exact) - 0.5 * ulp(config_.act_dtype, v);
        if (!std::isfinite(v)) excess = INFINITY;
        if (excess > worst) {
          worst = excess;
          e.worst = i;
        }
      }
    }
    e.relative = std::max(worst, 0.0) / max_exact;
    return e;
  };
  const OutputError replay = error_of(out);
  report_.max_replay_error = std::max(report_.max_replay_error, replay.relative);
  auto describe = [&](const char* what, const HostTensor& y, const OutputError& e, double bound) {
    std::ostringstream os;
    os << "step " << step_ << ": " << what << " relative error " << e.relative << " > " << bound
       << " at out" << index_string(y.shape(), e.worst) << " = " << y.get(e.worst) << ", exact "
       << oracle_out.get(e.worst) << " (max |exact| " << max_exact << ")";
    return os.str();
  };
  if (!has_baseline()) {
    const double flushes = double(step_ / L_ + 1);  // at most, for any slot, so far
    const double bound = kDriftRoundoffs * flushes * relative_rounding(config_.state_dtype, config_.stochastic_rounding);
    if (!(replay.relative <= bound))
      report_.fail(Check::kOutputError, describe("replay (format bound)", out, replay, bound));
    return;
  }
  const OutputError baseline = error_of(baseline_out);
  report_.max_baseline_error = std::max(report_.max_baseline_error, baseline.relative);
  if (config_.state_dtype == DType::kFloat32) {
    if (!(replay.relative <= kFp32Tolerance))
      report_.fail(Check::kOutputError, describe("replay", out, replay, kFp32Tolerance));
    if (!(baseline.relative <= kFp32Tolerance))
      report_.fail(Check::kOutputError, describe("baseline", baseline_out, baseline, kFp32Tolerance));
    return;
  }
  if (!std::isfinite(baseline.relative)) {
    report_.fail(Check::kOutputError, describe("baseline", baseline_out, baseline, INFINITY));
    return;
  }
  const double bound = 2 * baseline.relative + kStepFloorRoundoffs * unit_roundoff(config_.state_dtype);
  if (!(replay.relative <= bound))
    report_.fail(Check::kOutputError, describe("replay (2 x baseline + floor)", out, replay, bound));
}

void Rollout::check_rollout_error() {
  if (config_.state_dtype == DType::kFloat32 || !has_baseline()) return;  // checked at every step
  if (report_.max_replay_error <= 2 * report_.max_baseline_error) return;
  std::ostringstream os;
  os << "max replay output error over the rollout " << report_.max_replay_error
     << " > 2 x the baseline's " << report_.max_baseline_error;
  report_.fail(Check::kOutputError, os.str());
}

// Only the split path writes the workspace (its dot kernel's dots for the window kernel).
void Rollout::check_split_path() {
  if (!config_.expect_split_path) return;
  const std::vector<uint8_t> bytes = workspace_.download();
  if (std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == kWorkspaceFill; }))
    report_.fail(Check::kSplitPathNotTaken, "no call wrote its workspace: the calls fell back to the single kernel");
}

void Rollout::check_caches() {
  const struct {
    const char* name;
    const Buffer& actual;
    const HostTensor& expected;
  } caches[] = {{"x_cache", x_cache_, expected_x_cache_},
                {"B_cache", B_cache_, expected_B_cache_},
                {"dt_cache", dt_cache_, expected_dt_cache_}};
  for (const auto& c : caches) {
    const HostTensor actual = download_tensor(c.actual, c.expected.dtype(), c.expected.shape());
    const int64_t i = first_difference(actual, c.expected, 0, actual.numel());
    if (i < 0) continue;
    std::ostringstream os;
    os << "step " << step_ << ": " << c.name << index_string(actual.shape(), i) << " is "
       << bits_string(actual.bits(i)) << ", expected " << bits_string(c.expected.bits(i))
       << " (slot, head or group, position, channel)";
    report_.fail(Check::kCache, os.str());
  }
}

void Rollout::check_checkpoint(const StepInputs& in, const std::vector<bool>& flushes,
                               const HostTensor& before, const HostTensor& after,
                               const HostTensor& scale_before, const HostTensor& scale_after) {
  std::vector<bool> flushed(size_t(slots_), false);
  for (int64_t row = 0; row < batch_; ++row)
    if (flushes[row]) flushed[size_t(in.row_slot[row])] = true;
  const int64_t n = H_ * P_ * N_;
  const DType state = config_.state_dtype;
  const bool scaled = is_scaled_checkpoint(state);
  // An element's value and the spacing of its format there (8-bit: times the row's scale).
  auto value = [&](int64_t i) { return scaled ? scale_after.get(i / N_) * after.get(i) : after.get(i); };
  auto spacing = [&](int64_t i) {
    return scaled ? scale_after.get(i / N_) * ulp(state, after.get(i)) : ulp(state, after.get(i));
  };
  // Round to nearest moves a value by at most half a step, stochastic rounding by less than one.
  const double steps_allowed = config_.stochastic_rounding ? 1.0 : 0.5;
  for (int64_t slot = 0; slot < slots_; ++slot) {
    const int64_t begin = slot * n, end = begin + n;
    if (!flushed[slot]) {
      int64_t i = first_difference(before, after, begin, end);
      if (i < 0 && scaled) {
        const int64_t r = first_difference(scale_before, scale_after, begin / N_, end / N_);
        if (r >= 0) i = r * N_;
      }
      if (i >= 0) {
        std::ostringstream os;
        os << "step " << step_ << ": checkpoint" << index_string(after.shape(), i) << " (or its scale) changed"
           << " although slot " << slot << " did not flush";
        report_.fail(Check::kCheckpointTouched, os.str());
      }
      continue;
    }
    // The flushed checkpoint is the state dtype's rounding of the exact state computed from the
    // previous checkpoint and the window, up to fp32 arithmetic.
    double max_window = 0, max_oracle = 0, max_oracle_error = 0;
    for (int64_t i = begin; i < end; ++i) {
      max_window = std::max(max_window, std::fabs(window_oracle_state_.get(i)));
      max_oracle = std::max(max_oracle, std::fabs(oracle_state_.get(i)));
      max_oracle_error = std::max(max_oracle_error, std::fabs(value(i) - oracle_state_.get(i)));
    }
    for (int64_t i = begin; i < end; ++i) {
      const double v = value(i), exact = window_oracle_state_.get(i);
      if (std::fabs(v - exact) <= steps_allowed * spacing(i) + kFp32Tolerance * max_window) continue;
      std::ostringstream os;
      os << "step " << step_ << ": flushed checkpoint" << index_string(after.shape(), i) << " = " << v
         << ", exact state from the previous checkpoint " << exact << " (max |state| " << max_window << ")";
      report_.fail(Check::kFlushedCheckpoint, os.str());
      break;
    }
    // 8-bit: each row's scale maps the row's largest magnitude to the format's largest value.
    for (int64_t r = begin / N_; scaled && r < end / N_; ++r) {
      double absmax = 0;
      for (int64_t i = r * N_; i < (r + 1) * N_; ++i) absmax = std::max(absmax, std::fabs(window_oracle_state_.get(i)));
      const double format_max = state == DType::kInt8 ? kInt8Max : kFloat8E4M3Max;
      if (std::fabs(scale_after.get(r) * format_max - absmax) <= kFp32Tolerance * max_window) continue;
      std::ostringstream os;
      os << "step " << step_ << ": state_scale" << index_string(scale_after.shape(), r) << " = "
         << scale_after.get(r) << ", but the row's absmax / " << format_max << " is " << absmax / format_max;
      report_.fail(Check::kFlushedCheckpoint, os.str());
      break;
    }
    if (state == DType::kFloat32) {
      const double relative = max_oracle_error / max_oracle;
      report_.max_checkpoint_error = std::max(report_.max_checkpoint_error, relative);
      if (!(relative <= kFp32Tolerance)) {
        std::ostringstream os;
        os << "step " << step_ << ": flushed checkpoint of slot " << slot << " vs the oracle state: relative error "
           << relative << " > " << kFp32Tolerance;
        report_.fail(Check::kFlushedCheckpoint, os.str());
      }
    }
    for (int64_t i = begin; i < end; ++i) window_oracle_state_.set(i, value(i));
  }
}

void Rollout::check_flush_counts(const StepInputs& in, const std::vector<bool>& flushes) {
  if (!config_.stochastic_rounding) return;
  for (int64_t row = 0; row < batch_; ++row)
    if (flushes[row]) ++expected_flush_counts_[size_t(in.row_slot[row])];
  std::vector<int32_t> actual(static_cast<size_t>(slots_));
  flush_counts_.download(actual.data(), 0, flush_counts_.bytes());
  for (int64_t slot = 0; slot < slots_; ++slot) {
    if (actual[slot] == expected_flush_counts_[slot]) continue;
    std::ostringstream os;
    os << "step " << step_ << ": flush_counts[" << slot << "]=" << actual[slot] << ", expected "
       << expected_flush_counts_[slot];
    report_.fail(Check::kFlushCounts, os.str());
  }
}

void Rollout::check_cursors() {
  std::vector<int32_t> actual(static_cast<size_t>(slots_));
  cursors_.download(actual.data(), 0, cursors_.bytes());
  for (int64_t slot = 0; slot < slots_; ++slot) {
    if (actual[slot] == expected_cursors_[slot]) continue;
    std::ostringstream os;
    os << "step " << step_ << ": cursors[" << slot << "]=" << actual[slot] << ", expected "
       << expected_cursors_[slot];
    report_.fail(Check::kCursor, os.str());
  }
}

void Rollout::check_baseline_state(const StepInputs& in, const HostTensor& before, const HostTensor& after) {
  std::vector<bool> used(size_t(slots_), false);
  for (int64_t row = 0; row < batch_; ++row)
    if (!in.is_pad(row, config_.pad_slot_id)) used[size_t(in.row_slot[row])] = true;
  const int64_t n = H_ * P_ * N_;
  for (int64_t slot = 0; slot < slots_; ++slot) {
    if (used[slot]) continue;
    const int64_t i = first_difference(before, after, slot * n, (slot + 1) * n);
    if (i < 0) continue;
    std::ostringstream os;
    os << "step " << step_ << ": baseline state" << index_string(after.shape(), i) << " of unused slot "
       << slot << " changed";
    report_.fail(Check::kBaselineStateTouched, os.str());
  }
}

}  // namespace replayssm::test
