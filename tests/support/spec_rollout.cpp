#include "support/spec_rollout.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>

namespace replayssm::test {
namespace {

// The promises of rollout.cpp: fp32 state within 1e-5 relative of the fp64 oracle; a 16-bit
// state within 2x the error of the same-precision baseline, plus one unit roundoff of the state
// format per step.
constexpr double kFp32Tolerance = 1e-5;
constexpr double kStepFloorRoundoffs = 1.0;

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

HostTensor download_tensor(const Buffer& buffer, DType dtype, std::vector<int64_t> shape) {
  HostTensor t(dtype, std::move(shape));
  buffer.download(t.data(), 0, t.bytes().size());
  return t;
}

Buffer upload_ints(Device device, const std::vector<int32_t>& values) {
  Buffer b(device, values.size() * 4);
  b.upload(values.data(), 0, b.bytes());
  return b;
}

const char* acceptance_tag(Acceptance a) {
  switch (a) {
    case Acceptance::kAll: return "acceptall";
    case Acceptance::kBonusOnly: return "bonusonly";
    case Acceptance::kMixed: return "mixed";
  }
  return "unknown";
}

}  // namespace

std::string SpecRolloutConfig::name() const {
  std::ostringstream os;
  os << geometry.name << "_T" << window << "_L" << buffer_len << "_s" << short_dtype_name(state_dtype)
     << "_a" << short_dtype_name(act_dtype) << "_" << acceptance_tag(acceptance);
  if (!ragged) os << "_fullwindows";
  if (identity_rows) os << "_identityrows";
  os << "_steps" << steps;
  if (recycles != 1) os << "_recycles" << recycles;
  if (pad_slot_id != -1) os << "_padid" << (pad_slot_id < 0 ? "minus" : "") << std::llabs(pad_slot_id);
  if (workspace) os << "_workspace";
  return os.str();
}

void PrintTo(const SpecRolloutConfig& config, std::ostream* os) {
  *os << config.name() << " on " << backend_name(config.backend);
}

struct SpecRollout::StepInputs {
  std::vector<int32_t> row_slot;  // (batch): slot of each row, pad_slot_id for a pad row
  std::vector<int32_t> valid;     // (batch): tokens each row carries
  std::vector<int32_t> accepted;  // (batch): accepted count of each row (1 for pad rows)
  std::vector<bool> flush;        // (batch): the row flushes on this verify
  std::vector<int32_t> origin, committed;  // (batch): the row's ring before the step
  HostTensor x, dt, B, C, z;      // as the backend reads them: (batch, T, ...)
  HostTensor x32, dt32, B32, C32, z32;  // the same values in fp32, for the oracle
};

SpecRollout::SpecRollout(const SpecRolloutConfig& config)
    : config_(config),
      H_(config.geometry.nheads),
      P_(config.geometry.head_dim),
      N_(config.geometry.state_dim),
      G_(config.geometry.ngroups),
      T_(config.window),
      L_(config.buffer_len),
      R_(spec_ring_len(config.buffer_len, config.window)),
      batch_(config.requests + (config.identity_rows ? 0 : config.pad_rows)),
      slots_(config.requests + config.foreign_slots),
      device_(device_for(config.backend)),
      rng_(config.seed) {
  const int64_t Q = config.requests;
  std::uniform_int_distribution<int64_t> start_step(0, 3);
  for (int64_t q = 0; q < Q; ++q)
    request_start_.push_back(q == 0 || config.identity_rows ? 0 : start_step(rng_));
  for (int64_t k = 1; k <= config.recycles; ++k)
    recycle_steps_.push_back(4 + k * (config.steps - 4) / (config.recycles + 1));
  std::vector<int64_t> slot_order(static_cast<size_t>(slots_));
  std::iota(slot_order.begin(), slot_order.end(), 0);
  if (!config.identity_rows) std::shuffle(slot_order.begin(), slot_order.end(), rng_);
  request_slot_.assign(slot_order.begin(), slot_order.begin() + Q);

  const DType act = config.act_dtype, state = config.state_dtype;
  const int64_t a = dtype_size(act), s = dtype_size(state);
  if (config.workspace) workspace_ = Buffer(device_, size_t(spec_verify_workspace_bytes(batch_, T_, H_, P_)));
  checkpoint_ = Buffer(device_, size_t(slots_ * H_ * P_ * N_ * s));
  baseline_state_ = Buffer(device_, size_t(slots_ * T_ * H_ * P_ * N_ * s));
  x_cache_ = Buffer(device_, size_t(slots_ * H_ * R_ * P_ * a));
  B_cache_ = Buffer(device_, size_t(slots_ * G_ * R_ * N_ * a));
  dt_cache_ = Buffer(device_, size_t(slots_ * H_ * R_ * 4));
  ring_ = Buffer(device_, size_t(slots_ * 2 * 4));
  x_ = Buffer(device_, size_t(batch_ * T_ * H_ * P_ * a));
  z_ = Buffer(device_, x_.bytes());
  out_ = Buffer(device_, x_.bytes());
  baseline_out_ = Buffer(device_, x_.bytes());
  B_ = Buffer(device_, size_t(batch_ * T_ * G_ * N_ * a));
  C_ = Buffer(device_, B_.bytes());
  dt_ = Buffer(device_, size_t(batch_ * T_ * H_ * a));
  valid_ = Buffer(device_, size_t(batch_ * 4));
  indices_ = Buffer(device_, size_t(batch_ * 4));
  baseline_indices_ = Buffer(device_, size_t(batch_ * T_ * 4));
  accepted_ = Buffer(device_, size_t(batch_ * 4));
  previous_accepted_ = Buffer(device_, size_t(batch_ * 4));

  std::uniform_real_distribution<double> decay_rate(-8.0, -0.5), bias(-1.0, 1.0);
  std::normal_distribution<double> unit_normal;
  A32_ = HostTensor(DType::kFloat32, {H_});
  D32_ = HostTensor(DType::kFloat32, {H_});
  dt_bias32_ = HostTensor(DType::kFloat32, {H_});
  for (int64_t h = 0; h < H_; ++h) {
    A32_.set(h, decay_rate(rng_));
    D32_.set(h, unit_normal(rng_));
    dt_bias32_.set(h, bias(rng_));
  }
  A_ = upload_copy(device_, A32_);
  D_ = upload_copy(device_, D32_);
  dt_bias_ = upload_copy(device_, dt_bias32_);

  oracle_state_ = HostTensor(DType::kFloat64, {slots_, H_, P_, N_});
  window_oracle_state_ = HostTensor(DType::kFloat64, {slots_, H_, P_, N_});
  baseline_accepted_.assign(size_t(slots_), 1);
  for (int64_t slot = 0; slot < slots_; ++slot) write_initial_state(slot, random_state());

  // Caches start as canaries: a kernel that reads an entry nobody wrote turns an output into NaN.
  expected_x_cache_ = HostTensor(act, {slots_, H_, R_, P_});
  expected_B_cache_ = HostTensor(act, {slots_, G_, R_, N_});
  expected_dt_cache_ = HostTensor(DType::kFloat32, {slots_, H_, R_});
  for (HostTensor* t : {&expected_x_cache_, &expected_B_cache_, &expected_dt_cache_})
    t->fill_bits(canary_bits(t->dtype()));
  x_cache_.upload(expected_x_cache_);
  B_cache_.upload(expected_B_cache_);
  dt_cache_.upload(expected_dt_cache_);

  // Rings start anywhere valid; the requests' slots are reset as a serving engine would.
  std::uniform_int_distribution<int32_t> any_origin(0, int32_t(R_ - 1)), any_committed(0, int32_t(L_ - T_));
  expected_ring_.resize(size_t(2 * slots_));
  for (int64_t slot = 0; slot < slots_; ++slot) {
    expected_ring_[size_t(2 * slot)] = any_origin(rng_);
    expected_ring_[size_t(2 * slot + 1)] = any_committed(rng_);
  }
  ring_.upload(expected_ring_.data(), 0, ring_.bytes());
  std::vector<int32_t> request_slots(request_slot_.begin(), request_slot_.end());
  request_slots.push_back(int32_t(config.pad_slot_id));
  reset_rings(request_slots);
}

HostTensor SpecRollout::random_state() {
  std::normal_distribution<double> unit_normal;
  HostTensor s(config_.state_dtype, {H_, P_, N_});
  for (int64_t i = 0; i < s.numel(); ++i) s.set(i, unit_normal(rng_));
  return s;
}

void SpecRollout::write_initial_state(int64_t slot, const HostTensor& state) {
  const int64_t n = H_ * P_ * N_;
  const size_t bytes = state.bytes().size();
  checkpoint_.upload(state.data(), size_t(slot) * bytes, bytes);
  baseline_state_.upload(state.data(), size_t(slot * T_) * bytes, bytes);  // column 0
  baseline_accepted_[size_t(slot)] = 1;
  for (int64_t i = 0; i < n; ++i) {
    oracle_state_.set(slot * n + i, state.get(i));
    window_oracle_state_.set(slot * n + i, state.get(i));
  }
}

void SpecRollout::reset_rings(const std::vector<int32_t>& slots) {
  reset_slots_ = upload_ints(device_, slots);
  spec_reset(ring_.view(DType::kInt32, {slots_, 2}), reset_slots_.view(DType::kInt32, {int64_t(slots.size())}),
             config_.pad_slot_id, ExecOptions{config_.backend});
  for (int32_t s : slots)
    if (s != config_.pad_slot_id) {
      expected_ring_[size_t(2 * s)] = 0;
      expected_ring_[size_t(2 * s + 1)] = 0;
    }
}

void SpecRollout::recycle_one_slot() {
  // Prefer a request with committed inputs, so that the reset has something to forget.
  const int64_t Q = config_.requests;
  int64_t chosen = -1;
  for (int64_t k = 0; k < Q && chosen < 0; ++k) {
    const int64_t q = (next_recycle_request_ + k) % Q;
    if (step_ >= request_start_[q] && expected_ring_[size_t(2 * request_slot_[q] + 1)] != 0) chosen = q;
  }
  for (int64_t q = 0; q < Q && chosen < 0; ++q)
    if (step_ >= request_start_[q]) chosen = q;
  next_recycle_request_ = chosen + 1;
  const int64_t slot = request_slot_[chosen];
  write_initial_state(slot, random_state());
  reset_rings({int32_t(config_.pad_slot_id), int32_t(slot)});
  ++report_.recycled_slots;
}

int64_t SpecRollout::slot_with_history() const {
  for (size_t q = 0; q < request_slot_.size(); ++q)
    if (step_ >= request_start_[q] && expected_ring_[size_t(2 * request_slot_[q] + 1)] > 0)
      return request_slot_[q];
  return -1;
}

void SpecRollout::choose_rows(StepInputs& in) {
  const int32_t pad = int32_t(config_.pad_slot_id);
  std::vector<int64_t> order(static_cast<size_t>(batch_));
  std::iota(order.begin(), order.end(), 0);
  if (!config_.identity_rows) std::shuffle(order.begin(), order.end(), rng_);
  std::uniform_int_distribution<int32_t> any_count(1, int32_t(T_));
  in.row_slot.assign(size_t(batch_), pad);
  in.valid.assign(size_t(batch_), 0);
  in.accepted.assign(size_t(batch_), 1);
  in.flush.assign(size_t(batch_), false);
  in.origin.assign(size_t(batch_), 0);
  in.committed.assign(size_t(batch_), 0);
  for (int64_t row = 0; row < batch_; ++row) {
    const int64_t q = order[row];
    const bool live = q < config_.requests && step_ >= request_start_[q];
    in.valid[row] = config_.ragged ? any_count(rng_) : int32_t(T_);  // pad rows too: ignored
    if (!live) continue;
    const int32_t slot = int32_t(request_slot_[q]);
    in.row_slot[row] = slot;
    in.origin[row] = expected_ring_[size_t(2 * slot)];
    in.committed[row] = expected_ring_[size_t(2 * slot + 1)];
    in.flush[row] = in.committed[row] + 2 * T_ > L_;
    const int32_t n = in.valid[row];
    int32_t k = n;
    switch (config_.acceptance) {
      case Acceptance::kAll: k = n; break;
      case Acceptance::kBonusOnly: k = 1; break;
      case Acceptance::kMixed: {
        const int kind = std::uniform_int_distribution<int>(0, 2)(rng_);
        k = kind == 0 ? n : kind == 1 ? 1 : std::uniform_int_distribution<int32_t>(1, n)(rng_);
        break;
      }
    }
    in.accepted[row] = k;
    if (n > 1) {
      if (k == n) ++acceptance_.all;
      else if (k == 1) ++acceptance_.bonus_only;
      else ++acceptance_.partial;
    }
  }
}

void SpecRollout::generate_inputs(StepInputs& in) {
  const DType act = config_.act_dtype;
  std::normal_distribution<double> unit_normal, raw_dt(-2.0, 1.0);
  auto fill = [&](HostTensor& t, HostTensor& t32, std::vector<int64_t> shape, auto draw) {
    t = HostTensor(act, shape);
    t32 = HostTensor(DType::kFloat32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      t.set(i, draw());
      t32.set(i, t.get(i));  // exact: the oracle reads the rounded value
    }
  };
  auto normal = [&] { return unit_normal(rng_); };
  fill(in.x, in.x32, {batch_, T_, H_, P_}, normal);
  fill(in.B, in.B32, {batch_, T_, G_, N_}, normal);
  fill(in.C, in.C32, {batch_, T_, G_, N_}, normal);
  fill(in.z, in.z32, {batch_, T_, H_, P_}, normal);
  fill(in.dt, in.dt32, {batch_, T_, H_}, [&] { return raw_dt(rng_); });
  x_.upload(in.x);
  B_.upload(in.B);
  C_.upload(in.C);
  z_.upload(in.z);
  dt_.upload(in.dt);
  valid_.upload(in.valid.data(), 0, valid_.bytes());
  indices_.upload(in.row_slot.data(), 0, indices_.bytes());
  std::vector<int32_t> baseline_slots(size_t(batch_ * T_), int32_t(config_.pad_slot_id));
  std::vector<int32_t> previous(size_t(batch_), 1);
  for (int64_t row = 0; row < batch_; ++row) {
    const int32_t slot = in.row_slot[row];
    if (slot == config_.pad_slot_id) continue;
    for (int64_t t = 0; t < T_; ++t) baseline_slots[size_t(row * T_ + t)] = int32_t(slot * T_ + t);
    previous[size_t(row)] = baseline_accepted_[size_t(slot)];
  }
  baseline_indices_.upload(baseline_slots.data(), 0, baseline_indices_.bytes());
  previous_accepted_.upload(previous.data(), 0, previous_accepted_.bytes());
  accepted_.upload(in.accepted.data(), 0, accepted_.bytes());
}

Mamba2Window SpecRollout::window_under_test(const Buffer& out, bool baseline) const {
  const DType act = config_.act_dtype;
  Mamba2Window w;
  w.x = x_.view(act, {batch_, T_, H_, P_});
  w.dt = dt_.view(act, {batch_, T_, H_});
  w.A = A_.view(DType::kFloat32, {H_});
  w.B = B_.view(act, {batch_, T_, G_, N_});
  w.C = C_.view(act, {batch_, T_, G_, N_});
  w.D = D_.view(DType::kFloat32, {H_});
  w.z = z_.view(act, {batch_, T_, H_, P_});
  w.dt_bias = dt_bias_.view(DType::kFloat32, {H_});
  w.dt_softplus = true;
  if (config_.ragged) w.num_valid_tokens = valid_.view(DType::kInt32, {batch_});
  if (baseline)
    w.state_batch_indices = baseline_indices_.view(DType::kInt32, {batch_, T_});
  else if (!config_.identity_rows)
    w.state_batch_indices = indices_.view(DType::kInt32, {batch_});
  w.pad_slot_id = config_.pad_slot_id;
  w.out = out.view(act, {batch_, T_, H_, P_});
  return w;
}

// Token t of every row as one decode step of the oracle, in fp32 views into the window tensors;
// rows without a token t are mapped to the pad slot.
Mamba2Step SpecRollout::oracle_position(StepInputs& in, int64_t t, HostTensor& indices, HostTensor& out) {
  auto position = [&](HostTensor& window, int64_t heads, int64_t channels) {
    return make_view(static_cast<float*>(window.data()) + t * heads * channels, DType::kFloat32,
                     {batch_, heads, channels}, {}, {T_ * heads * channels, channels, 1});
  };
  indices = HostTensor(DType::kInt32, {batch_});
  for (int64_t row = 0; row < batch_; ++row)
    indices.set(row, t < in.valid[row] ? in.row_slot[row] : int32_t(config_.pad_slot_id));
  out = HostTensor(DType::kFloat32, {batch_, H_, P_});
  Mamba2Step s;
  s.x = position(in.x32, H_, P_);
  s.dt = make_view(static_cast<float*>(in.dt32.data()) + t * H_, DType::kFloat32, {batch_, H_}, {},
                   {T_ * H_, 1});
  s.A = A32_.view();
  s.B = position(in.B32, G_, N_);
  s.C = position(in.C32, G_, N_);
  s.D = D32_.view();
  s.z = position(in.z32, H_, P_);
  s.dt_bias = dt_bias32_.view();
  s.dt_softplus = true;
  s.state_batch_indices = indices.view();
  s.pad_slot_id = config_.pad_slot_id;
  s.out = out.view();
  return s;
}

void SpecRollout::run() {
  while (!done()) step();
  check_rollout_error();
}

void SpecRollout::step() {
  if (done()) return;
  if (std::find(recycle_steps_.begin(), recycle_steps_.end(), step_) != recycle_steps_.end())
    recycle_one_slot();

  StepInputs in;
  choose_rows(in);
  generate_inputs(in);
  const DType act = config_.act_dtype, state = config_.state_dtype;
  const std::vector<int64_t> out_shape{batch_, T_, H_, P_}, state_shape{slots_, H_, P_, N_};
  HostTensor canaries(act, out_shape);
  canaries.fill_bits(canary_bits(act));
  out_.upload(canaries);
  baseline_out_.upload(canaries);
  const HostTensor checkpoint_before = download_tensor(checkpoint_, state, state_shape);

  const ExecOptions options{config_.backend};
  const SpecCache cache{checkpoint_.view(state, state_shape), x_cache_.view(act, {slots_, H_, R_, P_}),
                        B_cache_.view(act, {slots_, G_, R_, N_}),
                        dt_cache_.view(DType::kFloat32, {slots_, H_, R_}),
                        ring_.view(DType::kInt32, {slots_, 2})};
  ExecOptions verify_options = options;
  if (config_.workspace) {
    verify_options.workspace = workspace_.view(DType::kInt8, {int64_t(workspace_.bytes())});
    verify_options.window_kernel = WindowKernel::kSeparate;
  }
  spec_verify(cache, window_under_test(out_, false), L_, verify_options);
  spec_state_update(baseline_state_.view(state, {slots_ * T_, H_, P_, N_}),
                    window_under_test(baseline_out_, true),
                    previous_accepted_.view(DType::kInt32, {batch_}), options);
  spec_commit(cache.ring, accepted_.view(DType::kInt32, {batch_}), T_, L_,
              config_.identity_rows ? TensorView{} : indices_.view(DType::kInt32, {batch_}),
              config_.pad_slot_id, options);

  // Checkpoints first: a flushed one is compared with the oracles before this window's tokens.
  check_checkpoints(in, checkpoint_before, download_tensor(checkpoint_, state, state_shape));

  // The oracle decodes the window one token at a time from each slot's committed state; the
  // state after the last accepted token becomes the committed one.
  HostTensor scratch = oracle_state_, window_scratch = window_oracle_state_;
  HostTensor oracle_out(DType::kFloat32, out_shape);
  const ExecOptions reference{Backend::kReference};
  const int64_t n = H_ * P_ * N_, row_size = H_ * P_;
  for (int64_t t = 0; t < T_; ++t) {
    HostTensor indices, position_out, unused_indices, unused_out;
    selective_state_update(scratch.view(), oracle_position(in, t, indices, position_out), reference);
    selective_state_update(window_scratch.view(), oracle_position(in, t, unused_indices, unused_out),
                           reference);
    for (int64_t row = 0; row < batch_; ++row) {
      std::memcpy(static_cast<float*>(oracle_out.data()) + (row * T_ + t) * row_size,
                  static_cast<const float*>(position_out.data()) + row * row_size, size_t(row_size) * 4);
      if (in.row_slot[row] == config_.pad_slot_id || in.accepted[row] - 1 != t) continue;
      const int64_t begin = in.row_slot[row] * n;
      std::memcpy(static_cast<double*>(oracle_state_.data()) + begin,
                  static_cast<const double*>(scratch.data()) + begin, size_t(n) * 8);
      std::memcpy(static_cast<double*>(window_oracle_state_.data()) + begin,
                  static_cast<const double*>(window_scratch.data()) + begin, size_t(n) * 8);
    }
  }

  record_expected_caches(in);
  for (int64_t row = 0; row < batch_; ++row) {  // the commit, as the contract states it
    const int32_t slot = in.row_slot[row];
    if (slot == config_.pad_slot_id) continue;
    int32_t& origin = expected_ring_[size_t(2 * slot)];
    int32_t& committed = expected_ring_[size_t(2 * slot + 1)];
    if (in.flush[row]) {
      origin = int32_t((origin + committed) % R_);
      committed = 0;
    }
    committed += in.accepted[row];
    baseline_accepted_[size_t(slot)] = in.accepted[row];
  }

  const HostTensor out = download_tensor(out_, act, out_shape);
  const HostTensor baseline_out = download_tensor(baseline_out_, act, out_shape);
  check_canaries(in, out, "replay out");
  check_canaries(in, baseline_out, "baseline out");
  check_outputs(in, out, baseline_out, oracle_out);
  check_caches();
  check_ring();
  ++report_.steps;
  ++step_;
}

void SpecRollout::record_expected_caches(const StepInputs& in) {
  for (int64_t row = 0; row < batch_; ++row) {
    const int64_t slot = in.row_slot[row];
    if (slot == config_.pad_slot_id) continue;
    ++(in.flush[row] ? report_.flush_rows : report_.nonflush_rows);
    for (int64_t t = 0; t < in.valid[row]; ++t) {
      const int64_t pos = (in.origin[row] + in.committed[row] + t) % R_;
      for (int64_t h = 0; h < H_; ++h) {
        for (int64_t p = 0; p < P_; ++p)
          expected_x_cache_.set_bits(((slot * H_ + h) * R_ + pos) * P_ + p,
                                     in.x.bits(((row * T_ + t) * H_ + h) * P_ + p));
        expected_dt_cache_.set((slot * H_ + h) * R_ + pos, in.dt.get((row * T_ + t) * H_ + h));
      }
      for (int64_t g = 0; g < G_; ++g)
        for (int64_t k = 0; k < N_; ++k)
          expected_B_cache_.set_bits(((slot * G_ + g) * R_ + pos) * N_ + k,
                                     in.B.bits(((row * T_ + t) * G_ + g) * N_ + k));
    }
  }
}

void SpecRollout::check_canaries(const StepInputs& in, const HostTensor& out, const char* what) {
  const uint64_t canary = canary_bits(config_.act_dtype);
  const int64_t row_size = H_ * P_;
  for (int64_t row = 0; row < batch_; ++row) {
    const bool pad = in.row_slot[row] == config_.pad_slot_id;
    for (int64_t t = 0; t < T_; ++t) {
      const bool must_write = !pad && t < in.valid[row];
      const int64_t begin = (row * T_ + t) * row_size;
      for (int64_t i = begin; i < begin + row_size; ++i) {
        const bool untouched = out.bits(i) == canary;
        if (must_write != untouched) continue;
        std::ostringstream os;
        os << "step " << step_ << ": " << what << index_string(out.shape(), i)
           << (must_write ? " was not written"
               : pad      ? " of a pad row was written"
                          : " past the row's valid tokens was written");
        report_.fail(must_write ? Check::kOutputNotWritten : Check::kPadRowWritten, os.str());
        break;
      }
    }
  }
}

void SpecRollout::check_outputs(const StepInputs& in, const HostTensor& out, const HostTensor& baseline_out,
                                const HostTensor& oracle_out) {
  const int64_t row_size = H_ * P_;
  auto valid_elements = [&](auto&& visit) {
    for (int64_t row = 0; row < batch_; ++row) {
      if (in.row_slot[row] == config_.pad_slot_id) continue;
      for (int64_t t = 0; t < in.valid[row]; ++t)
        for (int64_t i = (row * T_ + t) * row_size; i < (row * T_ + t + 1) * row_size; ++i) visit(i);
    }
  };
  double max_exact = 0;
  valid_elements([&](int64_t i) { max_exact = std::max(max_exact, std::fabs(oracle_out.get(i))); });
  if (max_exact == 0) return;  // no row in this step

  struct Error {
    double relative = 0;
    int64_t worst = -1;
  };
  auto error_of = [&](const HostTensor& y) {
    Error e;
    double worst = -1;
    valid_elements([&](int64_t i) {
      const double v = y.get(i);
      double excess = std::fabs(v - oracle_out.get(i)) - 0.5 * ulp(config_.act_dtype, v);
      if (!std::isfinite(v)) excess = INFINITY;
      if (excess > worst) {
        worst = excess;
        e.worst = i;
      }
    });
    e.relative = std::max(worst, 0.0) / max_exact;
    return e;
  };
  const Error replay = error_of(out), baseline = error_of(baseline_out);
  report_.max_replay_error = std::max(report_.max_replay_error, replay.relative);
  report_.max_baseline_error = std::max(report_.max_baseline_error, baseline.relative);
  auto describe = [&](const char* what, const HostTensor& y, const Error& e, double bound) {
    std::ostringstream os;
    os << "step " << step_ << ": " << what << " relative error " << e.relative << " > " << bound
       << " at out" << index_string(y.shape(), e.worst) << " = " << y.get(e.worst) << ", exact "
       << oracle_out.get(e.worst) << " (max |exact| " << max_exact << ")";
    return os.str();
  };
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

void SpecRollout::check_rollout_error() {
  if (config_.state_dtype == DType::kFloat32) return;  // checked at every step
  if (report_.max_replay_error <= 2 * report_.max_baseline_error) return;
  std::ostringstream os;
  os << "max replay output error over the rollout " << report_.max_replay_error
     << " > 2 x the baseline's " << report_.max_baseline_error;
  report_.fail(Check::kOutputError, os.str());
}

void SpecRollout::check_checkpoints(const StepInputs& in, const HostTensor& before, const HostTensor& after) {
  std::vector<bool> flushed(size_t(slots_), false);
  for (int64_t row = 0; row < batch_; ++row)
    if (in.row_slot[row] != config_.pad_slot_id && in.flush[row]) flushed[size_t(in.row_slot[row])] = true;
  const int64_t n = H_ * P_ * N_;
  const DType state = config_.state_dtype;
  for (int64_t slot = 0; slot < slots_; ++slot) {
    const int64_t begin = slot * n, end = begin + n;
    if (!flushed[slot]) {
      if (std::memcmp(before.bytes().data() + begin * dtype_size(state),
                      after.bytes().data() + begin * dtype_size(state), size_t(n * dtype_size(state))) != 0) {
        std::ostringstream os;
        os << "step " << step_ << ": the checkpoint of slot " << slot << " changed although it did not flush";
        report_.fail(Check::kCheckpointTouched, os.str());
      }
      continue;
    }
    // The flushed checkpoint: the state dtype's rounding of the exact state after the committed
    // tokens, computed from the previous checkpoint (and, for fp32, the oracle state at that token).
    double max_window = 0, max_oracle = 0, max_oracle_error = 0;
    for (int64_t i = begin; i < end; ++i) {
      max_window = std::max(max_window, std::fabs(window_oracle_state_.get(i)));
      max_oracle = std::max(max_oracle, std::fabs(oracle_state_.get(i)));
      max_oracle_error = std::max(max_oracle_error, std::fabs(after.get(i) - oracle_state_.get(i)));
    }
    for (int64_t i = begin; i < end; ++i) {
      const double v = after.get(i), exact = window_oracle_state_.get(i);
      if (std::fabs(v - exact) <= 0.5 * ulp(state, v) + kFp32Tolerance * max_window) continue;
      std::ostringstream os;
      os << "step " << step_ << ": flushed checkpoint" << index_string(after.shape(), i) << " = " << v
         << ", exact state from the previous checkpoint " << exact << " (max |state| " << max_window << ")";
      report_.fail(Check::kFlushedCheckpoint, os.str());
      break;
    }
    if (state == DType::kFloat32) {
      const double relative = max_oracle_error / max_oracle;
      report_.max_checkpoint_error = std::max(report_.max_checkpoint_error, relative);
      if (!(relative <= kFp32Tolerance)) {
        std::ostringstream os;
        os << "step " << step_ << ": flushed checkpoint of slot " << slot
           << " vs the oracle state at the same token: relative error " << relative << " > " << kFp32Tolerance;
        report_.fail(Check::kFlushedCheckpoint, os.str());
      }
    }
    for (int64_t i = begin; i < end; ++i) window_oracle_state_.set(i, after.get(i));
  }
}

void SpecRollout::check_caches() {
  const struct {
    const char* name;
    const Buffer& actual;
    const HostTensor& expected;
  } caches[] = {{"x_cache", x_cache_, expected_x_cache_},
                {"B_cache", B_cache_, expected_B_cache_},
                {"dt_cache", dt_cache_, expected_dt_cache_}};
  for (const auto& c : caches) {
    const HostTensor actual = download_tensor(c.actual, c.expected.dtype(), c.expected.shape());
    if (actual.bytes() == c.expected.bytes()) continue;
    int64_t i = 0;
    while (actual.bits(i) == c.expected.bits(i)) ++i;
    std::ostringstream os;
    os << "step " << step_ << ": " << c.name << index_string(actual.shape(), i) << " is 0x" << std::hex
       << actual.bits(i) << ", expected 0x" << c.expected.bits(i) << " (slot, head or group, ring position, channel)";
    report_.fail(Check::kCache, os.str());
  }
}

void SpecRollout::check_ring() {
  std::vector<int32_t> actual(size_t(2 * slots_));
  ring_.download(actual.data(), 0, ring_.bytes());
  for (int64_t slot = 0; slot < slots_; ++slot) {
    if (actual[2 * slot] == expected_ring_[2 * slot] && actual[2 * slot + 1] == expected_ring_[2 * slot + 1])
      continue;
    std::ostringstream os;
    os << "step " << step_ << ": ring[" << slot << "]=(" << actual[2 * slot] << ", " << actual[2 * slot + 1]
       << "), expected (" << expected_ring_[2 * slot] << ", " << expected_ring_[2 * slot + 1] << ")";
    report_.fail(Check::kCursor, os.str());
  }
}

}  // namespace replayssm::test
