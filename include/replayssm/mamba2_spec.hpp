// Mamba-2 speculative decoding (MTP / draft verification): a verify step brings T tokens per row
// (the last accepted token, then T - 1 drafts), produces all T outputs, and learns afterwards how
// many of them were accepted.
//
// Two paths behind one validated API, each usable inside a CUDA graph (no host read of a ring, a
// cursor or an accepted count; no allocation; the grid depends only on the padded batch):
// - ReplaySSM (spec_verify, spec_commit, spec_reset): a checkpoint plus a ring of the inputs since
//   it. A verify step reads the checkpoint once and writes no state, except on the rows that flush;
//   rollback is free because rejected inputs are never committed.
// - the baseline (spec_state_update), as serving engines run it today: the T tokens one after the
//   other, writing the state after every position into a slot of its own.
//
// Window layouts follow FlashInfer's multi-token selective_state_update: the window axis comes
// right after the batch axis, x (batch, T, H, P). Names follow vLLM (num_accepted_tokens,
// state_batch_indices of shape (batch, T) for the baseline).
#pragma once

#include <cstdint>

#include "replayssm/mamba2.hpp"

namespace replayssm {

// Tokens per verify window: 1 <= T <= kMaxSpecWindow.
constexpr int64_t kMaxSpecWindow = 8;

// One verify window of one Mamba-2 layer. H heads of P channels, G groups of N state channels;
// "act" is the activation dtype (fp32, fp16 or bf16) of x, B, C, z and out; dt is act or fp32;
// A, D, dt_bias are fp32, fp16 or bf16 (as in Mamba2Step).
struct Mamba2Window {
  TensorView x;        // (batch, T, H, P) act
  TensorView dt;       // (batch, T, H), or (batch, T, H, P) with stride(3) == 0
  TensorView A;        // (H), or (H, P, N) with zero strides on P and N
  TensorView B;        // (batch, T, G, N) act
  TensorView C;        // (batch, T, G, N) act
  TensorView D;        // optional: (H), or (H, P) with stride(1) == 0
  TensorView z;        // optional: (batch, T, H, P) act; y *= silu(z)
  TensorView dt_bias;  // optional: (H), or (H, P) with stride(1) == 0
  bool dt_softplus = false;  // dt = softplus(dt + dt_bias), threshold 20
  // optional: (batch) int32 in [1, T]: row b carries tokens 0 .. num_valid_tokens[b] - 1 of the
  // window, the rest is padding (its values never used, out untouched). Absent: every row carries T.
  TensorView num_valid_tokens;
  // spec_verify: optional (batch) int32, row -> slot (absent: row i uses slot i).
  // spec_state_update: (batch, T) int32, required: the slot of the state after each position.
  TensorView state_batch_indices;
  int64_t pad_slot_id = -1;  // rows whose slot (column 0 for the baseline) is this are skipped
  TensorView out;            // (batch, T, H, P) act; written at the valid positions of non-pad rows
};

// ---- ReplaySSM -----------------------------------------------------------------------------------
//
// L (buffer_len) is the most inputs a slot's ring ever holds: the committed history since the
// checkpoint plus one window, so L >= 2T. The ring's physical length R = spec_ring_len(L, T) is a
// power of two; entry j after the checkpoint lives at ring position (origin + j) % R.
//
// Ring contract (`ring` (slots, 2) int32 = (origin, committed) per slot, on the device of the cache,
// shared by every layer of a model, never read by the host):
// - spec_verify only reads the ring. A row with c = committed inputs since its checkpoint
//     * produces out[row, t] for each valid t from the checkpoint, the c committed inputs and the
//       window's tokens 0..t (causal), in fp32;
//     * stores its window's x, raw dt and B at ring positions (origin + c + t) % R, uncommitted
//       (the first head of each group stores the group's B);
//     * flushes when spec_flushes(c, T, L), i.e. when the next window might not fit: it folds the c
//       committed inputs into the checkpoint (state[slot] becomes the state after them). Otherwise
//       state[slot] is not touched. A row flushes on a verify step, not on a commit, because only
//       the per-layer verify can write its layer's state.
// - spec_commit runs once per model step, after every layer's verify, with the accepted count
//   k (1..T, the bonus token included) of each row. It re-derives the flush decision from the same
//   ring values, then sets (origin, committed) = flush ? (origin + c, k) : (origin, c + k). The
//   window's first k inputs become committed; the rejected ones stay uncommitted and are
//   overwritten by the next window (rollback costs nothing, and the accepted tail is never copied).
// - spec_reset starts a slot over for a new request (or a recycled slot): (origin, committed) =
//   (0, 0). The caller writes the request's initial state (zeros, or its prefill state) into
//   state[slot] of every layer, as it would for the baseline.
// - Invariant kept by the three: 0 <= origin < R and 0 <= committed <= L - T.
// - A verify is not idempotent on flush rows: run each layer's verify once per model step. Rows of
//   one call must map to distinct slots.

// The flush rule, shared by every backend's verify and commit (host and device).
REPLAYSSM_HOST_DEVICE bool spec_flushes(int64_t committed, int64_t window, int64_t buffer_len) {
  return committed + 2 * window > buffer_len;
}

// The physical ring length for buffer_len L and window T: the smallest power of two >= L. Throws
// InvalidArgument unless 1 <= T <= kMaxSpecWindow and 2T <= L <= 64.
int64_t spec_ring_len(int64_t buffer_len, int64_t window);

// ReplaySSM per-slot cache of one layer for speculative decoding. R = x_cache.size(2).
struct SpecCache {
  TensorView state;     // (slots, H, P, N) fp32 / fp16 / bf16 (fp64 on the reference backend): the checkpoint
  TensorView x_cache;   // (slots, H, R, P) act: ring of x
  TensorView B_cache;   // (slots, G, R, N) act: ring of B
  TensorView dt_cache;  // (slots, H, R) fp32: ring of raw dt as given (before dt_bias and softplus)
  TensorView ring;      // (slots, 2) int32: (origin, committed), shared by every layer
};

// Verify step of one layer. Mutates: out (valid positions of non-pad rows); x_cache, B_cache,
// dt_cache at the window's ring positions; state on flush rows only. Reads ring. On the CUDA
// backend, options.workspace (spec_verify_workspace_bytes) lets it take the split path, as
// replay_decode does (ExecOptions::window_kernel): a lean read of the checkpoints of the rows that
// do not flush, the fold of the flush rows, then every row's window work and outputs once per
// group of heads.
void spec_verify(const SpecCache& cache, const Mamba2Window& window, int64_t buffer_len,
                 const ExecOptions& options = {});

// Bytes of ExecOptions::workspace that a CUDA spec_verify of this shape needs (window: T).
int64_t spec_verify_workspace_bytes(int64_t batch, int64_t window, int64_t nheads, int64_t head_dim);

// Once per model step, after every layer's verify: commits num_accepted_tokens (batch) int32 (in
// [1, T]) of each non-pad row (state_batch_indices (batch) int32 as given to spec_verify; absent:
// row i uses slot i). window is T and buffer_len L, as given to spec_verify. Mutates: ring.
void spec_commit(const TensorView& ring, const TensorView& num_accepted_tokens, int64_t window,
                 int64_t buffer_len, const TensorView& state_batch_indices = {},
                 int64_t pad_slot_id = -1, const ExecOptions& options = {});

// ring[slot] = (0, 0) for each entry of slots (n) int32 that is not pad_slot_id. Mutates: ring.
void spec_reset(const TensorView& ring, const TensorView& slots, int64_t pad_slot_id = -1,
                const ExecOptions& options = {});

// ---- Baseline --------------------------------------------------------------------------------------
//
// The speculative path of serving engines today (vLLM's layout): each request owns T state slots,
// window.state_batch_indices (batch, T). A row reads the state of slot
// state_batch_indices[row, num_accepted_tokens[row] - 1] (the position its previous window accepted;
// 1 for a new request, whose initial state is in column 0), runs the valid tokens one by one, and
// writes the state after position t to slot state_batch_indices[row, t]. Keeping the accepted state
// therefore costs nothing: the next call reads it where it is, so no copy kernel runs. State
// traffic per verify step: one read and T writes (FlashInfer's intermediate_states_buffer form
// adds a copy of the accepted state back: one more read and write).
//   state (slots, H, P, N): mutated at the valid positions' slots; out: written.
//   num_accepted_tokens (batch) int32 in [1, T]: read.
// A row whose column-0 slot is pad_slot_id is skipped; the slots of one call must be distinct.
void spec_state_update(const TensorView& state, const Mamba2Window& window,
                       const TensorView& num_accepted_tokens, const ExecOptions& options = {});

}  // namespace replayssm
