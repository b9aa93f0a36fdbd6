// Mamba-2 decode: the baseline selective_state_update and ReplaySSM standard decode.
//
// Names, argument order and semantics follow mamba-ssm / vLLM. Every entry point validates all of
// its arguments first and throws replayssm::InvalidArgument (naming the argument and the numbers)
// before anything is written. The device of the tensors picks the backend unless
// ExecOptions::backend names one.
#pragma once

#include <cstdint>

#include "replayssm/error.hpp"
#include "replayssm/tensor.hpp"

namespace replayssm {

enum class Backend : int32_t {
  kAuto,       // the device of the tensors decides: CPU tensors -> kCpu, CUDA tensors -> kCuda
  kReference,  // the fp64 step-by-step recurrence (CPU tensors only); the oracle of the tests
  kCpu,        // multithreaded CPU kernels
  kCuda,       // CUDA kernels (CUDA tensors only)
};

const char* backend_name(Backend backend);

// Which path a CUDA replay_decode (or spec_verify) given a workspace takes.
enum class WindowKernel : int32_t {
  kAuto,      // by the size of the call: the split path from a few CTAs per SM, where it is faster
  kFused,     // one kernel does everything, as without a workspace
  kSeparate,  // the split path: a lean read of the checkpoint (which also folds the flush rows of
              // fp32 and, at large batch, 16-bit states), the window work and outputs once per
              // group of heads, and a kernel for the other flush rows
};

struct ExecOptions {
  Backend backend = Backend::kAuto;
  void* cuda_stream = nullptr;  // cudaStream_t the CUDA backend launches on (nullptr: default stream)
  // Caller-owned scratch of replay_decode and spec_verify on the CUDA backend (other calls and
  // backends ignore it): a contiguous 1-D device tensor of any dtype holding at least
  // replay_decode_workspace_bytes(batch, nheads, head_dim) bytes, 16-byte aligned. With it
  // replay_decode can take the split path (see window_kernel), which passes each row's
  // checkpoint dot S0 . C from a lean read of the checkpoint to the kernel that does the window
  // work once per group of heads. Its contents are scratch between calls: layers can share one
  // workspace on one stream. spec_verify (mamba2_spec.hpp) takes one of
  // spec_verify_workspace_bytes(batch, window, nheads, head_dim) bytes the same way.
  TensorView workspace{};
  WindowKernel window_kernel = WindowKernel::kAuto;
};

// One decode step of one Mamba-2 layer. H heads of P channels, G groups of N state channels
// (H % G == 0: H / G heads share one B and C). "act" is the activation dtype (fp32, fp16 or bf16),
// shared by x, B, C, z and out; dt is act or fp32; A, D, dt_bias are fp32, fp16 or bf16.
struct Mamba2Step {
  TensorView x;        // (batch, H, P) act
  TensorView dt;       // (batch, H), or (batch, H, P) with stride(2) == 0
  TensorView A;        // (H), or (H, P, N) with zero strides on P and N
  TensorView B;        // (batch, G, N) act
  TensorView C;        // (batch, G, N) act
  TensorView D;        // optional: (H), or (H, P) with stride(1) == 0
  TensorView z;        // optional: (batch, H, P) act; y *= silu(z)
  TensorView dt_bias;  // optional: (H), or (H, P) with stride(1) == 0
  bool dt_softplus = false;         // dt = softplus(dt + dt_bias), threshold 20
  TensorView state_batch_indices;   // optional: (batch) int32, row -> slot; absent: row i uses slot i
  int64_t pad_slot_id = -1;         // rows mapped to this id are skipped; their out rows untouched
  TensorView out;      // (batch, H, P) act; written (except pad rows)
};

// Baseline decode: reads and writes the whole state every step.
//   state (slots, H, P, N), fp32 / fp16 / bf16 (fp64 on the reference backend): mutated. The
//   8-bit formats are checkpoint formats of replay_decode only.
//   out: written
void selective_state_update(const TensorView& state, const Mamba2Step& step,
                            const ExecOptions& options = {});

// ReplaySSM per-slot cache of one layer. L = x_cache.size(2), 1 <= L <= 64.
//
// Cursor contract: cursors[slot] counts the tokens held in the buffer (0 <= cursor < L); it is the
// buffer position of this step's token. replay_decode only reads it. A row whose cursor is L - 1
// flushes: its state after this step is written into `state` (the new checkpoint) and its buffer
// counts as empty; otherwise the token's x, B and raw dt are stored at position `cursor` and
// `state` is not touched. replay_advance moves the cursors on by one step, on the device, once per
// decode step after every layer that shares them (all layers of a model can share one cursors
// tensor). replay_reset starts a slot over for a new request; the caller puts the request's initial
// state (zeros, or its prefill state) into `state` for that slot.
//
// Low-precision checkpoints (src/common/rounding.hpp has the exact rules):
//   - int8 and float8_e4m3fn checkpoints hold value / scale, with an fp32 `state_scale` per
//     (slot, head, row of P) chosen at each flush from the row's largest magnitude (absmax / 127
//     or absmax / 448); the replay computes in fp32 from scale * stored.
//   - stochastic_rounding: a flush rounds each checkpoint element (fp16, bf16, int8 or e4m3) up or
//     down at random with the probabilities that make the rounding unbiased, instead of to
//     nearest. The random bits are Philox-4x32-10 keyed on (rounding_seed, slot, element,
//     flush_counts[slot]): deterministic for a seed, the same on every backend, and read from
//     device memory (CUDA-graph safe). Each flush row increments its flush_counts[slot]; give each
//     layer its own flush_counts and, for independent rounding across layers, its own seed.
struct ReplayCache {
  TensorView state;     // (slots, H, P, N) fp32 / fp16 / bf16 / int8 / float8_e4m3fn: the checkpoint
  TensorView x_cache;   // (slots, H, L, P) act
  TensorView B_cache;   // (slots, G, L, N) act
  TensorView dt_cache;  // (slots, H, L) fp32: raw dt as given (before dt_bias and softplus)
  TensorView cursors;   // (slots) int32
  TensorView state_scale{};  // (slots, H, P) fp32: required iff state is int8 / float8_e4m3fn
  bool stochastic_rounding = false;  // off: flushes round to nearest even
  TensorView rounding_seed{};  // (2) int32, the Philox key: required iff stochastic_rounding
  TensorView flush_counts{};   // (slots) int32, flushes per slot: required iff stochastic_rounding
};

// How a non-flush step computes its output. Flush steps always form the state.
enum class ReplayRoute : int32_t {
  kAuto,            // the backend picks the faster one for the configuration
  kOutputOnly,      // y = e^Lambda (S0 C) + sum_j s_j (B_j . C) x_j: never forms the state
  kStateAndOutput,  // forms S = e^Lambda S0 + sum_j s_j x_j B_j^T, then y = S C
};

const char* route_name(ReplayRoute route);

// ReplaySSM decode step: same outputs as selective_state_update, state traffic of one read.
//   state, state_scale: mutated on flush rows only; flush_counts (with stochastic_rounding):
//   incremented on flush rows; x_cache, B_cache, dt_cache: written at the cursor of non-flush
//   rows (B_cache by the first head of each group); cursors, rounding_seed: read only; out: written.
void replay_decode(const ReplayCache& cache, const Mamba2Step& step,
                   ReplayRoute route = ReplayRoute::kAuto, const ExecOptions& options = {});

// Bytes of ExecOptions::workspace that a CUDA replay_decode of this shape needs.
int64_t replay_decode_workspace_bytes(int64_t batch, int64_t nheads, int64_t head_dim);

// cursors[slot] = (cursors[slot] + 1) % buffer_len for the slot of every non-pad row
// (state_batch_indices absent: every slot). cursors: mutated.
void replay_advance(const TensorView& cursors, int64_t buffer_len,
                    const TensorView& state_batch_indices = {}, int64_t pad_slot_id = -1,
                    const ExecOptions& options = {});

// cursors[slot] = 0 for each entry of slots (n) int32 that is not pad_slot_id. cursors: mutated.
void replay_reset(const TensorView& cursors, const TensorView& slots, int64_t pad_slot_id = -1,
                  const ExecOptions& options = {});

}  // namespace replayssm
