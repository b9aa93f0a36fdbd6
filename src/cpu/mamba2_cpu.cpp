#include "cpu/mamba2_cpu.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/mamba2_math.hpp"
#include "cpu/thread_pool.hpp"

namespace replayssm::cpu {
namespace {

constexpr int64_t kMaxTokens = 64;  // history plus the current token, at most L

template <typename T> const T* at(const void* base, int64_t offset) {
  return static_cast<const T*>(base) + offset;
}
template <typename T> T* at(void* base, int64_t offset) { return static_cast<T*>(base) + offset; }

template <typename T> void widen(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

float head_scalar(const HeadScalar& s, int64_t h, float absent) {
  return s.data ? load_as<float>(s.data, s.dtype, h * s.stride) : absent;
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <typename S> float dot_state(const S* s, const float* c, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += to_float(s[i]) * c[i];
  return acc;
}

// The tokens of one (row, head) since its checkpoint: w cached ones, then the current one.
// weight[j] = dt_j exp(A sum_{i>j} dt_i) scales token j; checkpoint_decay = exp(A sum_i dt_i).
struct Window {
  int64_t count = 0;
  const void* x[kMaxTokens];  // (P) act each
  const void* B[kMaxTokens];  // (N) act each
  float weight[kMaxTokens];
  float checkpoint_decay = 1.f;
};

void weigh(Window& win, const float* raw_dt, float A, float bias, bool dt_softplus) {
  float later = 0.f;  // sum of the effective dt of the tokens after j
  for (int64_t j = win.count - 1; j >= 0; --j) {
    const float dt = effective_dt(raw_dt[j], bias, dt_softplus);
    win.weight[j] = dt * std::exp(A * later);
    later += dt;
  }
  win.checkpoint_decay = std::exp(A * later);
}

// Per-thread scratch, grown once and reused: no allocation in steady state.
float* scratch(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (int64_t(buffer.size()) < floats) buffer.resize(size_t(floats));
  return buffer.data();
}

template <typename S, typename Act> struct HeadKernel {
  const Mamba2Params& p;

  // y (P) = (y + D x) * silu(z) into out.
  void finish(float* y, int64_t row, int64_t h) const {
    const Act* x = at<Act>(p.x, row * p.x_stride_batch + h * p.x_stride_head);
    Act* out = at<Act>(p.out, row * p.out_stride_batch + h * p.out_stride_head);
    const float D = head_scalar(p.D, h, 0.f);
    const Act* z = p.z ? at<Act>(p.z, row * p.z_stride_batch + h * p.z_stride_head) : nullptr;
    for (int64_t i = 0; i < p.head_dim; ++i) {
      float v = y[i] + D * to_float(x[i]);
      if (z) v *= silu(to_float(z[i]));
      out[i] = from_float<Act>(v);
    }
  }

  // State-and-output: S = decay S0 + sum_j weight_j x_j B_j^T row by row, y = S C; the state is
  // stored back when `store` (a flush, or the baseline).
  void state_and_output(const Window& win, S* state, const float* C, bool store, float* y,
                        float* work) const {
    const int64_t N = p.state_dim;
    float* Bf = work;                    // (count, N)
    float* srow = work + win.count * N;  // (N)
    for (int64_t j = 0; j < win.count; ++j) widen(static_cast<const Act*>(win.B[j]), Bf + j * N, N);
    for (int64_t i = 0; i < p.head_dim; ++i) {
      S* s = state + i * p.state_stride_p;
      const float decay = win.checkpoint_decay;
#pragma omp simd
      for (int64_t n = 0; n < N; ++n) srow[n] = decay * to_float(s[n]);
      for (int64_t j = 0; j < win.count; ++j) {
        const float a = win.weight[j] * to_float(static_cast<const Act*>(win.x[j])[i]);
        const float* b = Bf + j * N;
#pragma omp simd
        for (int64_t n = 0; n < N; ++n) srow[n] += a * b[n];
      }
      y[i] = dot(srow, C, N);
      if (store) {
#pragma omp simd
        for (int64_t n = 0; n < N; ++n) s[n] = from_float<S>(srow[n]);
      }
    }
  }

  // Output-only: y = decay (S0 C) + sum_j weight_j (B_j . C) x_j; the state is only read.
  void output_only(const Window& win, const S* state, const float* C, float* y, float* work) const {
    const int64_t N = p.state_dim;
    float* Bf = work;  // (N)
    for (int64_t i = 0; i < p.head_dim; ++i)
      y[i] = win.checkpoint_decay * dot_state(state + i * p.state_stride_p, C, N);
    for (int64_t j = 0; j < win.count; ++j) {
      widen(static_cast<const Act*>(win.B[j]), Bf, N);
      const float coef = win.weight[j] * dot(Bf, C, N);
      const Act* x = static_cast<const Act*>(win.x[j]);
#pragma omp simd
      for (int64_t i = 0; i < p.head_dim; ++i) y[i] += coef * to_float(x[i]);
    }
  }

  // Work space (floats) one head needs: C, y, the widened B of every token and one state row.
  int64_t work_floats(int64_t max_tokens) const {
    return p.state_dim + p.head_dim + (max_tokens + 1) * p.state_dim;
  }

  const Act* x_now(int64_t row, int64_t h) const {
    return at<Act>(p.x, row * p.x_stride_batch + h * p.x_stride_head);
  }
  const Act* B_now(int64_t row, int64_t h) const {
    return at<Act>(p.B, row * p.B_stride_batch + (h / p.heads_per_group) * p.B_stride_group);
  }
  float raw_dt_now(int64_t row, int64_t h) const {
    return load_as<float>(p.dt, p.dt_dtype, row * p.dt_stride_batch + h * p.dt_stride_head);
  }
  S* state_of(int64_t slot, int64_t h) const {
    return at<S>(p.state, slot * p.state_stride_slot + h * p.state_stride_head);
  }
  const Act* C_now(int64_t row, int64_t h) const {
    return at<Act>(p.C, row * p.C_stride_batch + (h / p.heads_per_group) * p.C_stride_group);
  }
};

template <typename S, typename Act> void state_update(const Mamba2Params& p) {
  const HeadKernel<S, Act> k{p};
  parallel_for(p.batch * p.nheads, 4, [&](int64_t begin, int64_t end) {
    float* C = scratch(k.work_floats(1));
    float* y = C + p.state_dim;
    float* work = y + p.head_dim;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t row = item / p.nheads, h = item % p.nheads;
      const int64_t slot = slot_of_row(p, row);
      if (slot < 0) continue;
      Window win;
      win.count = 1;
      win.x[0] = k.x_now(row, h);
      win.B[0] = k.B_now(row, h);
      const float raw_dt = k.raw_dt_now(row, h);
      weigh(win, &raw_dt, head_scalar(p.A, h, 0.f), head_scalar(p.dt_bias, h, 0.f), p.dt_softplus);
      widen(k.C_now(row, h), C, p.state_dim);
      k.state_and_output(win, k.state_of(slot, h), C, true, y, work);
      k.finish(y, row, h);
    }
  });
}

template <typename S, typename Act> void replay(const ReplayParams& p) {
  const HeadKernel<S, Act> k{p};
  const bool output_only = p.route != ReplayRoute::kStateAndOutput;  // cheaper on a CPU
  parallel_for(p.batch * p.nheads, 4, [&](int64_t begin, int64_t end) {
    float* C = scratch(k.work_floats(p.buffer_len));
    float* y = C + p.state_dim;
    float* work = y + p.head_dim;
    float raw_dt[kMaxTokens];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t row = item / p.nheads, h = item % p.nheads;
      const int64_t slot = slot_of_row(p, row);
      if (slot < 0) continue;
      const int64_t g = h / p.heads_per_group;
      const int64_t fill = p.cursors[slot * p.cursors_stride];
      const bool flush = fill == p.buffer_len - 1;
      Act* x_hist = at<Act>(p.x_cache, slot * p.xc_stride_slot + h * p.xc_stride_head);
      Act* B_hist = at<Act>(p.B_cache, slot * p.Bc_stride_slot + g * p.Bc_stride_group);
      float* dt_hist = p.dt_cache + slot * p.dtc_stride_slot + h * p.dtc_stride_head;

      Window win;
      win.count = fill + 1;
      for (int64_t j = 0; j < fill; ++j) {
        win.x[j] = x_hist + j * p.xc_stride_pos;
        win.B[j] = B_hist + j * p.Bc_stride_pos;
        raw_dt[j] = dt_hist[j];
      }
      win.x[fill] = k.x_now(row, h);
      win.B[fill] = k.B_now(row, h);
      raw_dt[fill] = k.raw_dt_now(row, h);
      weigh(win, raw_dt, head_scalar(p.A, h, 0.f), head_scalar(p.dt_bias, h, 0.f), p.dt_softplus);
      widen(k.C_now(row, h), C, p.state_dim);

      S* state = k.state_of(slot, h);
      if (flush || !output_only) {
        k.state_and_output(win, state, C, flush, y, work);
      } else {
        k.output_only(win, state, C, y, work);
      }
      k.finish(y, row, h);

      if (!flush) {  // append the token; heads of a group share B, the first one stores it
        std::memcpy(x_hist + fill * p.xc_stride_pos, win.x[fill], size_t(p.head_dim) * sizeof(Act));
        if (h % p.heads_per_group == 0)
          std::memcpy(B_hist + fill * p.Bc_stride_pos, win.B[fill], size_t(p.state_dim) * sizeof(Act));
        dt_hist[fill] = raw_dt[fill];
      }
    }
  });
}

template <template <typename, typename> class Fn, typename P>
void dispatch(const P& p, DType state, DType act) {
  auto with_act = [&](auto state_tag) {
    using S = decltype(state_tag);
    switch (act) {
      case DType::kFloat16: return Fn<S, Half>::run(p);
      case DType::kBFloat16: return Fn<S, BFloat16>::run(p);
      default: return Fn<S, float>::run(p);
    }
  };
  switch (state) {
    case DType::kFloat16: return with_act(Half{});
    case DType::kBFloat16: return with_act(BFloat16{});
    default: return with_act(float{});
  }
}

template <typename S, typename Act> struct StateUpdate {
  static void run(const Mamba2Params& p) { state_update<S, Act>(p); }
};
template <typename S, typename Act> struct Replay {
  static void run(const ReplayParams& p) { replay<S, Act>(p); }
};

}  // namespace

void selective_state_update(const Mamba2Params& p) {
  dispatch<StateUpdate>(p, p.state_dtype, p.act_dtype);
}

void replay_decode(const ReplayParams& p) { dispatch<Replay>(p, p.state_dtype, p.act_dtype); }

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
