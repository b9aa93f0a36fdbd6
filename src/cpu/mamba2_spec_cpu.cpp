#include "cpu/mamba2_spec_cpu.hpp"

#include <algorithm>
#include <cstring>

#include "cpu/head_kernel.hpp"

namespace replayssm::cpu {
namespace {

// dots (n, P): row i of one head's checkpoint dotted with each of the n window C vectors, in one
// pass over the checkpoint (it is read once for every output of the window).
template <typename S>
void window_dots(const S* state, int64_t stride_p, int64_t P, int64_t N, const float* Cs,
                 int64_t n_pad, int64_t n, float* dots) {
  for (int64_t i = 0; i < P; ++i) {
    Vec acc[kMaxSpecWindow] = {};
    const S* row = state + i * stride_p;
    int64_t n0 = 0;
    for (; n0 + kLanes <= N; n0 += kLanes) {
      const Vec s = widen_vec(row + n0);
      for (int64_t t = 0; t < n; ++t) acc[t] += s * load_vec(Cs + t * n_pad + n0);
    }
    if (n0 < N) {
      const Vec s = load_widened<false>(row + n0, N - n0);
      for (int64_t t = 0; t < n; ++t) acc[t] += s * load_vec(Cs + t * n_pad + n0);
    }
    for (int64_t t = 0; t < n; ++t) dots[t * P + i] = horizontal_sum(acc[t]);
  }
}

// A work item is (row, group, chunk of the group's heads), as in standard decode.
struct Item {
  int64_t row, g, h_begin, h_end;
};

Item item_of(const Mamba2Params& p, int64_t item, int64_t chunk, int64_t chunks) {
  Item it;
  it.row = item / (p.ngroups * chunks);
  it.g = item / chunks % p.ngroups;
  it.h_begin = it.g * p.heads_per_group + item % chunks * chunk;
  it.h_end = std::min(it.h_begin + chunk, (it.g + 1) * p.heads_per_group);
  return it;
}

// Widens C of each of the first n window positions of `row` into Cs (n, n_pad), zero padded.
template <typename Act>
void load_window_C(const Mamba2Params* positions, int64_t n, int64_t row, int64_t g, int64_t N,
                   int64_t n_pad, float* Cs) {
  for (int64_t t = 0; t < n; ++t) {
    const Mamba2Params& q = positions[t];
    widen(at<Act>(q.C, row * q.C_stride_batch + g * q.C_stride_group), Cs + t * n_pad, N);
    std::fill(Cs + t * n_pad + N, Cs + (t + 1) * n_pad, 0.f);
  }
}

// Verify: a row's tokens are its c committed inputs (from the ring) followed by its n window
// tokens; output t sees the first c + t + 1 of them. A flush row first folds the c committed
// inputs into the checkpoint (state-and-output, stored); every row then computes its outputs by
// the output-only route from the checkpoint it holds: one read of the checkpoint for the window.
template <typename S, typename Act> void verify(const SpecVerifyParams& p) {
  const int64_t P = p.head_dim, N = p.state_dim, T = p.window, L = p.buffer_len;
  const int64_t n_pad = round_up(N, kTile), mask = p.ring_len - 1, act = sizeof(Act);
  Mamba2Params positions[kMaxSpecWindow];
  for (int64_t t = 0; t < T; ++t) positions[t] = window_position(p, t);
  const int64_t chunk = heads_per_item(p);
  const int64_t chunks = (p.heads_per_group + chunk - 1) / chunk;
  // Bf (L, n_pad), Cs (T, n_pad), y (P), a (L, P), dots (T, P).
  const int64_t scratch_floats = (L + T) * n_pad + (1 + L + T) * P;

  parallel_for(p.batch * p.ngroups * chunks, 1, [&](int64_t begin, int64_t end) {
    float* work = scratch(scratch_floats);
    float* Bf = work;
    float* Cs = Bf + L * n_pad;
    float* y = Cs + T * n_pad;
    float* a = y + P;
    float* dots = a + L * P;
    const void* B[kMaxTokens];
    const void* x[kMaxTokens];
    float raw_dt[kMaxTokens];
    GroupWindow outputs[kMaxSpecWindow];
    for (int64_t index = begin; index < end; ++index) {
      const Item it = item_of(p, index, chunk, chunks);
      const int64_t slot = slot_of_row(p, it.row);
      if (slot < 0) continue;
      const int32_t* ring = p.ring + slot * p.ring_stride_slot;
      const int64_t origin = ring[0], committed = ring[p.ring_stride_field];
      const bool flush = spec_flushes(committed, T, L);
      const int64_t n = valid_tokens(p, it.row);
      const int64_t count = committed + n;
      // After a flush the checkpoint already holds the committed inputs.
      const int64_t first = flush ? committed : 0;

      char* B_ring = static_cast<char*>(p.B_cache) + (slot * p.Bc_stride_slot + it.g * p.Bc_stride_group) * act;
      for (int64_t j = 0; j < count; ++j) {
        if (j < committed) {
          B[j] = B_ring + ((origin + j) & mask) * p.Bc_stride_pos * act;
        } else {
          const Mamba2Params& q = positions[j - committed];
          B[j] = at<Act>(q.B, it.row * q.B_stride_batch + it.g * q.B_stride_group);
        }
        widen(static_cast<const Act*>(B[j]), Bf + j * n_pad, N);
        std::fill(Bf + j * n_pad + N, Bf + (j + 1) * n_pad, 0.f);
      }
      load_window_C<Act>(positions, n, it.row, it.g, N, n_pad, Cs);
      for (int64_t t = 0; t < n; ++t) {
        GroupWindow& gw = outputs[t];
        gw.count = committed + t + 1 - first;
        gw.C = Cs + t * n_pad;
        gw.Bf = Bf + first * n_pad;
        for (int64_t j = 0; j < gw.count; ++j) gw.bc[j] = dot(gw.Bf + j * n_pad, gw.C, N);
      }

      for (int64_t h = it.h_begin; h < it.h_end; ++h) {
        Act* x_ring = at<Act>(p.x_cache, slot * p.xc_stride_slot + h * p.xc_stride_head);
        float* dt_ring = p.dt_cache + slot * p.dtc_stride_slot + h * p.dtc_stride_head;
        for (int64_t j = 0; j < count; ++j) {
          if (j < committed) {
            const int64_t pos = (origin + j) & mask;
            x[j] = x_ring + pos * p.xc_stride_pos;
            raw_dt[j] = dt_ring[pos];
          } else {
            const Mamba2Params& q = positions[j - committed];
            x[j] = at<Act>(q.x, it.row * q.x_stride_batch + h * q.x_stride_head);
            raw_dt[j] = load_as<float>(q.dt, q.dt_dtype, it.row * q.dt_stride_batch + h * q.dt_stride_head);
          }
        }
        const float A = head_scalar(p.A, h, 0.f), bias = head_scalar(p.dt_bias, h, 0.f);
        S* head_state = at<S>(p.state, slot * p.state_stride_slot + h * p.state_stride_head);

        if (flush) {  // the checkpoint becomes the state after the committed inputs
          HeadWindow fold;
          std::copy(x, x + committed, fold.x);
          fold.weigh(committed, raw_dt, A, bias, p.dt_softplus);
          GroupWindow history;
          history.count = committed;
          history.C = Cs;
          history.Bf = Bf;
          const HeadKernel<S, Act> kernel(p, L);
          kernel.state_and_output(history, fold, head_state, nullptr, head_state, nullptr, y, a);
        }
        window_dots(head_state, p.state_stride_p, P, N, Cs, n_pad, n, dots);
        for (int64_t t = 0; t < n; ++t) {
          HeadWindow hw;
          const int64_t tokens = outputs[t].count;
          std::copy(x + first, x + first + tokens, hw.x);
          hw.weigh(tokens, raw_dt + first, A, bias, p.dt_softplus);
          const HeadKernel<S, Act> kernel(positions[t], L);
          kernel.output_only(outputs[t], hw, dots + t * P, y);
          kernel.finish(y, it.row, h);
        }

        // Append the window, uncommitted; heads of a group share B, the first one stores it.
        for (int64_t t = 0; t < n; ++t) {
          const int64_t j = committed + t, pos = (origin + j) & mask;
          std::memcpy(x_ring + pos * p.xc_stride_pos, x[j], size_t(P) * act);
          if (h == it.g * p.heads_per_group)
            std::memcpy(B_ring + pos * p.Bc_stride_pos * act, B[j], size_t(N) * act);
          dt_ring[pos] = raw_dt[j];
        }
      }
    }
  });
}

// The baseline: token by token, each position's state computed from the previous one (the
// accepted state of the previous window first) and stored in the position's slot.
template <typename S, typename Act> void baseline(const SpecBaselineParams& p) {
  const int64_t P = p.head_dim, N = p.state_dim, T = p.window;
  const int64_t n_pad = round_up(N, kTile);
  Mamba2Params positions[kMaxSpecWindow];
  for (int64_t t = 0; t < T; ++t) positions[t] = window_position(p, t);
  const int64_t chunk = heads_per_item(p);
  const int64_t chunks = (p.heads_per_group + chunk - 1) / chunk;
  // Bf (T, n_pad), Cs (T, n_pad), y (P), a (P).
  const int64_t scratch_floats = 2 * T * n_pad + 2 * P;

  parallel_for(p.batch * p.ngroups * chunks, 1, [&](int64_t begin, int64_t end) {
    float* work = scratch(scratch_floats);
    float* Bf = work;
    float* Cs = Bf + T * n_pad;
    float* y = Cs + T * n_pad;
    float* a = y + P;
    for (int64_t index = begin; index < end; ++index) {
      const Item it = item_of(p, index, chunk, chunks);
      if (slot_of_row(p, it.row) < 0) continue;
      const int64_t n = valid_tokens(p, it.row);
      const int64_t source =
          baseline_slot(p, it.row, p.num_accepted_tokens[it.row * p.num_accepted_tokens_stride] - 1);
      for (int64_t t = 0; t < n; ++t) {
        const Mamba2Params& q = positions[t];
        widen(at<Act>(q.B, it.row * q.B_stride_batch + it.g * q.B_stride_group), Bf + t * n_pad, N);
        std::fill(Bf + t * n_pad + N, Bf + (t + 1) * n_pad, 0.f);
      }
      load_window_C<Act>(positions, n, it.row, it.g, N, n_pad, Cs);

      for (int64_t h = it.h_begin; h < it.h_end; ++h) {
        const float A = head_scalar(p.A, h, 0.f), bias = head_scalar(p.dt_bias, h, 0.f);
        const int64_t head_offset = h * p.state_stride_head;
        const S* from = at<S>(p.state, source * p.state_stride_slot + head_offset);
        for (int64_t t = 0; t < n; ++t) {
          const Mamba2Params& q = positions[t];
          HeadWindow hw;
          hw.x[0] = at<Act>(q.x, it.row * q.x_stride_batch + h * q.x_stride_head);
          const float raw_dt = load_as<float>(q.dt, q.dt_dtype, it.row * q.dt_stride_batch + h * q.dt_stride_head);
          hw.weigh(1, &raw_dt, A, bias, p.dt_softplus);
          GroupWindow gw;
          gw.count = 1;
          gw.C = Cs + t * n_pad;
          gw.Bf = Bf + t * n_pad;
          S* to = at<S>(p.state, baseline_slot(p, it.row, t) * p.state_stride_slot + head_offset);
          const HeadKernel<S, Act> kernel(q, 1);
          kernel.state_and_output(gw, hw, from, nullptr, to, nullptr, y, a);
          kernel.finish(y, it.row, h);
          from = to;
        }
      }
    }
  });
}

// Instantiates `run` for the call's (state, activation) dtypes.
template <template <typename, typename> class Run, typename Params> void dispatch(const Params& p) {
  auto with_act = [&](auto state_tag) {
    using S = decltype(state_tag);
    switch (p.act_dtype) {
      case DType::kFloat16: return Run<S, Half>::run(p);
      case DType::kBFloat16: return Run<S, BFloat16>::run(p);
      default: return Run<S, float>::run(p);
    }
  };
  switch (p.state_dtype) {
    case DType::kFloat16: return with_act(Half{});
    case DType::kBFloat16: return with_act(BFloat16{});
    default: return with_act(float{});
  }
}

template <typename S, typename Act> struct Verify {
  static void run(const SpecVerifyParams& p) { verify<S, Act>(p); }
};
template <typename S, typename Act> struct Baseline {
  static void run(const SpecBaselineParams& p) { baseline<S, Act>(p); }
};

int64_t ring_slot(const SpecRingParams& p, int64_t i) {
  if (p.slot_ids == nullptr) return i;
  const int64_t slot = p.slot_ids[i * p.slot_ids_stride];
  return slot == p.pad_slot_id ? -1 : slot;
}

}  // namespace

void spec_verify(const SpecVerifyParams& p) { dispatch<Verify>(p); }

void spec_state_update(const SpecBaselineParams& p) { dispatch<Baseline>(p); }

void spec_commit(const SpecRingParams& p) {
  for (int64_t i = 0; i < p.count; ++i) {
    const int64_t slot = ring_slot(p, i);
    if (slot < 0) continue;
    int32_t* ring = p.ring + slot * p.ring_stride_slot;
    const RingEntry next = committed_ring(RingEntry{ring[0], ring[p.ring_stride_field]},
                                          p.num_accepted_tokens[i * p.num_accepted_tokens_stride],
                                          p.window, p.buffer_len, p.ring_len);
    ring[0] = next.origin;
    ring[p.ring_stride_field] = next.committed;
  }
}

void spec_reset(const SpecRingParams& p) {
  for (int64_t i = 0; i < p.count; ++i) {
    const int64_t slot = ring_slot(p, i);
    if (slot < 0) continue;
    int32_t* ring = p.ring + slot * p.ring_stride_slot;
    ring[0] = 0;
    ring[p.ring_stride_field] = 0;
  }
}

}  // namespace replayssm::cpu
