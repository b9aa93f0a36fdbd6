#include "cpu/mamba2_cpu.hpp"

#include <algorithm>
#include <cstring>

#include "cpu/head_kernel.hpp"

namespace replayssm::cpu {
namespace {

// One decode step over the batch. `replay` == nullptr is the baseline: no history, every row
// writes its state. Otherwise a row replays its buffer, flushes at cursor L - 1 and else appends.
template <typename S, typename Act> void decode(const Mamba2Params& p, const ReplayParams* replay) {
  const HeadKernel<S, Act> kernel(p, replay ? replay->buffer_len : 1);
  const bool output_only = replay && replay->route != ReplayRoute::kStateAndOutput;
  // Flushes that round row by row (a row's scale needs all of it; stochastic rounding its
  // elements' indices) stage the state in fp32 first.
  const bool staged_flush = replay && (CheckpointFormat<S>::kScaled || replay->stochastic_rounding);
  const int64_t chunk = heads_per_item(p);
  const int64_t chunks = (p.heads_per_group + chunk - 1) / chunk;
  const int64_t act = sizeof(Act);
  parallel_for(p.batch * p.ngroups * chunks, 1, [&](int64_t begin, int64_t end) {
    float* work = scratch(kernel.scratch_floats());
    float* y = kernel.y_of(work);
    float* a = kernel.a_of(work);
    float* dots = kernel.dots_of(work);
    float* staged = staged_flush ? kernel.staged_of(work) : nullptr;
    const void* B[kMaxTokens];
    float raw_dt[kMaxTokens];
    for (int64_t item = begin; item < end; ++item) {
      // Rows vary fastest: a flush row's items (compute bound) are spread among the others'
      // (memory bound), so that both threads rarely fold windows at the same time.
      const int64_t row = item % p.batch;
      const int64_t g = item / p.batch / chunks;
      const int64_t h_begin = g * p.heads_per_group + item / p.batch % chunks * chunk;
      const int64_t h_end = std::min(h_begin + chunk, (g + 1) * p.heads_per_group);
      const int64_t slot = slot_of_row(p, row);
      if (slot < 0) continue;

      const int64_t fill = replay ? replay->cursors[slot * replay->cursors_stride] : 0;
      const bool flush = !replay || fill == replay->buffer_len - 1;
      const bool row_output_only = output_only && !flush;
      GroupWindow gw;
      gw.count = fill + 1;
      char* B_hist = replay ? static_cast<char*>(replay->B_cache) +
                                  (slot * replay->Bc_stride_slot + g * replay->Bc_stride_group) * act
                            : nullptr;
      for (int64_t j = 0; j < fill; ++j) B[j] = B_hist + j * replay->Bc_stride_pos * act;
      B[fill] = at<Act>(p.B, row * p.B_stride_batch + g * p.B_stride_group);
      // Head h's cached x (position stride xc_stride_pos) and raw dt (replay only).
      auto x_hist_of = [&](int64_t h) {
        return at<Act>(replay->x_cache, slot * replay->xc_stride_slot + h * replay->xc_stride_head);
      };
      auto dt_hist_of = [&](int64_t h) {
        return replay->dt_cache + slot * replay->dtc_stride_slot + h * replay->dtc_stride_head;
      };
      kernel.load_C(gw, row, g, work);
      // The window's cached B, x and raw dt, asked for now: they arrive while the checkpoint
      // streams in, instead of a round trip each after it.
      for (int64_t j = 0; j < fill; ++j) {
        prefetch(B[j], p.state_dim * act);
        for (int64_t h = h_begin; h < h_end; ++h)
          prefetch(x_hist_of(h) + j * replay->xc_stride_pos, p.head_dim * act);
      }
      if (fill > 0)
        for (int64_t h = h_begin; h < h_end; ++h) prefetch(dt_hist_of(h), fill * int64_t(sizeof(float)));
      S* group_state = at<S>(p.state, slot * p.state_stride_slot + h_begin * p.state_stride_head);
      float* group_scale = replay && replay->state_scale
                               ? replay->state_scale + slot * replay->scale_stride_slot +
                                     h_begin * replay->scale_stride_head
                               : nullptr;
      if (row_output_only)
        kernel.checkpoint_dots(group_state, group_scale, group_scale ? replay->scale_stride_head : 0,
                               h_end - h_begin, gw.C, dots);
      kernel.load_tokens(gw, B, row_output_only);
      FlushRandomBits random = replay && flush ? flush_random_bits(*replay, slot) : FlushRandomBits(0, 0, 0, 0);

      for (int64_t h = h_begin; h < h_end; ++h) {
        HeadWindow hw;
        Act* x_hist = replay ? x_hist_of(h) : nullptr;
        float* dt_hist = replay ? dt_hist_of(h) : nullptr;
        for (int64_t j = 0; j < fill; ++j) {
          hw.x[j] = x_hist + j * replay->xc_stride_pos;
          raw_dt[j] = dt_hist[j];
        }
        hw.x[fill] = at<Act>(p.x, row * p.x_stride_batch + h * p.x_stride_head);
        raw_dt[fill] = load_as<float>(p.dt, p.dt_dtype, row * p.dt_stride_batch + h * p.dt_stride_head);
        hw.weigh(gw.count, raw_dt, head_scalar(p.A, h, 0.f), head_scalar(p.dt_bias, h, 0.f),
                 p.dt_softplus);

        S* state = group_state + (h - h_begin) * p.state_stride_head;
        float* scale = group_scale ? group_scale + (h - h_begin) * replay->scale_stride_head : nullptr;
        if (row_output_only)
          kernel.output_only(gw, hw, dots + (h - h_begin) * p.head_dim, y);
        else
          kernel.state_and_output(gw, hw, state, scale, flush ? state : nullptr, staged, y, a);
        kernel.finish(y, row, h);
        if (flush && staged)
          for (int64_t i = 0; i < p.head_dim; ++i)
            round_checkpoint_row(staged + i * kernel.padded_state_dim(), p.state_dim, state + i * p.state_stride_p,
                                 scale ? scale + i : nullptr, replay->stochastic_rounding, random,
                                 uint32_t((h * p.head_dim + i) * p.state_dim));

        if (!flush) {  // append the token; heads of a group share B, the first one stores it
          std::memcpy(x_hist + fill * replay->xc_stride_pos, hw.x[fill], size_t(p.head_dim) * act);
          if (h == g * p.heads_per_group)
            std::memcpy(B_hist + fill * replay->Bc_stride_pos * act, B[fill], size_t(p.state_dim) * act);
          dt_hist[fill] = raw_dt[fill];
        }
      }
    }
  });
  // After every head has drawn its random bits from the count.
  if (replay && replay->stochastic_rounding)
    for (int64_t row = 0; row < p.batch; ++row) {
      const int64_t slot = slot_of_row(p, row);
      if (slot >= 0 && replay->cursors[slot * replay->cursors_stride] == replay->buffer_len - 1)
        count_flush(*replay, slot);
    }
}

// Instantiates decode for the call's (state, activation) dtypes.
void dispatch(const Mamba2Params& p, const ReplayParams* replay) {
  auto with_act = [&](auto state_tag) {
    using S = decltype(state_tag);
    switch (p.act_dtype) {
      case DType::kFloat16: return decode<S, Half>(p, replay);
      case DType::kBFloat16: return decode<S, BFloat16>(p, replay);
      default: return decode<S, float>(p, replay);
    }
  };
  switch (p.state_dtype) {
    case DType::kFloat16: return with_act(Half{});
    case DType::kBFloat16: return with_act(BFloat16{});
    case DType::kInt8: return with_act(Int8{});
    case DType::kFloat8E4M3: return with_act(Float8E4M3{});
    default: return with_act(float{});
  }
}

}  // namespace

void selective_state_update(const Mamba2Params& p) { dispatch(p, nullptr); }

void replay_decode(const ReplayParams& p) { dispatch(p, &p); }

void replay_advance(const CursorParams& p) {
  for (int64_t i = 0; i < p.count; ++i) {
    const int64_t slot = p.slot_ids ? p.slot_ids[i * p.slot_ids_stride] : i;
    if (p.slot_ids && slot == p.pad_slot_id) continue;
    int32_t& c = p.cursors[slot * p.cursors_stride];
    c = c + 1 == p.buffer_len ? 0 : c + 1;
  }
}

void replay_reset(const CursorParams& p) {
  for (int64_t i = 0; i < p.count; ++i) {
    const int64_t slot = p.slot_ids[i * p.slot_ids_stride];
    if (slot != p.pad_slot_id) p.cursors[slot * p.cursors_stride] = 0;
  }
}

}  // namespace replayssm::cpu
